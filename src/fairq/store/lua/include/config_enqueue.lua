-- config_enqueue.lua: reading options from V:config (a queue's option falls back to the
-- environment's, then to the process default in C), and the few an enqueue reads.
--@require state levels

local function option_value(kind, raw)
  if raw == nil or raw == false then return nil end
  if kind == 'word' then return raw end
  if kind == 'flag' then return raw == '1' end
  return tonumber(raw)
end

-- The few options an enqueue reads, in one small HMGET instead of the queue's whole
-- config: its size limit, order and named flag; with `joining` (the fair build) also
-- what registering a new tenant or key needs (parked flag, join policy, quantum,
-- arrival cap, admission). A queue context with only those settings, by the same fallbacks as
-- queue_config (the queue's, else the environment's, else the process default). The
-- field lists are kept per queue name (a bounded number, as config_fields does).
-- Returns env, {name -> queue}.
local ENQUEUE_FIELDS = memo_new(256)

local function enqueue_field_list(name, joining)
  local fields = {'max_queue_size', 'order', config_field(name, 'max_size'),
    config_field(name, 'order'), config_field(name, 'named'),
    config_field(name, 'priority_levels'), config_field(name, 'levels'),
    config_field(name, 'max_wait_promote')}
  if joining then
    for _, option in ipairs({'join', 'quantum', 'arrival_cap'}) do
      fields[#fields + 1] = option
      fields[#fields + 1] = config_field(name, option)
    end
    fields[#fields + 1] = config_field(name, 'parked')
    fields[#fields + 1] = 'admission'
    fields[#fields + 1] = config_field(name, 'admission')
    fields[#fields + 1] = config_field(name, 'pool')
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
  local promote = option_value('float', raw[8])
  local Q = level_base({
    name = name, env = env, env_id = env_id, V = V, B = queue_prefix(X.tag, env_id, name),
    max_size = option_value('int', raw[3]) or env.max_queue_size,
    order = option_value('word', raw[4]) or option_value('word', raw[2]) or C.default_order,
    named = option_value('flag', raw[5]) or false,
    priority_levels = option_value('int', raw[6]) or DEFAULT_PRIORITY_LEVELS,
    levels = option_value('int', raw[7]) or 0,
    promote_ms = promote and math.floor(promote * 1000 + 0.5) or nil,
  })
  if joining then
    -- raw[9..14]: join, quantum, arrival_cap, each the env's then the queue's; raw[15]
    Q.join = option_value('word', raw[10]) or option_value('word', raw[9]) or C.default_join
    Q.quantum = option_value('float', raw[12]) or option_value('float', raw[11])
      or C.default_quantum
    Q.arrival_cap = option_value('float', raw[14]) or option_value('float', raw[13])
      or C.default_arrival_cap
    Q.parked = option_value('flag', raw[15]) or false
    Q.admission = option_value('word', raw[17]) or option_value('word', raw[16])
      or C.default_admission
    set_pool(Q, option_value('int', raw[18]) or 0)
  end
  return env, {[name] = Q}
end
