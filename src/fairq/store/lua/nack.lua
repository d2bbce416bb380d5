--[[ nack.lua: give a leased run back: requeue it for a retry, or dead-letter it once its
attempt count reaches max_attempts (only when the attempt counts). Frees its slots, and notes what the attempt received (the shares
record).
A run whose cancellation was asked while it ran gets no further attempt: it ends
cancelled (outcome 'cancelled', the attempt's error kept with it).
Every argument is checked before anything is written.

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG      lease member (org:project:env:run)
  FIRST_ARG + 1  lease token
  FIRST_ARG + 2  retry at (ms, absolute; '' = now + delay)
  FIRST_ARG + 3  retry delay (ms)
  FIRST_ARG + 4  count the attempt (1 / 0)
  FIRST_ARG + 5  max attempts (1..ARG_RULES.attempts)
  FIRST_ARG + 6  the attempt's error (text, '' = none), kept with the run
  FIRST_ARG + 7  keep an outcome when it is dead-lettered (1 / 0: the run's queue, key,
                 tenant and attempts, the attempt's error and traceback, its lease start
                 and the script's clock)
  FIRST_ARG + 8  the attempt's traceback (text, '' = none), kept with the run
Reply
  {status, attempts}: REQUEUED, DEAD_LETTERED, CANCELLED, UNKNOWN_RUN, LEASE_LOST
]]
--@include prelude
--@include runs
--@include shares
--@include cancel_wins
--@include order

local tag = KEYS[1]
local member, env_id, run = arg_member(ARGV[FIRST_ARG])
local token = arg_token(ARGV[FIRST_ARG + 1])
local delay = arg_int(ARGV[FIRST_ARG + 3], 'retry delay', 0, MAX_TIME_MS)
local retry_at
if ARGV[FIRST_ARG + 2] == '' then
  retry_at = C.now + delay
else
  retry_at = arg_int(ARGV[FIRST_ARG + 2], 'retry_at_ms', 0, MAX_TIME_MS)
end
if retry_at > MAX_TIME_MS then fail('retry time out of range') end
local increment = arg_int(ARGV[FIRST_ARG + 4], 'increment', 0, 1)
local max_attempts = arg_int(ARGV[FIRST_ARG + 5], 'max_attempts', 1, ARG_RULES.attempts)
local error_text = ARGV[FIRST_ARG + 6] or ''
local keep_outcome = arg_int(ARGV[FIRST_ARG + 7] or '0', 'keep outcome', 0, 1) == 1
local traceback = ARGV[FIRST_ARG + 8] or ''

local X = state_new(C, tag)
local mkey = run_key(tag, member)
local queue, ck, state, lease_token, attempts, slot_tenant, tenant, lease_start,
  cancel_requested, level = run_read_nack(mkey)
if not queue then return {S.UNKNOWN_RUN, 0} end
if state ~= 'running' or not same_token(lease_token, token) then return {S.LEASE_LOST, 0} end
local Q = run_queue(X, env_id, queue)
local ta = slot_tenant
local attempt = tonumber(attempts) + increment
local flow = flow_of(ck, ta)
free_slots(X, Q, flow, run, ta)
X.lease_del[#X.lease_del + 1] = member
local started = tonumber(lease_start)
level = tonumber(level)
if started then HOOK.charge(X, level_view(Q, level), flow, ta, X.now - started) end
local received = {}
shares_received(received, Q.B, flow, started, X.now)
local status
if cancel_requested then
  end_cancelled(X, Q, member, run, {ck = ck, tenant = tenant, slot_tenant = ta,
    attempts = attempt, started = started, error = error_text})
  status = S.CANCELLED
elseif increment > 0 and attempt >= max_attempts then
  -- dead letter: the hash stays for inspection and redrive
  redis.call('HSET', mkey, RUN_FIELD.attempts, attempt, RUN_FIELD.state, 'dlq',
    RUN_FIELD.lease_deadline, X.now, RUN_FIELD.error, error_text,
    RUN_FIELD.traceback, traceback, RUN_FIELD.slot_tenant, '')
  redis.call('ZADD', env_key(Q.V, 'dlq'), X.now, run)
  if keep_outcome then
    write_outcome(X, member, {status = 'dead_lettered', queue = queue, key = ck, tenant = ta,
      attempts = attempt, error = error_text ~= '' and error_text or nil,
      traceback = traceback ~= '' and traceback or nil, started_at = started,
      finished_at = X.now})
  end
  recent_add(X, Q, run, 'dead_lettered', attempt, started, ck, ta)
  history_add(X, Q, 'dead_lettered', 1)
  status = S.DEAD_LETTERED
else
  redis.call('HSET', mkey, RUN_FIELD.attempts, attempt, RUN_FIELD.state, 'queued',
    RUN_FIELD.score, retry_at, RUN_FIELD.error, error_text,
    RUN_FIELD.traceback, traceback, RUN_FIELD.slot_tenant, '')
  place_queued(X, level_queue(Q, level), flow_of(ck, tenant), run, retry_at)
  if increment > 0 then history_add(X, Q, 'retried', 1) end
  status = S.REQUEUED
end
HOOK.finish(X)
state_flush(X)
shares_flush(received)
return {status, attempt}
