--[[ ack.lua: finish leased runs of one shard: record their outcomes, free their slots,
forget them, and note what each run's flow received (the shares record); in one atomic step (an outcome is never written for a run whose ack was
refused).

A run is acked only while it is running under the caller's lease token; otherwise its
lease was lost (it lapsed and was requeued, or it was finished already).
Built twice: the fair-order build also returns what a run's cap held back to the order
and, with charge = duration, corrects the run's charge by its run time.

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  then 4 per run: lease member (org:project:env:run), lease token, the outcome to keep
    ('' = keep none; else what only the worker knows, packed: fairq.outcomes.KeptOutcome,
    read by kept_outcome; the script adds the run's queue, key, tenant and attempts,
    this one counted unless it completed, its lease start and the script's clock), status
    (one of ARG_RULES.finish_statuses: completed | failed | cancelled | timed_out)
Reply
  one status per run: ACKED, UNKNOWN_RUN, LEASE_LOST
]]
--@include prelude
--@include runs
--@include shares
--@include order

local FIELDS = 4
local tag = KEYS[1]
local count = arg_groups(ARGV, FIRST_ARG, FIELDS, 'run')
-- check every run before the first write (the loop below reads the same arguments, and
-- the members' parts split here)
local env_ids, run_ids, kept = {}, {}, {}
for i = FIRST_ARG, FIRST_ARG + (count - 1) * FIELDS, FIELDS do
  local _, env_id, run = arg_member(ARGV[i])
  env_ids[#env_ids + 1], run_ids[#run_ids + 1] = env_id, run
  arg_token(ARGV[i + 1])
  kept[#kept + 1] = ARGV[i + 2] ~= '' and kept_outcome(ARGV[i + 2])
  arg_word(ARGV[i + 3], 'status', ARG_RULES.finish_statuses)
end

local X = state_new(C, tag)
local statuses, gone, acked, received = {}, {}, {}, {}
for n = 1, count do
  local i = FIRST_ARG + (n - 1) * FIELDS
  local member, status = ARGV[i], ARGV[i + 3]
  local mkey = run_key(tag, member)
  local queue, ck, state, lease_token, attempts, lease_start, slot_tenant, level =
    run_read_ack(mkey)
  if not queue or acked[member] then -- (its hash is deleted at the end of this call)
    statuses[#statuses + 1] = S.UNKNOWN_RUN
  elseif state ~= 'running' or not same_token(lease_token, ARGV[i + 1]) then
    statuses[#statuses + 1] = S.LEASE_LOST
  else
    local env_id, run = env_ids[n], run_ids[n]
    local Q = run_queue(X, env_id, queue)
    local ta = slot_tenant
    local flow = flow_of(ck, ta)
    free_slots_later(X, Q, flow, run, ta)
    X.lease_del[#X.lease_del + 1] = member
    gone[#gone + 1] = mkey
    local started = tonumber(lease_start)
    local outcome = kept[n]
    if outcome then
      write_outcome(X, member, {status = status, queue = queue, key = ck, tenant = ta,
        attempts = tonumber(attempts) + (status == 'completed' and 0 or 1),
        error = outcome.error, traceback = outcome.traceback, started_at = started,
        finished_at = X.now, result = outcome.result})
    end
    recent_add(X, Q, run, status, attempts, started, ck, ta)
    history_add(X, Q, status, 1)
    if started then
      history_add(X, Q, 'run_ms', X.now - started)
      HOOK.charge(X, level_view(Q, tonumber(level)), flow, ta, X.now - started)
      shares_received(received, Q.B, flow, started, X.now)
    end
    acked[member] = true
    statuses[#statuses + 1] = S.ACKED
  end
end
-- the run hashes go with the flush's own DEL (one command)
for _, key in ipairs(gone) do X.deletes[#X.deletes + 1] = key end
HOOK.finish(X)
state_flush(X)
shares_flush(received)
return statuses
