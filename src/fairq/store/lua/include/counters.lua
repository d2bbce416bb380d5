-- counters.lua: the lazy Queued/Running counters of a base queue.
--   B:ckqueued  runs queued across all variants
--   B:ckrunning runs in flight across all variants
--   B:trunning  runs in flight per named tenant (HASH)
-- A script collects its deltas and applies them once at the end (counters_flush). A
-- counter that is missing (never seeded, or expired: its TTL, COUNTER_TTL, bounds any
-- drift) is seeded from the truth: when a script reads it, before that script's changes;
-- when a script only moves it, after them (the truth then already includes them).
-- Decrements floor at 0 (a tenant's count at 0 is its field's absence).
--@require state

local function queued_truth(B)
  local total = 0
  for level = 1, MAX_LEVELS do -- every priority level's keyed flows (most have none)
    local OB = level_name(B, level)
    for _, ck in ipairs(redis.call('ZRANGE', queue_key(OB, 'ck_index'), 0, -1)) do
      total = total + redis.call('ZCARD', variant_key(OB, ck, 'queued'))
    end
  end
  return total
end

-- Keyed runs of `queue_name` holding a slot, and slot holders per named tenant: read from
-- the environment's in-flight set (bounded by its concurrency limit).
local function running_truth(tag, V, env_id, queue_name)
  local keyed, tenants = 0, {}
  for _, run in ipairs(redis.call('SMEMBERS', env_key(V, 'inflight'))) do
    local queue, ck, slot_tenant = run_read_running_truth(run_key(tag, env_id .. ':' .. run))
    if queue == queue_name then
      if ck ~= '' then keyed = keyed + 1 end
      if slot_tenant ~= '' then
        tenants[slot_tenant] = (tenants[slot_tenant] or 0) + 1
      end
    end
  end
  return keyed, tenants
end

local function counter_seeds(X, B, V, env_id, queue)
  return {
    [queue_key(B, 'ck_queued_counter')] = function() return queued_truth(B) end,
    [queue_key(B, 'ck_running_counter')] = function()
      local keyed = running_truth(X.tag, V, env_id, queue)
      return keyed
    end,
  }
end

-- The counter's value now (seeded from the truth when the key is missing).
local function counter_get(X, key, seed)
  local v = X.counter_value[key]
  if v ~= nil then return v end
  local raw = redis.call('GET', key)
  if raw then
    v = tonumber(raw) + (X.counter_delta[key] or 0)
  else
    v = seed() -- nothing of this script is applied yet: counter_delta is still pending
    redis.call('SET', key, v, 'EX', X.C.counter_ttl)
    v = v + (X.counter_delta[key] or 0)
  end
  if v < 0 then v = 0 end
  X.counter_value[key] = v
  X.counter_seed[key] = seed
  return v
end

local function counter_add(X, key, delta, seed)
  X.counter_delta[key] = (X.counter_delta[key] or 0) + delta
  X.counter_seed[key] = seed
  local value = X.counter_value[key]
  if value ~= nil then X.counter_value[key] = math.max(0, value + delta) end
end

-- Queued / running across the variants of B (reads; seeds when missing).
local function ck_queued(X, B, V, env_id, queue)
  local key = queue_key(B, 'ck_queued_counter')
  if X.counter_value[key] == nil and redis.call('EXISTS', queue_key(B, 'ck_index')) == 0
      and (X.counter_delta[key] or 0) == 0 then
    return 0 -- a queue that never had a keyed run has no counter
  end
  return counter_get(X, key, counter_seeds(X, B, V, env_id, queue)[key])
end

local function ck_running(X, B, V, env_id, queue)
  local key = queue_key(B, 'ck_running_counter')
  return counter_get(X, key, counter_seeds(X, B, V, env_id, queue)[key])
end

local function ck_queued_add(X, B, V, env_id, queue, delta)
  local key = queue_key(B, 'ck_queued_counter')
  counter_add(X, key, delta, counter_seeds(X, B, V, env_id, queue)[key])
end

local function ck_running_add(X, B, V, env_id, queue, delta)
  local key = queue_key(B, 'ck_running_counter')
  counter_add(X, key, delta, counter_seeds(X, B, V, env_id, queue)[key])
end

-- Runs of a named tenant in flight in B.
local function tenant_running_seed(X, B, V, env_id, queue)
  local key = queue_key(B, 'tenant_running')
  local _, tenants = running_truth(X.tag, V, env_id, queue)
  redis.call('DEL', key)
  local args = {'', 0} -- the empty field marks the hash as seeded even with no tenant
  for tenant, n in pairs(tenants) do
    args[#args + 1] = tenant
    args[#args + 1] = n
  end
  redis.call('HSET', key, unpack(args))
  redis.call('EXPIRE', key, X.C.counter_ttl)
  return tenants
end

-- Slot holders of a named tenant in B now (pre-script value plus this script's deltas).
local function tenant_running(X, B, V, env_id, queue, tenant)
  local key = queue_key(B, 'tenant_running')
  local base = X.tenant_running_base[key]
  if base == nil then
    base = {}
    X.tenant_running_base[key] = base
    if redis.call('EXISTS', key) == 0 then
      for t, n in pairs(tenant_running_seed(X, B, V, env_id, queue)) do base[t] = n end
      X.tenant_running_seeded[key] = true
    end
  end
  local v = base[tenant]
  if v == nil then
    v = X.tenant_running_seeded[key] and 0 or tonumber(redis.call('HGET', key, tenant) or '0')
    base[tenant] = v
  end
  local deltas = X.tenant_running_delta[key]
  return math.max(0, v + (deltas and deltas[tenant] or 0))
end

local function tenant_running_add(X, B, V, env_id, queue, tenant, delta)
  local key = queue_key(B, 'tenant_running')
  local deltas = X.tenant_running_delta[key]
  if deltas == nil then
    deltas = {}
    X.tenant_running_delta[key] = deltas
    X.tenant_running_queue[key] = {B = B, V = V, env_id = env_id, queue = queue}
  end
  deltas[tenant] = (deltas[tenant] or 0) + delta
end

local function counters_flush(X)
  for key, delta in pairs(state_peek(X, 'counter_delta')) do
    if delta ~= 0 then
      local v = redis.call('INCRBY', key, delta)
      if v < 0 or (delta > 0 and v <= delta) then
        if redis.call('TTL', key) == -1 then
          -- it was missing: seed from the truth, which already holds this script's changes
          redis.call('SET', key, X.counter_seed[key](), 'EX', X.C.counter_ttl)
        elseif v < 0 then
          redis.call('SET', key, 0, 'KEEPTTL')
        end
      end
    end
  end
  for key, deltas in pairs(state_peek(X, 'tenant_running_delta')) do
    local missing = redis.call('EXISTS', key) == 0
    if missing then
      local q = X.tenant_running_queue[key]
      tenant_running_seed(X, q.B, q.V, q.env_id, q.queue)
    else
      -- a tenant with none in flight leaves the hash (missing = 0; the '' field keeps the
      -- hash seeded), so the hash holds the tenants running now, not every tenant that ever
      -- ran: a server keeps a hash of up to hash-max-listpack-entries fields (512 on
      -- Valkey 9) as one list it scans per field
      local idle = nil
      for tenant, delta in pairs(deltas) do
        if delta ~= 0 and redis.call('HINCRBY', key, tenant, delta) <= 0 then
          if idle == nil then idle = {} end
          idle[#idle + 1] = tenant
        end
      end
      if idle ~= nil then redis.call('HDEL', key, unpack(idle)) end
    end
  end
end
