--[[ expire_ttl.lua: expire queued runs whose TTL passed before any delivery: remove
them and record each one's outcome ('expired'); never deliver them. Maintenance: run on
a timer, under the maintenance lock (a dequeue also expires a due run it meets).

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG  batch size (1..ARG_RULES.maintenance_batch)
Reply
  {OK, count expired, lease member...}
]]
--@include prelude
--@include runs
--@include order

local tag = KEYS[1]
local batch = arg_int(ARGV[FIRST_ARG], 'batch', 1, ARG_RULES.maintenance_batch)
local X = state_new(C, tag)
local due = redis.call('ZRANGEBYSCORE', X.ttl, '-inf', X.now, 'LIMIT', 0, batch)
local reply = {S.OK, 0}
for _, member in ipairs(due) do
  local mkey = run_key(tag, member)
  local queue, ck, state, attempts, tenant, level = run_read_expire_ttl(mkey)
  if queue and state == 'queued' then
    local env_id, run = split_member(member)
    local Q = run_queue(X, env_id, queue)
    unqueue_and_refresh(X, level_view(Q, tonumber(level)), flow_of(ck, tenant), run)
    expire_run(X, Q, ck, run, member, tonumber(attempts))
    reply[2] = reply[2] + 1
    reply[#reply + 1] = member
  else
    X.ttl_del[#X.ttl_del + 1] = member
  end
end
HOOK.finish(X)
state_flush(X)
return reply
