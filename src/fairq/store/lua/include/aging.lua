-- aging.lua: bounded aging of priority levels. A queue with `max_wait_promote` lists its
-- runs below level 1 in B:aging (run id -> when it moves up: one bound after it became
-- ready, or after it was queued if that was later; then one bound after each move, so a
-- run backfilled with an old timestamp moves one level per bound, not all at once). A
-- dequeue first moves the runs whose time came up one level (on the script's clock), so
-- a run waits at most one bound per level before it competes one level higher. A run
-- that left its queue (served, cancelled, expired) leaves the list when its time comes.
--@require state runs levels

--- At most this many runs are promoted per queue and call (the rest on the next call).
local PROMOTE_BATCH = 100

local function promote_run(X, Q, key, run, due)
  local mkey = run_key(X.tag, Q.env_id .. ':' .. run)
  local queue, ck, state, tenant, score, level = run_read_promote(mkey)
  level = tonumber(level) or BASE_LEVEL
  local flow = flow_of(ck, tenant)
  if state ~= 'queued' or queue ~= Q.name or level <= 1
      or unqueue(X, level_view(Q, level), flow, run) ~= 1 then
    redis.call('ZREM', key, run)
    return
  end
  if flow ~= KEYLESS_FLOW then variant_refresh(X, level_view(Q, level), flow) end
  level = level - 1
  redis.call('HSET', mkey, RUN_FIELD.level, level)
  place_queued(X, level_queue(Q, level), flow, run, tonumber(score))
  if level > 1 then
    redis.call('ZADD', key, math.max(due, X.now) + Q.promote_ms, run)
  else
    redis.call('ZREM', key, run)
  end
end

-- Move the runs of Q whose time came up one level.
local function promote_waiting(X, Q)
  if Q.promote_ms == nil then return end
  local key = queue_key(Q.B, 'aging')
  local due = redis.call('ZRANGEBYSCORE', key, '-inf', X.now, 'WITHSCORES', 'LIMIT', 0,
    PROMOTE_BATCH)
  for i = 1, #due, 2 do promote_run(X, Q, key, due[i], tonumber(due[i + 1])) end
end
