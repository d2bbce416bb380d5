-- hooks_vtime.lua: virtual-time (SFQ) state of a base queue's variants.
--   B:vtime   ZSET variant -> next virtual start tag
--   B:vfloor  STRING monotonic floor (never decreases)
--   B:vidle   ZSET drained variant -> parked tag (so draining cannot reset credit)
--   B:ckweights HASH variant -> weight (sparse; missing = 1)
-- All but the weights expire after VT_STATE_TTL seconds without writes.

local vt_parked = false
-- Per script: the floor of each base queue (read once; the dequeue script raises it),
-- and tags a dequeue has computed but not yet written (see variant_drained).
local vt_floor_of = {}
local vt_pending = {}

local function vt_floor(B)
  local floor = vt_floor_of[B]
  if floor == nil then
    floor = tonumber(redis.call('GET', B .. ':vfloor') or '0')
    vt_floor_of[B] = floor
  end
  return floor
end

-- The dequeue script's read-repaired (and finally raised) floor.
local function vt_floor_known(B, floor)
  vt_floor_of[B] = floor
end

-- The tag a variant joins at: a returning variant comes back at max(floor, parked);
-- a brand-new one at the floor ('floor') or one quantum behind the leader, at most
-- VT_ARRIVAL_CAP above the floor ('behind_leader').
local function vt_join_tag(B, ck, floor)
  local parked = redis.call('ZSCORE', B .. ':vidle', ck)
  if parked then
    redis.call('ZREM', B .. ':vidle', ck)
    return math.max(floor, tonumber(parked))
  end
  if VT_JOIN_POLICY == 'behind_leader' then
    local top = redis.call('ZRANGE', B .. ':vtime', -1, -1, 'WITHSCORES')
    if #top > 0 and tonumber(top[2]) > floor then
      return math.min(tonumber(top[2]) + VT_QUANTUM, floor + VT_ARRIVAL_CAP)
    end
  end
  return floor
end

-- Register a variant that now has queued runs (NX: an existing tag never rewinds).
local function variant_filled(B, ck)
  if redis.call('ZSCORE', B .. ':vtime', ck) then return end
  local tag = vt_join_tag(B, ck, vt_floor(B))
  redis.call('ZADD', B .. ':vtime', 'NX', tag, ck)
  redis.call('EXPIRE', B .. ':vtime', VT_STATE_TTL)
end

-- A drained variant leaves the order; a tag above the floor is parked so the
-- variant cannot drain and re-enter to reset the credit it consumed. The tag is,
-- in order: known_tag, the tag a dequeue just computed for it, or its stored tag.
local function variant_drained(B, ck, known_tag)
  local key = B .. '|' .. ck
  local tag = known_tag or vt_pending[key]
  vt_pending[key] = nil
  if tag == nil then
    tag = redis.call('ZSCORE', B .. ':vtime', ck)
    if not tag then return end
  end
  redis.call('ZREM', B .. ':vtime', ck)
  if tonumber(tag) > vt_floor(B) then
    redis.call('ZADD', B .. ':vidle', tag, ck)
    vt_parked = true
  end
end

-- Once per script: drop parked tags the floor has overtaken, cap the idle set,
-- and refresh its TTL.
local function hooks_finish(B)
  if not vt_parked then return end
  local idle = B .. ':vidle'
  redis.call('ZREMRANGEBYSCORE', idle, '-inf', vt_floor(B))
  redis.call('ZREMRANGEBYRANK', idle, 0, -(VT_IDLE_MAX + 1))
  redis.call('EXPIRE', idle, VT_STATE_TTL)
end
