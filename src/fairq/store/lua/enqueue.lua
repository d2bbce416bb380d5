--[[ enqueue.lua: add runs to one base queue (keyless, or into concurrency-key variants).

A run id that already exists (queued, running or dead-lettered) is a no-op. The queue
size limit (the queue's max_size, else the env's max_queue_size, else the default)
counts keyless runs plus runs queued across all variants and is checked per run,
atomically. Times are computed here, on the script's clock (the server's, unless a
logical clock is passed). Every run's arguments are checked before anything is written.
Built twice: the age-order build refuses a queue whose order is fair (NEEDS_FAIR,
nothing written); the fair-order build also registers new flows in the fair order.

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG      env id      FIRST_ARG + 1  queue
  FIRST_ARG + 2  schedule name ('' = none)   FIRST_ARG + 3  schedule tick (ms)
    with a schedule, the call enqueues only if this tick is later than the schedule's
    last claimed tick (then it becomes the last): exactly once however many callers
  then one per run: run id, encoded key ('' = none), encoded tenant ('' = none), its
    options, payload (JSON), separated by single spaces (the payload, last, is the only
    one that may hold a space). The options are one field, separated by commas:
    available at (ms, absolute; '' = now + delay), delay (ms), head start (ms, a time
    credit: the run orders as if this much older), TTL (ms from now, 0 = none), outcome
    policy ('' | 'keep'), timeout (ms, 0 = none), priority level ('' = the queue's
    default, its middle level; else 1..the queue's priority_levels, 1 the highest), trace
    context ('' = none; printable ASCII, at most 512; last: it may hold a comma). (Each
    argument costs the server about as much as a command's field, and most runs of a
    queue have the same options: the script checks a given options text once.)
Reply
  one text, its numbers separated by single spaces: status (OK | NEEDS_FAIR |
  TICK_TAKEN), size limit in force (0 = none), then (OK) one status per run (ENQUEUED,
  DUPLICATE, REJECTED_SIZE). (A text costs the server less than a list.)
]]
--@include prelude
--@include config_enqueue
--@include runs
--@include run_create
--@include order

local tag = KEYS[1]
local env_id = arg_env(ARGV[FIRST_ARG])
local queue = arg_queue(ARGV[FIRST_ARG + 1])
local schedule = ARGV[FIRST_ARG + 2]
local tick = ARGV[FIRST_ARG + 3]
tick = tick == '0' and 0 or arg_int(tick, 'schedule tick', 0, MAX_TIME_MS)
if schedule ~= '' then arg_name(schedule, 'schedule name', ARG_RULES.schedule_name_bytes) end
local FIRST_RUN = FIRST_ARG + 4
local count = #ARGV - FIRST_RUN + 1
local now = C.now

-- Check every run before the first write, and keep its fields: RUN_SLOTS per run in one
-- flat list (a table per run costs more): run id, encoded key, encoded tenant, outcome
-- policy, trace context, payload, available at, score, TTL deadline (0 = none), level
-- (false = the queue's default), timeout (0 = none).
local RUN_SLOTS = 11
local runs = count == 1 and {false, false, false, false, false, false, false, false, false, false,
  false} or {}
local any_tenant, any_level = false, false
for r = 0, count - 1 do
  local arg = ARGV[FIRST_RUN + r]
  local id, ck, tenant, options, payload = string.match(arg, RUN_ARG_PATTERN)
  if id == nil then bad_run_argument(arg) end
  if #id > ARG_RULES.name_length then fail('run id is not a valid name') end
  if ck ~= '' and not string.match(ck, '^[%w_%.%-%%]+$') then fail('bad encoded key') end
  if tenant ~= '' then
    if not string.match(tenant, '^[%w_%.%-%%]+$') then fail('bad encoded tenant') end
    any_tenant = true
  end
  local o = run_options(options)
  local level, keep, trace, timeout = o.level, o.keep, o.trace, o.timeout
  if level and level ~= BASE_LEVEL then any_level = true end
  local available = o.available_at or now + o.delay
  local ttl_deadline = o.ttl > 0 and (now + o.ttl) or 0
  if ttl_deadline > MAX_TIME_MS then fail('ttl_ms out of range') end
  local t = r * RUN_SLOTS
  runs[t + 1], runs[t + 2], runs[t + 3], runs[t + 4], runs[t + 5], runs[t + 6] = id, ck,
    tenant, keep, trace, payload
  runs[t + 7], runs[t + 8], runs[t + 9], runs[t + 10], runs[t + 11] = available,
    available - o.credit, ttl_deadline, level, timeout
end

local X = state_new(C, tag)
local names = enqueue_names(tag, env_id, queue)
local V = names.V
-- the levels bits are read with the options when a size limit may be checked or a run
-- leaves the base level (else on first need)
local wanted = (any_tenant and WANT.named or 0) + (HOOK.enqueue_joins and WANT.join or 0)
  + ((any_level or C.default_queue_size_limit > 0) and WANT.levels or 0)
local Q = enqueue_config_read(X, V, env_id, queue, wanted, names.config, names.B)
if Q.order == 'fair' and HOOK.needs_fair_queue(Q) then return reply_text(S.NEEDS_FAIR) .. ' 0' end
-- each run's level, checked against the queue's levels (before the first write)
local levels = Q.priority_levels
local default_level = (levels + 1 - (levels + 1) % 2) / 2 -- (the middle one, rounded down)
for t = 10, count * RUN_SLOTS, RUN_SLOTS do
  local level = runs[t] or default_level
  runs[t] = level
  if level > Q.priority_levels then
    fail('priority ' .. level .. ' out of range: queue ' .. queue .. ' has '
      .. Q.priority_levels .. ' levels')
  end
end
if schedule ~= '' then
  local schedules = env_key(V, 'schedules')
  local last = tonumber(redis.call('HGET', schedules, schedule))
  if last ~= nil and last >= tick then return reply_text(S.TICK_TAKEN) .. ' 0' end
  redis.call('HSET', schedules, schedule, tick)
end

local max_size = Q.max_size or 0
local checked = max_size > 0
local size = nil -- on first need: keyless runs + runs queued across all variants
local statuses = count > 1 and {} or nil
local status
for r = 0, count - 1 do
  local t = r * RUN_SLOTS
  local run, ck, tenant = runs[t + 1], runs[t + 2], runs[t + 3]
  local available, score, ttl_deadline, level = runs[t + 7], runs[t + 8], runs[t + 9],
    runs[t + 10]
  local member = env_id .. ':' .. run
  local mkey = run_key(tag, member)
  status = nil
  -- a run id already used (queued, running or dead-lettered) is a no-op: DUPLICATE, also
  -- when the queue is full (so with a size limit it is checked before the size)
  if checked and redis.call('EXISTS', mkey) == 1 then
    status = S.DUPLICATE
  elseif checked then
    if size == nil then
      size = keyless_queued(Q) + ck_queued(X, Q.B, V, env_id, queue)
    end
    if size + 1 > max_size then status = S.REJECTED_SIZE end
  end
  if status == nil then
    if not create_run_hash(mkey, runs, t, queue, now, checked) then status = S.DUPLICATE end
  end
  if status == nil then
    local flow = (ck == '' and tenant == '') and KEYLESS_FLOW or flow_of(ck, tenant)
    place_queued(X, level == BASE_LEVEL and Q or level_queue(Q, level), flow, run, score)
    if Q.promote_ms and level > 1 then
      -- its wait counts from when it became ready, and not before it was queued
      redis.call('ZADD', queue_key(Q.B, 'aging'), math.max(available, now) + Q.promote_ms, run)
    end
    if ttl_deadline > 0 then redis.call('ZADD', X.ttl, ttl_deadline, member) end
    if size then size = size + 1 end
    status = S.ENQUEUED
  end
  if statuses then statuses[r + 1] = reply_text(status) end
end
if X.wake then
  -- the queue's head changed (it was empty, or this run is older): it may be new here
  if redis.call('SADD', env_key(V, 'queues'), queue) == 1 then
    -- a new queue: no consumer pool is known to serve every queue any more
    redis.call('HDEL', env_key(V, 'config'), 'pool_all')
  end
  redis.call('SADD', shard_key(tag, 'envs'), env_id)
end
HOOK.finish(X)
state_flush(X)
-- the reply: 'OK <size limit> <status of each run>' (one text: cheaper than a list)
if count == 1 then return reply_one(max_size, status) end
local head = reply_text(S.OK) .. ' ' .. reply_text(max_size)
if statuses then return head .. ' ' .. table.concat(statuses, ' ') end
return head
