--[[ dequeue_variant.lua: lease up to max_count ready runs of one flow of one queue,
oldest first, whatever the queue's order: for reference models that choose the flow
themselves (the simulator's drr / stride / CoDel). The env gate and the flow's caps and
rate limits apply; the fair order's state is not advanced.

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG      env id
  FIRST_ARG + 1  queue
  FIRST_ARG + 2  encoded key ('' = the keyless runs)
  FIRST_ARG + 3  max_count (1..ARG_RULES.dequeue_count)
  FIRST_ARG + 4  lease (ms)
  FIRST_ARG + 5  encoded named tenant of the flow ('' or absent = none)
Reply
  {OK, wait (ms from now, -1 = none known), gated (0/1), deliveries} as dequeue.lua
]]
--@include prelude
--@include config
--@include claim
--@include gates
--@include serve_age

HOOK.flow_queued = function() end
HOOK.flow_drained = function() end
HOOK.slot_freed = function() end

local tag = KEYS[1]
local env_id = arg_env(ARGV[FIRST_ARG])
local queue = arg_name(ARGV[FIRST_ARG + 1], 'queue', ARG_RULES.name_length)
local ck = ARGV[FIRST_ARG + 2]
if ck ~= '' and not string.match(ck, '^[%w_%.%-%%]+$') then fail('bad encoded key') end
local max_count = arg_int(ARGV[FIRST_ARG + 3], 'max_count', 1, ARG_RULES.dequeue_count)
local lease_ms = arg_int(ARGV[FIRST_ARG + 4], 'lease_ms', 1, ARG_RULES.lease_ms)
local named = ARGV[FIRST_ARG + 5] or ''
if named ~= '' and not string.match(named, '^[%w_%.%-%%]+$') then fail('bad encoded tenant') end
local X = state_new(C, tag)
local V = env_prefix(tag, env_id)
local env, by_name = config_read(X, V, env_id, {queue})
local Q = by_name[queue]
local out = {}
local R = result_new()
local busy = redis.call('SCARD', env_key(V, 'inflight'))
local n = math.min(max_count, env.limit_burst - busy)
local flow = flow_of(ck, named)
if n > 0 and not Q.paused then
  -- the flow's named tenant (its cap, rate and slot count), else its default tenant
  local take, buckets = flow_allowance(X, Q, flow, default_tenant(Q.name, flow), named ~= '', n,
    R, false)
  if take > 0 then
    local got, head = claim(X, Q, flow, take, lease_ms, out)
    took(X, Q, flow, buckets, got)
    if head ~= nil and head > X.now then wait_until(R, head) end
  end
else
  R.gated = true
end
buckets_flush(X)
state_flush(X)
local wait = -1
if R.wait ~= nil then wait = math.max(0, R.wait - X.now) end
return {S.OK, wait, R.gated and 1 or 0, out}
