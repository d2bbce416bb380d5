-- config.lua: an environment's limits and options, and its queues', from V:config.
-- A queue's option falls back to the environment's, then to the process default (C).
--@require state levels config_fields

-- A stored option's value by its kind (every option is read with it).
local function option_value(kind, raw)
  if raw == nil or raw == false then return nil end
  if kind == 'word' then return raw end
  if kind == 'flag' then return raw == '1' end
  return tonumber(raw)
end

-- The environment: its limits and the option defaults of its queues (`e`: its options
-- set, by name).
local function env_config(X, V, env_id, e)
  local C = X.C
  local limit = e.concurrency or C.default_env_concurrency
  local burst = e.burst_factor or C.default_burst_factor
  return {
    V = V, env_id = env_id, options = e,
    limit = limit, burst = burst, limit_burst = math.floor(limit * burst),
    max_queue_size = e.max_queue_size or C.default_queue_size_limit,
  }
end

-- One queue of `env` (`q`: its options set, by name).
local function queue_config(X, env, name, q)
  local C, e = X.C, env.options
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

-- The config fields of the environment and the listed queues, built once per list of
-- queue names and kept by the library (the names are constants of the callers, and a
-- bounded number of lists is kept: building 33 fields per queue cost more per call than
-- the read itself): {fields (ENV_OPTIONS, then each queue's QUEUE_OPTIONS), at = {field
-- -> {0 (the environment) or the queue's place in the list, option, its kind}}}.
local CONFIG_FIELDS = memo_new(256)

local function all_config_fields(queues)
  local fields, at = {}, {}
  for _, name in ipairs(ENV_OPTIONS) do
    fields[#fields + 1] = name
    at[name] = {0, name, ENV_OPTION_KIND[name]}
  end
  for i, q in ipairs(queues) do
    for _, option in ipairs(QUEUE_OPTIONS) do
      local field = config_field(q, option)
      fields[#fields + 1] = field
      at[field] = {i, option, QUEUE_OPTION_KIND[option]}
    end
  end
  return {fields = fields, at = at}
end

-- The environment and the listed queues, from the config fields that are set
-- (config_set_fields: about 30 options per listed queue, most of them unset). Returns
-- env, {name -> queue}.
local function config_read(X, V, env_id, queues)
  -- kept by the names joined (names never contain ':')
  local spec = memo_get(CONFIG_FIELDS, table.concat(queues, ':'), all_config_fields, queues)
  local at = spec.at
  local options = {[0] = {}}
  for i = 1, #queues do options[i] = {} end
  local set = config_set_fields(env_key(V, 'config'), spec.fields)
  for i = 1, #set, 2 do
    local place = at[set[i]]
    if place then options[place[1]][place[2]] = option_value(place[3], set[i + 1]) end
  end
  local env = env_config(X, V, env_id, options[0])
  local by_name = {}
  for i, name in ipairs(queues) do by_name[name] = queue_config(X, env, name, options[i]) end
  return env, by_name
end
