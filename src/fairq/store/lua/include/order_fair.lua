-- order_fair.lua: the order hooks of the fair order: start-time fair queueing over the
-- tenants of an environment, and inside a tenant over its keys.
--
-- State (see fairq/keys.py):
--   V:tt      tenant -> virtual tag (next start tag); kept while it drains (parked credit)
--   V:tt[~floor]  (a member no tenant can be named) the environment's virtual time: the
--             start tag of the run most recently begun; never decreases; a tenant
--             (re)joins at max(floor, its stored tag). Tags below it carry no credit and
--             are pruned as it advances.
--   B:tq      tenants with servable flows in queue B -> copy of their tag (a copy is
--             never above the tag in V:tt; a stale copy is corrected when read)
--   B:tsolo   named tenant -> 'FLOOR TAG FLOW' while it has one key in play in B (and
--             had no second since): that key's tag inside the tenant and the tenant's
--             key virtual time in B, for all such tenants of B in one hash (a dequeue
--             reads those it may serve with one HMGET and writes them back with one HSET)
--   B:t:N:keys  the other named tenants of B: key -> tag inside it; its member
--             '!floor' (KEY_FLOOR_MEMBER; first among equal tags, so the first entries
--             read hold it) is the tenant's key virtual time in B. A tenant is in one
--             of the two, never both (none: no keys, floor 0): a second key joining
--             moves its B:tsolo entry into a key set, and its one key leaving leaves a
--             key set holding only the floor (SOLO below)
--   B:park / B:parkdue  tenants and keys taken out of B:tq / B:t:N:keys while gated by
--             a cap (back when a slot frees) or by time (rate limit, future head: back
--             when due), so gated work never fills the candidate window. The queue's
--             config flag `parked` is set while they may hold something (no probe
--             when it is not)
-- A "pair" is a tenant in one queue. A pair is simple when its only flow is the one
-- whose default tenant it is (a key serving as its own tenant, or a queue's keyless
-- runs): then the pair is the flow and needs no key set.
-- Queues whose order is age are served by serve_age.lua even in this build.
--@require state config runs levels

-- ------------------------------------------------------------------ reading state

-- Give a queue context read from a run its config (for hooks of run-based scripts).
-- (A level's view reads them through from its base queue.)
local function queue_conf(X, Q)
  if Q.order ~= nil then return Q end
  local base = Q.base or Q
  X.qconf = X.qconf or {}
  local known = X.qconf[base.B]
  if known == nil then
    local _, by_name = config_read(X, base.V, base.env_id, {base.name})
    known = by_name[base.name]
    X.qconf[base.B] = known
  end
  for k, v in pairs(known) do
    if k ~= 'views' then base[k] = v end
  end
  return Q
end

local function cached_exists(X, field, key)
  X[field] = X[field] or {}
  local v = X[field][key]
  if v == nil then
    v = redis.call('EXISTS', key) == 1
    X[field][key] = v
  end
  return v
end

-- Whether anything of Q may be parked. The config flag is exact when unset (every
-- park sets it); when set (or neither the config nor the flag was read) the parking keys
-- are probed once.
local function has_park(X, Q)
  if Q.order ~= nil then
    if not Q.parked then return false end
  else
    local read = X.qcharge and X.qcharge[Q.OB] -- the flag, if charges_duration read it
    if read and not read.parked then return false end
  end
  return cached_exists(X, 'hpark', queue_key(Q.OB, 'parked_due'))
end

--- Pruning tags below the floor and refreshing the state's TTL happen when the floor
--- crosses a multiple of this much virtual time (not on every call).
local TICK = 8

-- The environment's floor from `raw`, its score in V:tt (false: it has none).
local function floor_load(X, V, raw)
  X.tfloor = X.tfloor or {}
  local value = tonumber(raw)
  if value == nil then
    -- lost (expired or deleted) while tags remain: repair from the lowest stored tag
    -- (tags below the floor are pruned as it advances, so this is near the floor)
    local low = redis.call('ZRANGE', env_key(V, 'tenant_tags'), 0, 0, 'WITHSCORES')
    value = #low > 0 and tonumber(low[2]) or 0
  end
  X.tfloor[V] = {value = value, start = value, stored = raw ~= false and raw ~= nil}
end

local function tenant_floor(X, V)
  if X.tfloor == nil or X.tfloor[V] == nil then
    floor_load(X, V, redis.call('ZSCORE', env_key(V, 'tenant_tags'), FLOOR_MEMBER))
  end
  return X.tfloor[V].value
end

-- A tenant's weight: its own (V:tw), else, for a key serving as its own tenant, the
-- key's weight in this queue (B:ckweights), else 1 (nil in the map it returns, which is
-- read only: one shared empty map when there is nothing to read, most calls).
local tenant_weights
do
  -- (a local of this block only: a library's main chunk may hold at most 200 locals)
  local none = {}

  function tenant_weights(X, Q, tenants, simple_keys)
    local by_tenant = Q.tenants_weighted and #tenants > 0
    local by_key = Q.weighted and #simple_keys > 0
    if not (by_tenant or by_key) then return none end
    local out = {}
    if by_tenant then
      local raw = call_list('HMGET', env_key(Q.V, 'tenant_weights'), tenants)
      for i, t in ipairs(tenants) do out[t] = tonumber(raw[i]) end
    end
    if by_key then
      local raw = call_list('HMGET', queue_key(Q.B, 'key_weights'), simple_keys)
      for i, k in ipairs(simple_keys) do
        if out[k] == nil then out[k] = tonumber(raw[i]) end
      end
    end
    return out
  end
end

-- A key's weight inside its tenant (looked up by its key: each tenant's key K has K's
-- weight).
local function key_weight(X, Q, flow)
  if flow_keyless(flow) or not Q.weighted then return 1 end
  return tonumber(redis.call('HGET', queue_key(Q.B, 'key_weights'), flow_key(flow))) or 1
end

-- ------------------------------------------------------------------ joining

--- The admission of new tenants (admission = 'budget'): `free` new tenants per quantum
--- of the floor join at the floor; the others share the newcomers' clock, which every
--- new tenant advances by quantum / `weight`.
local NEWCOMERS = {free = 1, weight = 1}

-- Where a tenant new to V:tt starts under admission 'budget' (V:newcomers keeps the
-- clock, the floor epoch and how many joined in it); its tag goes into V:tt at once, so
-- its other queues and the serve's attach read it.
local function admit_new(X, Q, V, floor, tenant)
  local key = env_key(V, 'newcomers')
  local raw = redis.call('HMGET', key, 'clock', 'epoch', 'joined')
  local clock, epoch, joined = tonumber(raw[1]) or 0, tonumber(raw[2]) or -1, tonumber(raw[3]) or 0
  local now_epoch = math.floor(floor / Q.quantum + 1e-9)
  if now_epoch ~= epoch then epoch, joined = now_epoch, 0 end
  local tag = floor
  if joined >= NEWCOMERS.free then tag = math.max(floor, clock) end
  clock = math.max(floor, clock) + Q.quantum / NEWCOMERS.weight
  redis.call('HSET', key, 'clock', exact(clock), 'epoch', epoch, 'joined', joined + 1)
  redis.call('EXPIRE', key, X.C.state_ttl)
  redis.call('ZADD', env_key(V, 'tenant_tags'), tag, tenant)
  return tag
end

-- Where a tenant (re)joins the order of Q's level: max(floor, its stored tag); a tenant
-- never seen joins at the floor (admission 'floor'), or by admit_new ('budget') once the
-- floor is stored (before any fair serve there is nobody to protect). So a newcomer is
-- served within one round of the tenants, and a flood of them takes about one share.
local function tenant_join(X, Q, tenant)
  local V = Q.OV
  local floor = tenant_floor(X, V)
  local stored = tonumber(redis.call('ZSCORE', env_key(V, 'tenant_tags'), tenant))
  if stored ~= nil then return stored > floor and stored or floor end
  queue_conf(X, Q)
  if Q.admission ~= 'budget' or not X.tfloor[V].stored then return floor end
  return admit_new(X, Q, V, floor, tenant)
end

-- Whether a member of a key set is its floor (a set written before the floor's member
-- was renamed may still hold it under FLOOR_MEMBER until key_floor moves it).
local function is_key_floor(member)
  return member == KEY_FLOOR_MEMBER or member == FLOOR_MEMBER
end

-- The virtual time of a tenant's keys in Q: the member KEY_FLOOR_MEMBER of its key set.
-- `raw` is its score when the caller read it (false: known missing; nil: not read).
-- Kept per call by the set's name (one set per tenant, queue and level).
local function key_floor(X, keys_key, raw)
  X.kfloor = X.kfloor or {}
  local f = X.kfloor[keys_key]
  if f == nil then
    if raw == nil then raw = redis.call('ZSCORE', keys_key, KEY_FLOOR_MEMBER) end
    local value = tonumber(raw)
    local dirty = value == nil
    if value == nil then
      -- new set, a set keeping its floor under the old member, or the member was lost
      local low = redis.call('ZRANGE', keys_key, 0, 0, 'WITHSCORES')
      value = #low > 0 and tonumber(low[2]) or 0
      local old = #low > 0 and redis.call('ZSCORE', keys_key, FLOOR_MEMBER)
      if old then
        value, dirty = tonumber(old), false
        redis.call('ZADD', keys_key, value, KEY_FLOOR_MEMBER)
        redis.call('ZREM', keys_key, FLOOR_MEMBER)
      end
    end
    f = {value = value, dirty = dirty}
    X.kfloor[keys_key] = f
  end
  return f
end

-- Keys joined a tenant's set during this script (a serve that loaded the set earlier
-- does not know them).
local function keys_added(X, Q, tenant)
  X.kadded = X.kadded or {}
  X.kadded[Q.OB .. '|' .. tenant] = true
end

-- A named tenant with one key in play in a queue: its entry in B:tsolo (see the header).
-- (One table: a library's main chunk may hold at most 200 locals.)
local SOLO = {}
do
  -- An entry is the floor and the key's tag as two 8-byte doubles (little-endian) after
  -- a zero byte, then the key: written and read whole, bit for bit, with no digits to
  -- print or parse ('%.17g' text and its parse were 1.1 % of a 10-run dequeue + ack of
  -- 10 one-key tenants, measured). An entry written as text ('floor tag key', by an
  -- older fairq) is read too, and written back in this form by the next serve.
  function SOLO.parse(raw)
    if string.byte(raw, 1) == 0 then
      local floor, tag = struct.unpack('<dd', raw, 2)
      return floor, tag, string.sub(raw, 18)
    end
    local floor, tag, flow = string.match(raw, '^(%S+) (%S+) (.+)$')
    return tonumber(floor), tonumber(tag), flow
  end

  function SOLO.value(floor, tag, flow)
    return struct.pack('<Bdd', 0, floor, tag) .. flow
  end

  function SOLO.read(Q, tenant)
    return redis.call('HGET', queue_key(Q.OB, 'solo_keys'), tenant)
  end

  function SOLO.write(X, Q, tenant, floor, tag, flow)
    local key = queue_key(Q.OB, 'solo_keys')
    redis.call('HSET', key, tenant, SOLO.value(floor, tag, flow))
    redis.call('EXPIRE', key, X.C.state_ttl)
    if X.solo_none then X.solo_none[Q.OB] = nil end -- (a serve's probe found none before)
  end

  -- The record a dequeue serving the tenant keeps of its entry (the key and the floor as
  -- the serve moved them: {flow, tag, value = the floor, moved ...}), or nil.
  function SOLO.live(X, Q, tenant)
    local of = X.solo_live and X.solo_live[Q.OB]
    local live = of and of[tenant]
    if live and not live.moved then return live end
    return nil
  end

  -- The tenant's entry (`raw`; nil: the serve's record of it) becomes its key set: the
  -- floor, and its key unless `keep_key` is false (the key left). Returns that key.
  function SOLO.to_set(X, Q, tenant, raw, keep_key)
    local floor, tag, flow
    local live = SOLO.live(X, Q, tenant)
    if live then
      floor, tag, flow = live.value, live.tag, live.flow
      live.moved = true
      live.dirty = false
    else
      floor, tag, flow = SOLO.parse(raw)
    end
    local kk = tenant_key(Q.OB, tenant, 'keys')
    if keep_key then
      redis.call('ZADD', kk, floor, KEY_FLOOR_MEMBER, tag, flow)
    else
      redis.call('ZADD', kk, floor, KEY_FLOOR_MEMBER)
    end
    redis.call('EXPIRE', kk, X.C.state_ttl)
    redis.call('HDEL', queue_key(Q.OB, 'solo_keys'), tenant)
    X.kfloor = X.kfloor or {}
    X.kfloor[kk] = live or {value = floor, dirty = false}
    return flow
  end

  -- The tag of `flow` when it is the tenant's one key (`raw` its entry), else nil.
  function SOLO.tag_of(X, Q, tenant, raw, flow)
    local live = SOLO.live(X, Q, tenant)
    if live then return live.flow == flow and live.tag or nil end
    local _, tag, key = SOLO.parse(raw)
    return key == flow and tag or nil
  end
end

-- Whether a key set holds any key (beside its floor member, under either name).
local function keys_left(keys_key)
  local m = redis.call('ZRANGE', keys_key, 0, 2)
  for i = 1, #m do
    if not is_key_floor(m[i]) then return true end
  end
  return false
end

-- Where a key new to its tenant starts: the tenant's key floor ('floor'), or one quantum
-- behind the tenant's highest key, at most arrival_cap above the floor ('behind_leader').
local function key_join(X, Q, tenant, keys_key)
  local floor = key_floor(X, keys_key).value
  if Q.join == 'behind_leader' then
    local top = redis.call('ZRANGE', keys_key, -1, -1, 'WITHSCORES')
    if #top > 0 and tonumber(top[2]) > floor then
      return math.min(tonumber(top[2]) + Q.quantum, floor + Q.arrival_cap)
    end
  end
  return floor
end

local function is_parked(X, Q, member)
  if not has_park(X, Q) then return false end
  return redis.call('HEXISTS', queue_key(Q.OB, 'parked'), member) == 1
end

-- Register a tenant in queue Q (no-op when it is there or parked).
local function register_pair(X, Q, tenant)
  local tq = queue_key(Q.OB, 'ready_tenants')
  if redis.call('ZSCORE', tq, tenant) then return end
  if is_parked(X, Q, 't:' .. tenant) then return end
  redis.call('ZADD', tq, tenant_join(X, Q, tenant), tenant)
  redis.call('EXPIRE', tq, X.C.state_ttl)
end

-- Register a key inside its (named) tenant in queue Q. Returns its tag there (nil when
-- it is parked).
local function register_key(X, Q, tenant, flow)
  local kk = tenant_key(Q.OB, tenant, 'keys')
  local got = redis.call('ZMSCORE', kk, flow, KEY_FLOOR_MEMBER, tenant)
  if got[1] then return tonumber(got[1]) end
  -- no key set (no floor member): the tenant may be kept in B:tsolo
  local solo = not got[2] and SOLO.read(Q, tenant)
  if solo then
    local tag = SOLO.tag_of(X, Q, tenant, solo, flow)
    if tag ~= nil then return tag end
  end
  if is_parked(X, Q, 'k:' .. flow) then return nil end
  if solo then SOLO.to_set(X, Q, tenant, solo, true) end -- a second key: it needs a key set
  -- (a set this call read already, a serve's, stays a set: the serve writes it back)
  local loaded = X.kfloor ~= nil and X.kfloor[kk] ~= nil
  local kf = key_floor(X, kk, got[2])
  local args = {}
  ck_index_flush(X)
  if tenant ~= flow and not got[3]
      and redis.call('ZSCORE', queue_key(Q.OB, 'ck_index'), tenant) then
    -- a key named as the tenant serves as its own tenant here: it joins the key set
    args = {kf.value, tenant}
  elseif not (solo or loaded) and not keys_left(kk) then
    -- the tenant's one key in play: an entry of B:tsolo, at the floor (its set goes)
    SOLO.write(X, Q, tenant, kf.value, kf.value, flow)
    redis.call('DEL', kk)
    X.kfloor[kk] = nil
    keys_added(X, Q, tenant)
    return kf.value
  end
  local tag = key_join(X, Q, tenant, kk)
  args[#args + 1] = tag
  args[#args + 1] = flow
  if kf.dirty then
    args[#args + 1] = kf.value
    args[#args + 1] = KEY_FLOOR_MEMBER
    kf.dirty = false
  end
  redis.call('ZADD', kk, unpack(args))
  redis.call('EXPIRE', kk, X.C.state_ttl)
  keys_added(X, Q, tenant)
  return tag
end

-- ------------------------------------------------------------------ parking

local function unpark(X, Q, member, value)
  local tag = tonumber(string.sub(value, 3)) or 0
  local kind, name = string.sub(member, 1, 1), string.sub(member, 3)
  if kind == 't' then
    redis.call('ZADD', queue_key(Q.OB, 'ready_tenants'), 'NX', tag, name)
    redis.call('EXPIRE', queue_key(Q.OB, 'ready_tenants'), X.C.state_ttl)
  else
    local named = flow_tenant(name)
    local tenant = default_tenant(Q.name, name)
    if named then
      local kk = tenant_key(Q.OB, tenant, 'keys')
      local solo = SOLO.read(Q, tenant)
      if solo then SOLO.to_set(X, Q, tenant, solo, true) end
      redis.call('ZADD', kk, 'NX', tag, name)
      redis.call('EXPIRE', kk, X.C.state_ttl)
      keys_added(X, Q, tenant)
    end
    register_pair(X, Q, tenant)
  end
  redis.call('HDEL', queue_key(Q.OB, 'parked'), member)
  redis.call('ZREM', queue_key(Q.OB, 'parked_due'), member)
end

-- ------------------------------------------------------------------ hooks

-- A flow got queued runs: a new flow is registered under its tenant; an existing one
-- whose head moved earlier may come back from a time gate sooner.
HOOK.flow_queued = function(X, Q, flow, score, is_new)
  queue_conf(X, Q)
  if Q.order ~= 'fair' then return end
  local tenant = flow_tenant(flow)
  local default = default_tenant(Q.name, flow)
  if not is_new then
    if has_park(X, Q) then
      local due = queue_key(Q.OB, 'parked_due')
      redis.call('ZADD', due, 'XX', 'LT', score, 'k:' .. flow)
      redis.call('ZADD', due, 'XX', 'LT', score, 't:' .. default)
    end
    return
  end
  if tenant == nil then
    register_pair(X, Q, default)
  else
    register_key(X, Q, tenant, flow)
    register_pair(X, Q, tenant)
  end
end

-- A flow drained outside a dequeue (cancel, expiry): it leaves the candidates now
-- (its tenant's tag stays in V:tt: parked credit).
HOOK.flow_drained = function(X, Q, flow)
  local tenant = flow_tenant(flow)
  local default = default_tenant(Q.name, flow)
  if tenant == nil then
    redis.call('ZREM', queue_key(Q.OB, 'ready_tenants'), default)
    if has_park(X, Q) then
      redis.call('HDEL', queue_key(Q.OB, 'parked'), 't:' .. default)
      redis.call('ZREM', queue_key(Q.OB, 'parked_due'), 't:' .. default)
    end
    return
  end
  local kk = tenant_key(Q.OB, tenant, 'keys')
  local solo = SOLO.read(Q, tenant)
  local emptied
  if solo then
    -- its one key drained: a key set of its floor only (another key was not in play)
    emptied = SOLO.tag_of(X, Q, tenant, solo, flow) ~= nil
    if emptied then SOLO.to_set(X, Q, tenant, solo, false) end
  else
    redis.call('ZREM', kk, flow)
    emptied = not keys_left(kk)
  end
  if has_park(X, Q) then
    redis.call('HDEL', queue_key(Q.OB, 'parked'), 'k:' .. flow)
    redis.call('ZREM', queue_key(Q.OB, 'parked_due'), 'k:' .. flow)
  end
  if emptied then redis.call('ZREM', queue_key(Q.OB, 'ready_tenants'), tenant) end
end

-- A slot of `flow` (counted under named tenant `ta`, '' = none) was freed: what its
-- cap held back in Q (where something may be parked) may compete again.
local function slot_freed_at(X, Q, flow, ta)
  local tenant = (ta ~= nil and ta ~= '') and ta or default_tenant(Q.name, flow)
  local members = {'k:' .. flow, 't:' .. tenant}
  local values = redis.call('HMGET', queue_key(Q.OB, 'parked'), members[1], members[2])
  for i, member in ipairs(members) do
    if values[i] and string.sub(values[i], 1, 1) == 'c' then unpark(X, Q, member, values[i]) end
  end
end

-- Whether Q (a queue context read from a run) charges by run time in the fair order:
-- four config fields, read once per queue per call (not the queue's whole config). The
-- queue's `parked` flag comes with them, so a later has_park needs no probe (the scripts
-- that read it here, ack and nack, never park).
local function charges_duration(X, Q)
  if Q.order ~= nil then return Q.order == 'fair' and Q.charge == 'duration' end
  X.qcharge = X.qcharge or {}
  local read = X.qcharge[Q.OB]
  if read == nil then
    local raw = redis.call('HMGET', env_key(Q.V, 'config'), config_field(Q.name, 'order'),
      config_field(Q.name, 'charge'), 'order', 'charge', config_field(Q.oname, 'parked'),
      config_field(Q.name, 'levels'), config_field(Q.name, 'pool'))
    local order = raw[1] or raw[3] or X.C.default_order
    local charge = raw[2] or raw[4] or X.C.default_charge
    read = {duration = order == 'fair' and charge == 'duration', parked = raw[5] ~= false}
    X.qcharge[Q.OB] = read
    if Q.levels == nil then Q.levels = tonumber(raw[6]) or 0 end
    if Q.pool == nil then set_pool(Q, tonumber(raw[7]) or 0) end
  end
  return read.duration
end

-- Charging by run time: the dequeue charged one quantum; correct by what the run took.
HOOK.charge = function(X, Q, flow, ta, duration_ms)
  if duration_ms == nil or not charges_duration(X, Q) then return end
  queue_conf(X, Q)
  local tenant = (ta ~= nil and ta ~= '') and ta or default_tenant(Q.name, flow)
  local delta = (duration_ms / X.C.charge_unit_ms - 1) * Q.quantum
  if delta == 0 then return end
  local simple = {}
  if tenant == flow then simple = {flow} end
  local weight = tenant_weights(X, Q, {tenant}, simple)[tenant] or 1
  local tt = env_key(Q.OV, 'tenant_tags')
  local tag = tonumber(redis.call('ZSCORE', tt, tenant))
  if tag ~= nil then
    tag = tag + delta / weight
    redis.call('ZADD', tt, tag, tenant)
    redis.call('ZADD', queue_key(Q.OB, 'ready_tenants'), 'XX', tag, tenant)
  end
  if flow_tenant(flow) then
    local solo = SOLO.read(Q, tenant)
    if solo then
      local floor, ktag, key = SOLO.parse(solo)
      if key == flow then
        SOLO.write(X, Q, tenant, floor, ktag + delta / key_weight(X, Q, flow), flow)
      end
      return
    end
    local kk = tenant_key(Q.OB, tenant, 'keys')
    local ktag = tonumber(redis.call('ZSCORE', kk, flow))
    if ktag ~= nil then
      redis.call('ZADD', kk, 'XX', ktag + delta / key_weight(X, Q, flow), flow)
    end
  end
end

-- (A block: its helper is a local of the block only, as a library's main chunk may hold
-- at most 200 locals.)
do
  -- The views of base queue Q's levels where something may be parked, listed once per
  -- queue per call (most queues: none), so each freed slot looks only there. A cap holds
  -- across levels: what it held back at any level may compete again when a slot frees.
  -- (The few config fields charges_duration reads say which levels the queue has, when the
  -- script has not read its config. The scripts that free slots never park, so the list
  -- holds for the whole call.)
  local function parked_levels(X, Q)
    if Q.order == nil then charges_duration(X, Q) end
    local views = {}
    local levels = queue_levels(Q)
    for i = 1, #levels do
      local view = level_view(Q, levels[i])
      if has_park(X, view) then views[#views + 1] = view end
    end
    return views
  end

  -- A slot was freed: what its cap held back, at any level, may compete again.
  HOOK.slot_freed = function(X, Q, flow, ta)
    local base = Q.base or Q
    X.parked_levels = X.parked_levels or {}
    local views = X.parked_levels[base.B]
    if views == nil then
      views = parked_levels(X, base)
      X.parked_levels[base.B] = views
    end
    for i = 1, #views do slot_freed_at(X, views[i], flow, ta) end
  end
end

-- A dequeue of consumer pool `pool`: its fair queues join that pool's tenant state (the
-- scripts that start from one of their runs then use it too).
-- A consumer that serves every queue the environment has had is the pool of them all (0),
-- whatever its list says (remembered as the env's `pool_all` until a new queue appears).
-- (A block: its helper is a local of the block only, as a library's main chunk may hold
-- at most 200 locals.)
do
  local function covers_every_queue(env, by_name, pool)
    if env.options.pool_all == pool then return true end
    for _, name in ipairs(redis.call('SMEMBERS', env_key(env.V, 'queues'))) do
      if by_name[name] == nil then return false end
    end
    redis.call('HSET', env_key(env.V, 'config'), 'pool_all', pool)
    return true
  end

  HOOK.use_pool = function(X, env, by_name, pool)
    if pool ~= 0 and covers_every_queue(env, by_name, pool) then pool = 0 end
    local V = env.V
    for name, Q in pairs(by_name) do
      if Q.order == 'fair' and Q.pool ~= pool then
        if pool == 0 then
          redis.call('HDEL', env_key(V, 'config'), config_field(name, 'pool'))
        else
          redis.call('HSET', env_key(V, 'config'), config_field(name, 'pool'), pool)
        end
        set_pool(Q, pool)
      end
    end
  end
end

HOOK.finish = function(X) end

HOOK.needs_fair = function(by_name) return false end

HOOK.needs_fair_queue = function(Q) return false end

-- The fair order's enqueue hooks also read the queue's parked flag and join settings.
HOOK.enqueue_joins = true
-- flow_queued registers a flow whose head is new.
HOOK.asks_new_flow_head = true
