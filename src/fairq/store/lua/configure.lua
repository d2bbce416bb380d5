--[[ configure.lua: apply a set of limit / option / weight changes of one environment
atomically: every change is checked before the first is written, so a command that is
partly wrong changes nothing. Then wake consumers (a raised limit may let runs go).

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG  env id
  then 4 per change: target, queue ('' for the environment's own), field, value
    ('' = remove). Targets:
      config        V:config: an option of the env (queue '') or of the queue
      key_caps      B:kcaps[field = encoded key]       value: integer >= 0
      tenant_caps   B:tcaps[field = encoded tenant]    value: integer >= 0
      key_rates     B:krates[field = encoded key]      value: 'rate:burst'
      tenant_rates  B:trates[field = encoded tenant]   value: 'rate:burst'
      key_weights   B:ckweights[field = encoded key]   value: number > 0
      tenant_weights V:tw[field = encoded tenant]      value: number > 0
      env_weights   T:eweights[field = env id]         value: number > 0
Reply
  OK
]]
--@schema fair
--@include prelude

local tag = KEYS[1]
local env_id = arg_env(ARGV[FIRST_ARG])
local count = arg_groups(ARGV, FIRST_ARG + 1, 4, 'change')
local V = env_prefix(tag, env_id)

-- A value against its rule (OPTION_RULES, generated from the option table Python checks
-- with: the same kinds, ranges and words).
local function check_rule(rule, name, value)
  if rule.kind == 'int' then
    arg_int(value, name, rule.low, rule.high)
  elseif rule.kind == 'float' then
    arg_num(value, name, rule.low, rule.high)
  else
    arg_word(value, name, rule.words)
  end
end

local function check_value(target, queue, field, value)
  if value == '' then return end
  local overrides = OPTION_RULES.override
  if target == 'config' then
    local rule = (queue == '' and OPTION_RULES.env or OPTION_RULES.queue)[field]
    -- the internal flags are fairq's own (maintained below, never set by a caller)
    if rule == nil or rule.internal then fail('unknown option ' .. field) end
    check_rule(rule, field, value)
  elseif target == 'key_caps' or target == 'tenant_caps' then
    check_rule(overrides.cap, 'cap', value)
  elseif target == 'key_rates' or target == 'tenant_rates' then
    local r, b = string.match(value, '^([^:]+):([^:]+)$')
    check_rule(overrides.rate, 'rate', r)
    check_rule(overrides.rate_burst, 'rate burst', b)
  else
    check_rule(overrides.weight, 'weight', value)
  end
end

local QUEUE_TARGETS = {key_caps = 'key_caps', tenant_caps = 'tenant_caps',
  key_rates = 'key_rates', tenant_rates = 'tenant_rates', key_weights = 'key_weights'}
local changes = {}
for r = 0, count - 1 do
  local i = FIRST_ARG + 1 + r * 4
  local target, queue, field, value = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local key
  if target == 'config' then
    key = env_key(V, 'config')
    if queue ~= '' then
      field = config_field(arg_name(queue, 'queue', ARG_RULES.name_length), field)
    end
  elseif QUEUE_TARGETS[target] then
    local B = queue_prefix(tag, env_id, arg_name(queue, 'queue', ARG_RULES.name_length))
    key = queue_key(B, QUEUE_TARGETS[target])
  elseif target == 'tenant_weights' then
    key = env_key(V, 'tenant_weights')
  elseif target == 'env_weights' then
    key = shard_key(tag, 'env_weights')
  else
    fail('unknown target ' .. tostring(target))
  end
  if type(field) ~= 'string' or #field == 0 or #field > 1024 then fail('bad field') end
  check_value(target, queue, ARGV[i + 2], value)
  changes[#changes + 1] = {key, field, value, target, queue}
end
local OVERRIDES = {'key_caps', 'tenant_caps', 'key_rates', 'tenant_rates'}
local config = env_key(V, 'config')
for _, c in ipairs(changes) do
  if c[3] == '' then
    redis.call('HDEL', c[1], c[2])
  else
    redis.call('HSET', c[1], c[2], c[3])
  end
end
-- the internal flags the scripts read instead of probing for these hashes
for _, c in ipairs(changes) do
  local target, queue = c[4], c[5]
  if target == 'tenant_weights' then
    if redis.call('EXISTS', env_key(V, 'tenant_weights')) == 1 then
      redis.call('HSET', config, 'weights', 1)
    else
      redis.call('HDEL', config, 'weights')
    end
  elseif target == 'key_weights' then
    local B = queue_prefix(tag, env_id, queue)
    if redis.call('EXISTS', queue_key(B, 'key_weights')) == 1 then
      redis.call('HSET', config, config_field(queue, 'weights'), 1)
    else
      redis.call('HDEL', config, config_field(queue, 'weights'))
    end
  elseif QUEUE_TARGETS[target] then
    local B = queue_prefix(tag, env_id, queue)
    local any = false
    for _, name in ipairs(OVERRIDES) do
      if redis.call('EXISTS', queue_key(B, name)) == 1 then any = true end
    end
    if any then
      redis.call('HSET', config, config_field(queue, 'overrides'), 1)
    else
      redis.call('HDEL', config, config_field(queue, 'overrides'))
    end
  end
end
redis.call('PUBLISH', C.wake_channel, 'limits')
return S.OK
