--[[ heartbeat.lua: extend the leases of runs a consumer is still working on, on the
script's clock (the server's), so a consumer whose own clock is off can neither lose
its leases nor take others'.

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG  lease (ms, 1..ARG_RULES.lease_ms)
  then 3 per run: lease member (org:project:env:run), lease token, progress to record
    ('' = none; 'fraction:message', at most ARG_RULES.progress_bytes bytes)
Reply
  one status per run: EXTENDED (new deadline now + lease), CANCEL_REQUESTED (extended,
  and someone asked to cancel the run: its worker should stop it), UNKNOWN_RUN,
  LEASE_LOST
]]
--@include prelude

local tag = KEYS[1]
local lease_ms = arg_int(ARGV[FIRST_ARG], 'lease_ms', 1, ARG_RULES.lease_ms)
local count = arg_groups(ARGV, FIRST_ARG + 1, 3, 'run')
local todo = {}
for r = 0, count - 1 do
  local i = FIRST_ARG + 1 + r * 3
  local progress = ARGV[i + 2]
  if #progress > ARG_RULES.progress_bytes then fail('progress is too long') end
  todo[#todo + 1] = {arg_member(ARGV[i]), arg_token(ARGV[i + 1]), progress}
end
local leases = shard_key(tag, 'leases')
local deadline = C.now + lease_ms
local statuses, extended = {}, {}
for _, t in ipairs(todo) do
  local mkey = run_key(tag, t[1])
  local state, lease_token, cancel_requested = run_read_heartbeat(mkey)
  if not state then
    statuses[#statuses + 1] = S.UNKNOWN_RUN
  elseif state ~= 'running' or not same_token(lease_token, t[2]) then
    statuses[#statuses + 1] = S.LEASE_LOST
  else
    if t[3] ~= '' then
      redis.call('HSET', mkey, RUN_FIELD.lease_deadline, deadline, RUN_FIELD.progress, t[3])
    else
      redis.call('HSET', mkey, RUN_FIELD.lease_deadline, deadline)
    end
    extended[#extended + 1] = deadline
    extended[#extended + 1] = t[1]
    statuses[#statuses + 1] = cancel_requested and S.CANCEL_REQUESTED or S.EXTENDED
  end
end
if #extended > 0 then call_chunked('ZADD', leases, extended, 'XX') end
return statuses
