-- counters.lua: the per-base-queue CK counters (B:ckqueued, B:ckrunning).
-- Each counter is seeded from the truth the first time a CK operation finds it
-- missing (SET ... EX COUNTER_TTL, never extended), always BEFORE the membership
-- change it accompanies, and then moved by +1/-1 only when ZADD/ZREM/SADD/SREM
-- actually changed membership. Decrements floor at 0.

-- A script reads (or seeds) each counter at most once and then tracks its value
-- itself: nothing else can change a key while a script runs.
local ck_counter_values = {}

-- The counter's value, seeded from the truth (`truth(B)`) when the key is missing.
local function ck_counter(key, B, truth)
  local value = ck_counter_values[key]
  if value ~= nil then return value end
  local raw = redis.call('GET', key)
  if raw then
    value = tonumber(raw)
  else
    value = truth(B)
    redis.call('SET', key, value, 'EX', COUNTER_TTL)
  end
  ck_counter_values[key] = value
  return value
end

local function queued_truth(B)
  local total = 0
  for _, ck in ipairs(redis.call('ZRANGE', B .. ':ckindex', 0, -1)) do
    total = total + redis.call('ZCARD', variant_queued_key(B, ck))
  end
  return total
end

local function running_truth(B)
  local total = 0
  for _, ck in ipairs(redis.call('SMEMBERS', B .. ':ckbusy')) do
    total = total + redis.call('SCARD', variant_inflight_key(B, ck))
  end
  return total
end

local function ck_queued_seed(B) return ck_counter(B .. ':ckqueued', B, queued_truth) end
local function ck_running_seed(B) return ck_counter(B .. ':ckrunning', B, running_truth) end

-- Move a seeded counter by +1/-1; never below 0.
local function counter_step(key, delta)
  local value = ck_counter_values[key]
  if delta > 0 then
    redis.call('INCR', key)
    ck_counter_values[key] = value + 1
  elseif value > 0 then
    redis.call('DECR', key)
    ck_counter_values[key] = value - 1
  end
end

-- Queued runs across all CK variants, for the size limit on a mixed queue.
-- A queue that never had a keyed run has no index, and gets no counter.
local function ck_queued_value(B)
  local key = B .. ':ckqueued'
  if ck_counter_values[key] ~= nil then return ck_counter_values[key] end
  local raw = redis.call('GET', key)
  if raw then
    ck_counter_values[key] = tonumber(raw)
    return ck_counter_values[key]
  end
  if redis.call('EXISTS', B .. ':ckindex') == 0 then return 0 end
  return ck_queued_seed(B)
end

-- Add run to a variant's queue; counts it iff it was not there. Returns 1 if added.
local function ck_queue_add(B, ck, score, run)
  ck_queued_seed(B)
  local added = redis.call('ZADD', variant_queued_key(B, ck), score, run)
  if added == 1 then counter_step(B .. ':ckqueued', 1) end
  return added
end

-- Remove run from a variant's queue; uncounts it iff it was there. Returns 1 if removed.
local function ck_queue_remove(B, ck, run)
  ck_queued_seed(B)
  local removed = redis.call('ZREM', variant_queued_key(B, ck), run)
  if removed == 1 then counter_step(B .. ':ckqueued', -1) end
  return removed
end

-- Give run a slot in its variant; counts it iff it was not there.
local function ck_slot_take(B, ck, run)
  ck_running_seed(B)
  local added = redis.call('SADD', variant_inflight_key(B, ck), run)
  if added == 1 then
    counter_step(B .. ':ckrunning', 1)
    redis.call('SADD', B .. ':ckbusy', ck)
  end
  return added
end

-- Free run's slot in its variant; uncounts it iff it held one.
local function ck_slot_free(B, ck, run)
  ck_running_seed(B)
  local key = variant_inflight_key(B, ck)
  local removed = redis.call('SREM', key, run)
  if removed == 1 then
    counter_step(B .. ':ckrunning', -1)
    if redis.call('SCARD', key) == 0 then redis.call('SREM', B .. ':ckbusy', ck) end
  end
  return removed
end
