-- levels.lua: a queue's priority levels (1 is the highest).
-- A queue context Q is its base level's (BASE_LEVEL); level_view(Q, L)
-- is the same queue at level L, whose order keys (queued sets, ck_index, the fair
-- order's state) live under Q.OB = level_name(B, L) and Q.OV = level_name(V, L) (the
-- tenant state of Q's consumer pool: pool_name(level_name(V, L), Q.pool)) and whose
-- heads-index member is named Q.oname = level_name(queue, L). Everything else (slots,
-- counters, caps, rate buckets, history: Q.B, Q.V, Q.name) is the queue's, shared by its
-- levels, so a limit holds across levels.
--@require state

-- What a view keeps for itself (its level's parked flag, read once when first needed);
-- every other field is the base queue's, read and written through.
local VIEW_OWN = {parked = true}

local function view_meta(Q)
  return {
    __index = function(view, name)
      if name == 'OV' then return pool_name(level_name(Q.V, view.level), Q.pool or 0) end
      if name == 'parked' then
        local flag = redis.call('HGET', env_key(Q.V, 'config'), config_field(view.oname, 'parked'))
        rawset(view, 'parked', flag == '1')
        return flag == '1'
      end
      return Q[name]
    end,
    __newindex = function(view, name, value)
      if VIEW_OWN[name] then rawset(view, name, value) else Q[name] = value end
    end,
  }
end

-- Set the order-key names of a base queue context (its own level).
local function level_base(Q)
  Q.OB, Q.OV, Q.oname, Q.level = Q.B, pool_name(Q.V, Q.pool or 0), Q.name, BASE_LEVEL
  return Q
end

-- Q's tenant state is that of consumer pool `pool` from now on (its views follow).
local function set_pool(Q, pool)
  Q.pool, Q.OV = pool, pool_name(Q.V, pool)
end

-- Q at priority level `level` (Q itself at BASE_LEVEL); one view per queue and level.
local function level_view(Q, level)
  if level == nil or level == BASE_LEVEL then return Q end
  local views = Q.views
  if views == nil then
    views = {}
    Q.views = views
  end
  local view = views[level]
  if view == nil then
    view = setmetatable({OB = level_name(Q.B, level), oname = level_name(Q.name, level),
      level = level, base = Q}, view_meta(Q))
    views[level] = view
  end
  return view
end

-- The queue's `levels` bits, read when the script has not read its config.
local function levels_bits(Q)
  if Q.levels == nil then
    Q.levels = tonumber(redis.call('HGET', env_key(Q.V, 'config'), config_field(Q.name, 'levels')))
      or 0
  end
  return Q.levels
end

-- The levels of Q whose keys may hold something: BASE_LEVEL and the bits of its
-- `levels` option, highest first (1 before 2 ...). Read only: for a queue with no other
-- level (most queues) it is one shared list, so no table is made.
local queue_levels
do
  -- (a local of this block only: a library's main chunk may hold at most 200 locals)
  local only_base = {BASE_LEVEL}

  function queue_levels(Q)
    local bits = levels_bits(Q)
    if bits == 0 then return only_base end
    local out = {}
    for level = 1, MAX_LEVELS do
      if level == BASE_LEVEL or bit.band(bits, bit.lshift(1, level)) ~= 0 then
        out[#out + 1] = level
      end
    end
    return out
  end
end

-- Q at `level`, to place a run there: the first run of a level other than BASE_LEVEL
-- records it in the queue's `levels` bits (what the scripts that serve read).
local function level_queue(Q, level)
  if level == nil or level == BASE_LEVEL then return Q end
  local bits, b = levels_bits(Q), bit.lshift(1, level)
  if bit.band(bits, b) == 0 then
    Q.levels = bit.bor(bits, b)
    redis.call('HSET', env_key(Q.V, 'config'), config_field(Q.name, 'levels'), Q.levels)
  end
  return level_view(Q, level)
end

-- Keyless runs queued in Q at every level.
local function keyless_queued(Q)
  local total = 0
  for _, level in ipairs(queue_levels(Q)) do
    total = total + redis.call('ZCARD', queue_key(level_view(Q, level).OB, 'queued'))
  end
  return total
end
