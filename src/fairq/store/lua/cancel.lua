--[[ cancel.lua: cancel a run. A queued run is removed (never delivered) and a
dead-lettered one leaves the dead-letter queue; either gets the outcome 'cancelled'.
A running run is marked: its worker sees the request at its next heartbeat (and on the
wake channel at once), stops it and acks it as cancelled; if the run would get another
attempt instead (a nack, a lapsed lease), it ends cancelled then (cancel_wins.lua).

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG      env id
  FIRST_ARG + 1  run id
  FIRST_ARG + 2  only in state ('' or absent = any; 'queued', 'running' or 'dlq'): a run
                 in another state is left as it is (NOT_IN_STATE), so that a caller who
                 looked at a run acts on it only if it is still where it was seen
Reply
  CANCELLED, REMOVED_FROM_DLQ, CANCEL_REQUESTED, ALREADY_FINISHED (it has an outcome),
  UNKNOWN_RUN, NOT_IN_STATE
]]
--@include prelude
--@include runs
--@include order

local tag = KEYS[1]
local env_id = arg_env(ARGV[FIRST_ARG])
local run = arg_name(ARGV[FIRST_ARG + 1], 'run id', ARG_RULES.name_length)
local only = ARGV[FIRST_ARG + 2] or ''
if only ~= '' then arg_word(only, 'state', RUN_STATES) end
local X = state_new(C, tag)
local member = env_id .. ':' .. run
local mkey = run_key(tag, member)
local queue, ck, state, attempts, ttl_deadline, tenant, level = run_read_cancel(mkey)
if not state then
  if redis.call('EXISTS', outcome_key(tag, member)) == 1 then return S.ALREADY_FINISHED end
  return S.UNKNOWN_RUN
end
if only ~= '' and state ~= only then return S.NOT_IN_STATE end
local Q = run_queue(X, env_id, queue)
if state == 'running' then
  redis.call('HSET', mkey, RUN_FIELD.cancel_requested, X.now)
  redis.call('PUBLISH', C.wake_channel, 'cancel:' .. member)
  return S.CANCEL_REQUESTED
end
local outcome = {status = 'cancelled', queue = queue, key = ck,
  tenant = tenant, attempts = tonumber(attempts), finished_at = X.now}
if state == 'dlq' then
  redis.call('ZREM', env_key(Q.V, 'dlq'), run)
  redis.call('DEL', mkey)
  write_outcome(X, member, outcome)
  return S.REMOVED_FROM_DLQ
end
unqueue_and_refresh(X, level_view(Q, tonumber(level)), flow_of(ck, tenant), run)
if tonumber(ttl_deadline) > 0 then X.ttl_del[#X.ttl_del + 1] = member end
redis.call('DEL', mkey)
write_outcome(X, member, outcome)
recent_add(X, Q, run, 'cancelled', tonumber(attempts), nil, ck, '')
history_add(X, Q, 'cancelled', 1)
HOOK.finish(X)
state_flush(X)
return S.CANCELLED
