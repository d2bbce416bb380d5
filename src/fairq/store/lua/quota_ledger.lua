--[[ quota_ledger.lua: the cluster-wide budget of an environment spread over partitions.

For each capped scope (the environment's concurrency, '*', or a queue's total, by the
queue's name) the ledger holds the cap and what each partition was granted. A partition
enforces its quota (its own config's limit, see quota_partition.lua) exactly, in its
own slot. Quota moves one way at a time: a partition lowers its quota (only by what it
does not use) before the ledger takes the amount back, and the ledger grants an amount
before the partition raises its quota by it. So at every moment, and after a crash
between the two steps, sum(quotas) <= sum(grants) <= cap; a crash only leaves some
quota unused until a reconciliation (begin / end) sets each grant to the quota its
partition really holds. While one runs the ledger refuses grants and returns (a hold),
and its epoch fences the moves begun before it.

Lives in partition 0's slot: V:quota (fields cap:<scope>, grant:<scope>:<partition>,
epoch, hold, and rate:<queue> for the queues' rate limits).

KEYS
  1 T  partition 0's shard tag
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG      env id
  FIRST_ARG + 1  operation
    grant   scope, partition, wanted (>= 0)       -> {OK, granted, epoch}
    return  scope, partition, amount, epoch       -> {OK, taken back (0: fenced or held)}
    cap     scope, cap ('' = the scope is no longer capped) -> {OK, grants removed}
    rate    queue, 'rate:burst' ('' = none): the queue's cluster-wide rate limit, which
            every partition holds an equal share of                       -> {OK}
    begin   hold (ms)                             -> {OK, epoch}
    end     epoch, then per partition and scope: scope, partition, quota -> {OK, 1 | 0}
Reply
  as above (0 from end: the reconciliation's epoch is no longer the ledger's)
]]
--@include prelude

local tag = KEYS[1]
local env_id = arg_env(ARGV[FIRST_ARG])
local op = arg_word(ARGV[FIRST_ARG + 1], 'operation',
  {'grant', 'return', 'cap', 'rate', 'begin', 'end'})
local Q = env_key(env_prefix(tag, env_id), 'quota')

local function arg_scope(value)
  if value == '*' then return value end
  return arg_name(value, 'scope', ARG_RULES.name_length)
end

local function held()
  local hold = tonumber(redis.call('HGET', Q, 'hold'))
  return hold ~= nil and hold > C.now
end

local function epoch_now()
  return tonumber(redis.call('HGET', Q, 'epoch')) or 0
end

-- The sum of every partition's grant of a scope (fields grant:<scope>:<p>).
local function granted(scope)
  local total = 0
  local fields = redis.call('HGETALL', Q)
  local prefix = 'grant:' .. scope .. ':'
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, #prefix) == prefix then total = total + tonumber(fields[i + 1]) end
  end
  return total
end

if op == 'grant' then
  local scope = arg_scope(ARGV[FIRST_ARG + 2])
  local p = arg_int(ARGV[FIRST_ARG + 3], 'partition', 0, ARG_RULES.partition)
  local wanted = arg_int(ARGV[FIRST_ARG + 4], 'wanted', 0, UNLIMITED)
  local cap = tonumber(redis.call('HGET', Q, 'cap:' .. scope))
  if cap == nil or held() then return {S.OK, 0, epoch_now()} end
  local g = math.max(0, math.min(wanted, cap - granted(scope)))
  if g > 0 then redis.call('HINCRBY', Q, 'grant:' .. scope .. ':' .. p, g) end
  return {S.OK, g, epoch_now()}
elseif op == 'return' then
  local scope = arg_scope(ARGV[FIRST_ARG + 2])
  local p = arg_int(ARGV[FIRST_ARG + 3], 'partition', 0, ARG_RULES.partition)
  local amount = arg_int(ARGV[FIRST_ARG + 4], 'amount', 0, UNLIMITED)
  local epoch = arg_int(ARGV[FIRST_ARG + 5], 'epoch', 0, UNLIMITED)
  if held() or epoch ~= epoch_now() then return {S.OK, 0} end
  local field = 'grant:' .. scope .. ':' .. p
  local taken = math.min(amount, tonumber(redis.call('HGET', Q, field)) or 0)
  if taken > 0 then redis.call('HINCRBY', Q, field, -taken) end
  return {S.OK, taken}
elseif op == 'cap' then
  local scope = arg_scope(ARGV[FIRST_ARG + 2])
  local raw = ARGV[FIRST_ARG + 3]
  if raw == '' then
    local removed = 0
    local fields = redis.call('HKEYS', Q)
    local prefix = 'grant:' .. scope .. ':'
    for _, f in ipairs(fields) do
      if string.sub(f, 1, #prefix) == prefix then
        redis.call('HDEL', Q, f)
        removed = removed + 1
      end
    end
    redis.call('HDEL', Q, 'cap:' .. scope)
    return {S.OK, removed}
  end
  redis.call('HSET', Q, 'cap:' .. scope, arg_int(raw, 'cap', 0, UNLIMITED))
  return {S.OK, 0}
elseif op == 'rate' then
  local queue = arg_name(ARGV[FIRST_ARG + 2], 'queue', ARG_RULES.name_length)
  local raw = ARGV[FIRST_ARG + 3]
  if raw == '' then
    redis.call('HDEL', Q, 'rate:' .. queue)
    return {S.OK}
  end
  local r, b = string.match(raw or '', '^([^:]+):([^:]+)$')
  arg_num(r, 'rate', 0, UNLIMITED)
  arg_int(b, 'rate burst', 1, UNLIMITED)
  redis.call('HSET', Q, 'rate:' .. queue, raw)
  return {S.OK}
elseif op == 'begin' then
  local hold = arg_int(ARGV[FIRST_ARG + 2], 'hold', 1, ARG_RULES.quota_hold_ms)
  local epoch = redis.call('HINCRBY', Q, 'epoch', 1)
  redis.call('HSET', Q, 'hold', C.now + hold)
  return {S.OK, epoch}
end
-- end: every partition's quota as its fence read it becomes its grant
local epoch = arg_int(ARGV[FIRST_ARG + 2], 'epoch', 0, UNLIMITED)
local count = arg_groups(ARGV, FIRST_ARG + 3, 3, 'quota')
local set = {}
for r = 0, count - 1 do
  local i = FIRST_ARG + 3 + r * 3
  local scope = arg_scope(ARGV[i])
  local p = arg_int(ARGV[i + 1], 'partition', 0, ARG_RULES.partition)
  local quota = arg_int(ARGV[i + 2], 'quota', 0, UNLIMITED)
  set[#set + 1] = 'grant:' .. scope .. ':' .. p
  set[#set + 1] = quota
end
if epoch ~= epoch_now() or not held() then return {S.OK, 0} end
if #set > 0 then redis.call('HSET', Q, unpack(set)) end
redis.call('HDEL', Q, 'hold')
return {S.OK, 1}
