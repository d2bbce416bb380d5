-- config_enqueue.lua: the few options an enqueue reads from V:config (a queue's option
-- falls back to the environment's, then to the process default in C).
--@require state levels config_fields

-- What one enqueue reads, by what its runs need. Always: the size limits, the order,
-- the queue's levels and its promotion delay. With WANT.named (a run has a named tenant)
-- the queue's named flag; with WANT.levels (a size limit may be checked, or a run goes
-- to a level other than BASE_LEVEL) its levels bits, else read on first need
-- (levels_bits); with WANT.join (the fair build) what registering a new tenant or key
-- needs (join policy, quantum, arrival cap, admission rule, each the env's then the
-- queue's, the parked flag and its pool). The list holds only the wanted ones: a config
-- hash of more fields than that is read by them (config_set_fields).
local WANT = {named = 1, levels = 2, join = 4}

-- {fields, index = {field -> its place in fields}, at = {option -> its place}}, kept per
-- wanted set and queue name (a bounded number, as config.lua's CONFIG_FIELDS is).
local ENQUEUE_SPECS = {}
for wanted = 0, WANT.named + WANT.levels + WANT.join do ENQUEUE_SPECS[wanted] = memo_new(256) end

local function enqueue_spec(name, wanted)
  local fields = {'max_queue_size', 'order', config_field(name, 'max_size'),
    config_field(name, 'order'), config_field(name, 'priority_levels'),
    config_field(name, 'max_wait_promote')}
  local at = {}
  local function add(option, field)
    fields[#fields + 1] = field
    at[option] = #fields
  end
  if bit.band(wanted, WANT.named) ~= 0 then add('named', config_field(name, 'named')) end
  if bit.band(wanted, WANT.levels) ~= 0 then add('levels', config_field(name, 'levels')) end
  if bit.band(wanted, WANT.join) ~= 0 then
    for _, option in ipairs({'join', 'quantum', 'arrival_cap'}) do
      add('env_' .. option, option)
      add(option, config_field(name, option))
    end
    add('parked', config_field(name, 'parked'))
    add('env_admission', 'admission')
    add('admission', config_field(name, 'admission'))
    add('pool', config_field(name, 'pool'))
  end
  local index = {}
  for i, field in ipairs(fields) do index[field] = i end
  return {fields = fields, index = index, at = at}
end

-- The options beyond the usual six into Q (`at`: where each is in `raw`).
local function enqueue_config_more(C, Q, raw, at)
  if at.named then Q.named = raw[at.named] == '1' end
  if at.levels then Q.levels = tonumber(raw[at.levels]) or 0 end
  if at.join then
    Q.join = raw[at.join] or raw[at.env_join] or C.default_join
    Q.quantum = tonumber(raw[at.quantum]) or tonumber(raw[at.env_quantum]) or C.default_quantum
    Q.arrival_cap = tonumber(raw[at.arrival_cap]) or tonumber(raw[at.env_arrival_cap])
      or C.default_arrival_cap
    Q.parked = raw[at.parked] == '1'
    Q.admission = raw[at.admission] or raw[at.env_admission] or C.default_admission
    set_pool(Q, tonumber(raw[at.pool]) or 0)
  end
end

-- A queue context with only those settings (an option not read stays nil: named
-- unread = no run of the call needs it, levels unread = levels_bits reads it). Its
-- level fields are its base level's, as level_base sets them. `key`: the env's config
-- key, `B`: the queue's prefix.
local function enqueue_config_read(X, V, env_id, name, wanted, key, B)
  local C = X.C
  local specs = ENQUEUE_SPECS[wanted]
  local spec = specs.values[name] or memo_get(specs, name, enqueue_spec, name, wanted)
  -- the set fields by their place in spec.fields (nil: unset)
  local raw = EMPTY
  local set = config_set_fields(key, spec.fields)
  if #set > 0 then
    local index = spec.index
    raw = {}
    for i = 1, #set, 2 do
      local at = index[set[i]]
      if at then raw[at] = set[i + 1] end
    end
  end
  -- (tonumber is a C call: only on a value)
  local promote = raw[6] and tonumber(raw[6])
  local Q = {
    name = name, env_id = env_id, V = V, B = B,
    OB = B, OV = V, oname = name, level = BASE_LEVEL,
    max_size = raw[3] and tonumber(raw[3]) or raw[1] and tonumber(raw[1])
      or C.default_queue_size_limit,
    order = raw[4] or raw[2] or C.default_order,
    priority_levels = raw[5] and tonumber(raw[5]) or DEFAULT_PRIORITY_LEVELS,
    promote_ms = promote and math.floor(promote * 1000 + 0.5) or nil,
  }
  if wanted ~= 0 then enqueue_config_more(C, Q, raw, spec.at) end
  return Q
end
