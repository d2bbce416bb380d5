--[[ quota_partition.lua: one partition's share of a cluster-wide cap (quota_ledger.lua).

A partition's quota of a scope is its own limit, in its config: the environment's
concurrency for the scope '*', a queue's total for a queue's name, so the dequeue script
enforces it exactly with nothing new to read. Raising it (add) follows a grant of the
ledger and is refused when the grant's epoch is older than the partition's fence (a
reconciliation ran since); lowering it (release) gives back only what the partition does
not use (its slots in flight stay covered: for '*', floor(quota x burst) >= in flight),
and is always allowed (it also makes a quota the partition held by default explicit: the
default limit, no total). fence raises the fence and reports, per scope, the quota the
ledger must count for the partition: its quota, or what it has in flight if more.

KEYS
  1 T  the partition's shard tag
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG      env id
  FIRST_ARG + 1  operation
    add      scope, amount (>= 0), epoch       -> {OK, added (0: fenced), quota}
    release  scope, wanted (>= 0)              -> {OK, released, quota}
    fence    epoch, then scopes...             -> {OK, then per scope max(quota, used)}
Reply
  as above
]]
--@include prelude
--@include counters

local tag = KEYS[1]
local env_id = arg_env(ARGV[FIRST_ARG])
local op = arg_word(ARGV[FIRST_ARG + 1], 'operation', {'add', 'release', 'fence'})
local V = env_prefix(tag, env_id)
local config = env_key(V, 'config')
local record = env_key(V, 'quota')

local function arg_scope(value)
  if value == '*' then return value end
  return arg_name(value, 'scope', ARG_RULES.name_length)
end

-- The config field that holds a scope's quota.
local function quota_field(scope)
  if scope == '*' then return 'concurrency' end
  return config_field(scope, 'total')
end

-- The scope's quota: its field, else what applies without one (the default limit for
-- '*', no total for a queue).
local function quota_of(scope)
  local v = tonumber(redis.call('HGET', config, quota_field(scope)))
  if v ~= nil then return v end
  if scope == '*' then return C.default_env_concurrency end
  return UNLIMITED
end

-- The least quota that still covers what the scope has in flight.
local function quota_used(scope)
  if scope == '*' then
    local burst = tonumber(redis.call('HGET', config, 'burst_factor')) or C.default_burst_factor
    local running = redis.call('SCARD', env_key(V, 'inflight'))
    return math.ceil(running / burst - 1e-9)
  end
  local X = state_new(C, tag)
  local B = queue_prefix(tag, env_id, scope)
  return redis.call('SCARD', queue_key(B, 'inflight')) + ck_running(X, B, V, env_id, scope)
end

if op == 'fence' then
  local epoch = arg_int(ARGV[FIRST_ARG + 2], 'epoch', 0, UNLIMITED)
  local scopes = {}
  for i = FIRST_ARG + 3, #ARGV do scopes[#scopes + 1] = arg_scope(ARGV[i]) end
  local fence = tonumber(redis.call('HGET', record, 'fence')) or 0
  if epoch > fence then redis.call('HSET', record, 'fence', epoch) end
  local out = {S.OK}
  for _, scope in ipairs(scopes) do
    out[#out + 1] = math.max(quota_of(scope), quota_used(scope))
  end
  return out
end
local scope = arg_scope(ARGV[FIRST_ARG + 2])
local amount = arg_int(ARGV[FIRST_ARG + 3], 'amount', 0, UNLIMITED)
local quota = quota_of(scope)
if op == 'add' then
  local epoch = arg_int(ARGV[FIRST_ARG + 4], 'epoch', 0, UNLIMITED)
  local fence = tonumber(redis.call('HGET', record, 'fence')) or 0
  if epoch < fence or amount == 0 then return {S.OK, 0, quota} end
  redis.call('HSET', config, quota_field(scope), quota + amount)
  redis.call('PUBLISH', C.wake_channel, 'limits') -- runs held back may go now
  return {S.OK, amount, quota + amount}
end
local released = math.max(0, math.min(amount, quota - quota_used(scope)))
if released > 0 or redis.call('HEXISTS', config, quota_field(scope)) == 0 then
  redis.call('HSET', config, quota_field(scope), quota - released) -- (now explicit)
end
return {S.OK, released, quota - released}
