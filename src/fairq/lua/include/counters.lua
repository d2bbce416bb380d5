-- counters.lua: the per-base-queue CK counters (B:ckqueued, B:ckrunning).
-- Each counter is seeded from the truth the first time a CK operation finds it
-- missing (SET ... EX COUNTER_TTL, never extended), always BEFORE the membership
-- change it accompanies, and then moved by +1/-1 only when ZADD/ZREM/SADD/SREM
-- actually changed membership. Decrements floor at 0.

local function ck_queued_seed(B)
  local key = B .. ':ckqueued'
  local value = redis.call('GET', key)
  if value then return tonumber(value) end
  local total = 0
  for _, ck in ipairs(redis.call('ZRANGE', B .. ':ckindex', 0, -1)) do
    total = total + redis.call('ZCARD', variant_queued_key(B, ck))
  end
  redis.call('SET', key, total, 'EX', COUNTER_TTL)
  return total
end

local function ck_running_seed(B)
  local key = B .. ':ckrunning'
  local value = redis.call('GET', key)
  if value then return tonumber(value) end
  local total = 0
  for _, ck in ipairs(redis.call('SMEMBERS', B .. ':ckbusy')) do
    total = total + redis.call('SCARD', variant_inflight_key(B, ck))
  end
  redis.call('SET', key, total, 'EX', COUNTER_TTL)
  return total
end

-- Move a counter by +1/-1 given its value just read by the seed; never below 0.
local function counter_step(key, delta, current)
  if delta > 0 then
    redis.call('INCR', key)
  elseif current > 0 then
    redis.call('DECR', key)
  end
end

-- Queued runs across all CK variants, for the size limit on a mixed queue.
-- A queue that never had a keyed run has no index, and gets no counter.
local function ck_queued_value(B)
  local value = redis.call('GET', B .. ':ckqueued')
  if value then return tonumber(value) end
  if redis.call('EXISTS', B .. ':ckindex') == 0 then return 0 end
  return ck_queued_seed(B)
end

-- Add run to a variant's queue; counts it iff it was not there. Returns 1 if added.
local function ck_queue_add(B, ck, score, run)
  local current = ck_queued_seed(B)
  local added = redis.call('ZADD', variant_queued_key(B, ck), score, run)
  if added == 1 then counter_step(B .. ':ckqueued', 1, current) end
  return added
end

-- Remove run from a variant's queue; uncounts it iff it was there. Returns 1 if removed.
local function ck_queue_remove(B, ck, run)
  local current = ck_queued_seed(B)
  local removed = redis.call('ZREM', variant_queued_key(B, ck), run)
  if removed == 1 then counter_step(B .. ':ckqueued', -1, current) end
  return removed
end

-- Give run a slot in its variant; counts it iff it was not there.
local function ck_slot_take(B, ck, run)
  local current = ck_running_seed(B)
  local added = redis.call('SADD', variant_inflight_key(B, ck), run)
  if added == 1 then
    counter_step(B .. ':ckrunning', 1, current)
    redis.call('SADD', B .. ':ckbusy', ck)
  end
  return added
end

-- Free run's slot in its variant; uncounts it iff it held one.
local function ck_slot_free(B, ck, run)
  local current = ck_running_seed(B)
  local key = variant_inflight_key(B, ck)
  local removed = redis.call('SREM', key, run)
  if removed == 1 then
    counter_step(B .. ':ckrunning', -1, current)
    if redis.call('SCARD', key) == 0 then redis.call('SREM', B .. ':ckbusy', ck) end
  end
  return removed
end
