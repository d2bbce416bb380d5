-- config.lua: an environment's limits and options, and its queues', from V:config.
-- A queue's option falls back to the environment's, then to the process default (C).
--@require state

local function option_value(kind, raw)
  if raw == nil or raw == false then return nil end
  if kind == 'word' then return raw end
  if kind == 'flag' then return raw == '1' end
  return tonumber(raw)
end

-- The environment: its limits and the option defaults of its queues.
local function env_config(X, V, env_id, raw)
  local C = X.C
  local e = {}
  for i, name in ipairs(ENV_OPTIONS) do
    local v = raw[i]
    if v then e[name] = option_value(ENV_OPTION_KIND[name], v) end -- most are unset
  end
  local limit = e.concurrency or C.default_env_concurrency
  local burst = e.burst_factor or C.default_burst_factor
  return {
    V = V, env_id = env_id, options = e,
    limit = limit, burst = burst, limit_burst = math.floor(limit * burst),
    max_queue_size = e.max_queue_size or C.default_queue_size_limit,
  }
end

-- One queue of `env`, from the raw values of its QUEUE_OPTIONS fields.
local function queue_config(X, env, name, raw, offset)
  local C, e = X.C, env.options
  local q = {}
  for i, option in ipairs(QUEUE_OPTIONS) do
    local v = raw[offset + i]
    if v then q[option] = option_value(QUEUE_OPTION_KIND[option], v) end -- most are unset
  end
  local default_per_key = C.default_max_per_key
  if default_per_key ~= nil and default_per_key <= 0 then default_per_key = nil end
  return {
    name = name, env = env, env_id = env.env_id, V = env.V,
    B = queue_prefix(X.tag, env.env_id, name),
    concurrency = q.concurrency,
    -- the per-variant limit (and the keyless runs' total): min(queue limit, env limit)
    limit = math.min(q.concurrency or UNLIMITED, env.limit),
    paused = q.paused or false,
    total = q.total,
    max_size = q.max_size or env.max_queue_size,
    rate = q.rate, rate_burst = q.rate_burst or 1,
    key_rate = q.key_rate, key_rate_burst = q.key_rate_burst or 1,
    tenant_rate = q.tenant_rate, tenant_rate_burst = q.tenant_rate_burst or 1,
    borrow = q.borrow or false,
    -- internal flags (configure.lua / runs.lua keep them): what a script need not probe
    weighted = q.weights or false,
    overrides = q.overrides or false,
    named = q.named or false,
    parked = q.parked or false,
    tenants_weighted = e.weights or false,
    order = q.order or e.order or C.default_order,
    max_per_key = q.max_per_key or e.max_per_key or default_per_key,
    quantum = q.quantum or e.quantum or C.default_quantum,
    window = q.window or e.window or C.default_window,
    join = q.join or e.join or C.default_join,
    arrival_cap = q.arrival_cap or e.arrival_cap or C.default_arrival_cap,
    charge = q.charge or e.charge or C.default_charge,
  }
end

-- The HMGET fields of the environment and the listed queues, built once per list of
-- queue names and kept by the library (the names are constants of the callers, and a
-- bounded number of lists is kept: building 33 fields per queue cost more per call than
-- the HMGET itself).
local CONFIG_FIELDS = memo_new(256)

local function all_config_fields(queues)
  local fields = {}
  for _, name in ipairs(ENV_OPTIONS) do fields[#fields + 1] = name end
  for _, q in ipairs(queues) do
    for _, option in ipairs(QUEUE_OPTIONS) do fields[#fields + 1] = config_field(q, option) end
  end
  return fields
end

local function config_fields(queues)
  -- kept by the names joined (names never contain ':')
  return memo_get(CONFIG_FIELDS, table.concat(queues, ':'), all_config_fields, queues)
end

-- The environment and the listed queues, in one HMGET. Returns env, {name -> queue}.
local function config_read(X, V, env_id, queues)
  local fields = config_fields(queues)
  local raw
  if #fields <= UNPACK_CHUNK then
    raw = redis.call('HMGET', env_key(V, 'config'), unpack(fields))
  else
    raw = call_list('HMGET', env_key(V, 'config'), fields)
  end
  local env = env_config(X, V, env_id, raw)
  local by_name = {}
  for i, name in ipairs(queues) do
    by_name[name] = queue_config(X, env, name, raw, #ENV_OPTIONS + (i - 1) * #QUEUE_OPTIONS)
  end
  return env, by_name
end

-- The few options an enqueue reads, in one small HMGET instead of the queue's whole
-- config: its size limit, order and named flag; with `joining` (the fair build) also
-- what registering a new tenant or key needs (parked flag, join policy, quantum,
-- arrival cap). A queue context with only those settings, by the same fallbacks as
-- queue_config (the queue's, else the environment's, else the process default). The
-- field lists are kept per queue name (a bounded number, as config_fields does).
-- Returns env, {name -> queue}.
local ENQUEUE_FIELDS = memo_new(256)

local function enqueue_field_list(name, joining)
  local fields = {'max_queue_size', 'order', config_field(name, 'max_size'),
    config_field(name, 'order'), config_field(name, 'named')}
  if joining then
    for _, option in ipairs({'join', 'quantum', 'arrival_cap'}) do
      fields[#fields + 1] = option
      fields[#fields + 1] = config_field(name, option)
    end
    fields[#fields + 1] = config_field(name, 'parked')
  end
  return fields
end

local function enqueue_fields(name, joining)
  -- kept by the name, '+' first when joining (queue names never start with '+')
  return memo_get(ENQUEUE_FIELDS, joining and ('+' .. name) or name, enqueue_field_list, name,
    joining)
end

local function enqueue_config_read(X, V, env_id, name, joining)
  local C = X.C
  local raw = redis.call('HMGET', env_key(V, 'config'), unpack(enqueue_fields(name, joining)))
  local env = {
    V = V, env_id = env_id,
    max_queue_size = option_value('int', raw[1]) or C.default_queue_size_limit,
  }
  local Q = {
    name = name, env = env, env_id = env_id, V = V, B = queue_prefix(X.tag, env_id, name),
    max_size = option_value('int', raw[3]) or env.max_queue_size,
    order = option_value('word', raw[4]) or option_value('word', raw[2]) or C.default_order,
    named = option_value('flag', raw[5]) or false,
  }
  if joining then
    -- raw[6..11]: join, quantum, arrival_cap, each the env's then the queue's; raw[12]
    Q.join = option_value('word', raw[7]) or option_value('word', raw[6]) or C.default_join
    Q.quantum = option_value('float', raw[9]) or option_value('float', raw[8])
      or C.default_quantum
    Q.arrival_cap = option_value('float', raw[11]) or option_value('float', raw[10])
      or C.default_arrival_cap
    Q.parked = option_value('flag', raw[12]) or false
  end
  return env, {[name] = Q}
end

-- Whether any of the queues uses the fair order.
local function any_fair(by_name)
  for _, q in pairs(by_name) do
    if q.order == 'fair' then return true end
  end
  return false
end
