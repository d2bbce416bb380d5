--[[ release.lua: free the concurrency slots of leased runs without finishing them
(for example while a run waits on something external). The lease stays; a later ack,
nack or lease expiry frees nothing twice.

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  then 2 per run: lease member (org:project:env:run), lease token
Reply
  one status per run: RELEASED, NOT_HELD (it held no slot), UNKNOWN_RUN, LEASE_LOST
]]
--@include prelude
--@include runs
--@include order

local tag = KEYS[1]
local count = arg_groups(ARGV, FIRST_ARG, 2, 'run')
local todo = {}
for r = 0, count - 1 do
  local i = FIRST_ARG + r * 2
  local member, env_id, run = arg_member(ARGV[i])
  todo[#todo + 1] = {member, arg_token(ARGV[i + 1]), env_id, run}
end
local X = state_new(C, tag)
local statuses = {}
for _, t in ipairs(todo) do
  local mkey = run_key(tag, t[1])
  local queue, ck, state, lease_token, slot_tenant = run_read_release(mkey)
  if not queue then
    statuses[#statuses + 1] = S.UNKNOWN_RUN
  elseif state ~= 'running' or not same_token(lease_token, t[2]) then
    statuses[#statuses + 1] = S.LEASE_LOST
  else
    local removed = free_slots(X, run_queue(X, t[3], queue), flow_of(ck, slot_tenant), t[4],
      slot_tenant)
    if removed == 1 then redis.call('HSET', mkey, RUN_FIELD.slot_tenant, '') end
    statuses[#statuses + 1] = removed == 1 and S.RELEASED or S.NOT_HELD
  end
end
HOOK.finish(X)
state_flush(X)
return statuses
