-- gates.lua: what may start now under the limits layered below the order:
-- total cap of a queue, cap of a key, cap of a tenant, and token-bucket rate limits
-- of a queue, a tenant and a key (on the clock the script runs with).
--   cap of a key    = B:kcaps[K], else the per-variant limit min(queue limit, env limit);
--                     a named tenant's key K is its own flow, with that cap of its own
--   cap of a tenant = B:tcaps[N], else none (naming a tenant never slows it down)
--   keyless runs    = the per-variant limit across all of them (the queue's limit),
--                     whichever tenant they name
-- Every function reads a value once per script and then tracks it itself.
--@require state counters runs

-- The override hashes a queue has (one EXISTS each, once per script).
local function overrides(X, Q)
  local o = X.overrides and X.overrides[Q.B]
  if o then return o end
  X.overrides = X.overrides or {}
  o = {key_caps = {}, tenant_caps = {}, key_rates = {}, tenant_rates = {}}
  -- the config's flag says whether the queue has any override (no probe when it has none)
  if Q.overrides then
    o.has_key_caps = redis.call('EXISTS', queue_key(Q.B, 'key_caps')) == 1
    o.has_tenant_caps = redis.call('EXISTS', queue_key(Q.B, 'tenant_caps')) == 1
    o.has_key_rates = redis.call('EXISTS', queue_key(Q.B, 'key_rates')) == 1
    o.has_tenant_rates = redis.call('EXISTS', queue_key(Q.B, 'tenant_rates')) == 1
  end
  X.overrides[Q.B] = o
  return o
end

local function override(cache, present, key, field)
  if not present then return nil end
  local v = cache[field]
  if v == nil then
    v = redis.call('HGET', key, field) or false
    cache[field] = v
  end
  return v or nil
end

local function key_cap(X, Q, flow)
  if flow_keyless(flow) then return Q.limit end
  local o = overrides(X, Q)
  local v = override(o.key_caps, o.has_key_caps, queue_key(Q.B, 'key_caps'), flow_key(flow))
  return v and tonumber(v) or Q.limit
end

-- A tenant's own cap (nil when it has no override).
local function tenant_cap_override(X, Q, tenant)
  local o = overrides(X, Q)
  local v = override(o.tenant_caps, o.has_tenant_caps, queue_key(Q.B, 'tenant_caps'), tenant)
  return v and tonumber(v) or nil
end

local function tenant_cap(X, Q, tenant)
  return tenant_cap_override(X, Q, tenant) or UNLIMITED
end

-- Slots a flow holds now (its variant's in-flight set, or the keyless runs': every
-- keyless flow of a queue shares them).
local function flow_running(X, Q, flow)
  X.slots_held = X.slots_held or {}
  local id = flow_slots_key(Q, flow)
  local v = X.slots_held[id]
  if v == nil then
    v = redis.call('SCARD', id)
    X.slots_held[id] = v
  end
  return v
end

local function flow_took(X, Q, flow, n)
  local id = flow_slots_key(Q, flow)
  if X.slots_held and X.slots_held[id] then X.slots_held[id] = X.slots_held[id] + n end
end

-- Runs of the queue in flight, keyless and keyed (for its total cap).
local function queue_running(X, Q)
  X.queue_in_flight = X.queue_in_flight or {}
  local v = X.queue_in_flight[Q.B]
  if v == nil then
    v = redis.call('SCARD', queue_key(Q.B, 'inflight')) + ck_running(X, Q.B, Q.V, Q.env_id, Q.name)
    X.queue_in_flight[Q.B] = v
  end
  return v
end

local function queue_took(X, Q, n)
  local known = X.queue_in_flight and X.queue_in_flight[Q.B]
  if known then X.queue_in_flight[Q.B] = known + n end
end

-- Room left under the queue's total cap (math.huge when it has none).
local function total_room(X, Q)
  if Q.total == nil then return math.huge end
  return Q.total - queue_running(X, Q)
end

-- Room left for one flow under its key cap and its tenant's cap.
-- `tenant` is the flow's tenant, `named` whether it is a named tenant (not the default).
-- Returns the room and which cap bounds it ('key' or 'tenant').
local function flow_room(X, Q, flow, tenant, named)
  local cap = key_cap(X, Q, flow)
  local room, bound = math.huge, nil
  -- a cap at or above the env limit (with burst) can never bind: the env gate does first
  if cap < Q.env.limit_burst then
    room, bound = cap - flow_running(X, Q, flow), 'key'
  end
  if named then
    local tcap = tenant_cap(X, Q, tenant)
    if tcap < Q.env.limit_burst then
      local t_room = tcap - tenant_running(X, Q.B, Q.V, Q.env_id, Q.name, tenant)
      if t_room < room then room, bound = t_room, 'tenant' end
    end
  else
    -- the default tenant of a key is the key itself: its slots are the key's, and only
    -- an explicit cap for that tenant binds beside the key's own (override or limit)
    local tcap = tenant_cap_override(X, Q, tenant)
    if tcap ~= nil and tcap < cap then
      local t_room = tcap - flow_running(X, Q, flow)
      if t_room < room then room, bound = t_room, 'tenant' end
    end
  end
  return room, bound
end

-- ------------------------------------------------------------------ token buckets

local function bucket(X, Q, id, rate, burst)
  X.buckets = X.buckets or {}
  local qb = X.buckets[Q.B]
  if qb == nil then
    qb = {}
    X.buckets[Q.B] = qb
  end
  local b = qb[id]
  if b == nil then
    local raw = redis.call('HGET', queue_key(Q.B, 'buckets'), id)
    local tokens, updated = burst, X.now
    if raw then
      local t, u = string.match(raw, '^([^:]+):([^:]+)$')
      tokens, updated = tonumber(t) or burst, tonumber(u) or X.now
    end
    if X.now > updated then tokens = math.min(burst, tokens + (X.now - updated) * rate / 1000) end
    b = {tokens = math.min(tokens, burst), rate = rate, burst = burst, dirty = false}
    qb[id] = b
  end
  return b
end

-- Whole tokens a bucket has now, and when its next token arrives (ms).
local function bucket_peek(X, b)
  local whole = math.floor(b.tokens + 1e-9)
  local next_at = X.now + math.ceil((1 - (b.tokens - whole)) * 1000 / b.rate - 1e-9)
  return whole, next_at
end

local function bucket_take(b, n)
  b.tokens = b.tokens - n
  b.dirty = true
end

local function parse_rate(raw)
  if not raw then return nil end
  local r, b = string.match(raw, '^([^:]+):([^:]+)$')
  return tonumber(r), tonumber(b)
end

-- The buckets that apply to one flow: {bucket, scope} list ('queue', 'tenant', 'key').
local function flow_buckets(X, Q, flow, tenant)
  local out = {}
  if Q.rate then out[#out + 1] = {bucket(X, Q, 'q', Q.rate, Q.rate_burst), 'queue'} end
  local o = overrides(X, Q)
  local trate, tburst = parse_rate(override(o.tenant_rates, o.has_tenant_rates,
    queue_key(Q.B, 'tenant_rates'), tenant))
  if trate == nil and Q.tenant_rate then trate, tburst = Q.tenant_rate, Q.tenant_rate_burst end
  if trate then out[#out + 1] = {bucket(X, Q, 't:' .. tenant, trate, tburst), 'tenant'} end
  if not flow_keyless(flow) then
    local krate, kburst = parse_rate(override(o.key_rates, o.has_key_rates,
      queue_key(Q.B, 'key_rates'), flow_key(flow)))
    if krate == nil and Q.key_rate then krate, kburst = Q.key_rate, Q.key_rate_burst end
    if krate then out[#out + 1] = {bucket(X, Q, 'k:' .. flow, krate, kburst), 'key'} end
  end
  return out
end

-- Runs the buckets allow now (math.huge without any), the scope that binds, and when
-- the binding bucket's next token arrives.
local function rate_room(X, buckets)
  local room, scope, next_at = math.huge, nil, nil
  for _, entry in ipairs(buckets) do
    local whole, at = bucket_peek(X, entry[1])
    if whole < room then room, scope, next_at = whole, entry[2], at end
  end
  return room, scope, next_at
end

local function rate_take(buckets, n)
  for _, entry in ipairs(buckets) do bucket_take(entry[1], n) end
end

local function buckets_flush(X)
  if not X.buckets then return end
  for B, qb in pairs(X.buckets) do
    local args = {}
    for id, b in pairs(qb) do
      if b.dirty then
        args[#args + 1] = id
        args[#args + 1] = string.format('%.6f:%d', b.tokens, X.now)
      end
    end
    if #args > 0 then redis.call('HSET', queue_key(B, 'buckets'), unpack(args)) end
  end
end
