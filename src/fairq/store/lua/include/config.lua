-- config.lua: an environment's limits and options, and its queues', from V:config.
-- A queue's option falls back to the environment's, then to the process default (C).
--@require state levels

-- A stored option's value by its kind (every option is read with it).
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
  return level_base({
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
    unregistered = q.unregistered or false,
    tenants_weighted = e.weights or false,
    order = q.order or e.order or C.default_order,
    max_per_key = q.max_per_key or e.max_per_key or default_per_key,
    quantum = q.quantum or e.quantum or C.default_quantum,
    window = q.window or e.window or C.default_window,
    join = q.join or e.join or C.default_join,
    admission = q.admission or e.admission or C.default_admission,
    arrival_cap = q.arrival_cap or e.arrival_cap or C.default_arrival_cap,
    charge = q.charge or e.charge or C.default_charge,
    priority_levels = q.priority_levels or DEFAULT_PRIORITY_LEVELS,
    promote_ms = q.max_wait_promote and math.floor(q.max_wait_promote * 1000 + 0.5) or nil,
    levels = q.levels or 0,
    pool = q.pool or 0,
  })
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
