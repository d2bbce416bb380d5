--[[ redrive.lua: move a dead-lettered run back to its queue with attempt 0, ready now.
It starts clean: no cancel request and no progress of an earlier attempt come with it.

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG      env id
  FIRST_ARG + 1  run id
Reply
  REDRIVEN, NOT_IN_DLQ
]]
--@include prelude
--@include runs
--@include order

local tag = KEYS[1]
local env_id = arg_env(ARGV[FIRST_ARG])
local run = arg_name(ARGV[FIRST_ARG + 1], 'run id', ARG_RULES.name_length)
local X = state_new(C, tag)
local member = env_id .. ':' .. run
local mkey = run_key(tag, member)
local queue, ck, state, tenant, level = run_read_redrive(mkey)
if state ~= 'dlq' then return S.NOT_IN_DLQ end
local Q = run_queue(X, env_id, queue)
redis.call('ZREM', env_key(Q.V, 'dlq'), run)
redis.call('HSET', mkey, RUN_FIELD.attempts, 0, RUN_FIELD.state, 'queued',
  RUN_FIELD.score, X.now)
redis.call('HDEL', mkey, RUN_FIELD.cancel_requested, RUN_FIELD.progress)
place_queued(X, level_queue(Q, tonumber(level)), flow_of(ck, tenant), run, X.now)
X.wake = true
HOOK.finish(X)
state_flush(X)
return S.REDRIVEN
