--[[ reclaim.lua: requeue runs whose lease lapsed without a heartbeat (a lost consumer),
on the script's clock. Each goes back to its queue at its old score with its slots
freed (the time it held them is noted in the shares record as received); the attempt
count is unchanged (at-least-once delivery). A run whose
cancellation was asked while it ran is not requeued: it ends cancelled. Maintenance:
run on a timer, under the maintenance lock.

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG  batch size (1..ARG_RULES.maintenance_batch)
Reply
  {OK, count requeued, lease member requeued...}
]]
--@include prelude
--@include runs
--@include shares
--@include cancel_wins
--@include order

local tag = KEYS[1]
local batch = arg_int(ARGV[FIRST_ARG], 'batch', 1, ARG_RULES.maintenance_batch)
local X = state_new(C, tag)
local lapsed = redis.call('ZRANGEBYSCORE', X.leases, '-inf', X.now, 'LIMIT', 0, batch)
local reply = {S.OK, 0}
local received = {}
for _, member in ipairs(lapsed) do
  X.lease_del[#X.lease_del + 1] = member
  local mkey = run_key(tag, member)
  local queue, ck, state, score, slot_tenant, tenant, lease_start, cancel_requested,
    attempts, level = run_read_reclaim(mkey)
  if queue and state == 'running' then
    local env_id, run = split_member(member)
    local Q = run_queue(X, env_id, queue)
    local flow = flow_of(ck, slot_tenant)
    free_slots(X, Q, flow, run, slot_tenant)
    -- the lapsed lease is charged the time it held its slot, like a finished run
    local started = tonumber(lease_start)
    level = tonumber(level)
    if started then
      HOOK.charge(X, level_view(Q, level), flow, slot_tenant, X.now - started)
    end
    shares_received(received, Q.B, flow, started, X.now)
    if cancel_requested then
      end_cancelled(X, Q, member, run, {ck = ck, tenant = tenant,
        slot_tenant = slot_tenant, attempts = tonumber(attempts),
        started = started, error = ''})
    else
      redis.call('HSET', mkey, RUN_FIELD.state, 'queued', RUN_FIELD.slot_tenant, '')
      place_queued(X, level_queue(Q, level), flow_of(ck, tenant), run, tonumber(score))
      reply[2] = reply[2] + 1
      reply[#reply + 1] = member
    end
  end
end
if reply[2] > 0 then X.wake = true end
HOOK.finish(X)
state_flush(X)
shares_flush(received)
return reply
