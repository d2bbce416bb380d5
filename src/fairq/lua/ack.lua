--[[ ack.lua: finish leased runs of one shard: free their slots and forget them.

A run is acked only while it is running under the caller's delivery (lease token);
otherwise its lease was lost (it lapsed and was requeued, or it was acked already).

KEYS
  1 T:leases   2 T:m: (message-key prefix)
ARGV
  1..13 context
  then per run: lease member (O:P:E:<run id>), delivery
Reply
  one status per run: 1 acked, 0 unknown run, -1 lease lost
]]
--@include context
--@include keys
--@include counters
--@include hooks_age
--@include runs

local leases, mroot = KEYS[1], KEYS[2]
local statuses, acked = {}, false
for i = FIRST_ARG, #ARGV - 1, 2 do
  local member, delivery = ARGV[i], ARGV[i + 1]
  local mkey = mroot .. member
  local f = redis.call('HMGET', mkey, 'id', 'b', 'v', 'k', 'st', 'd')
  if not f[1] then
    statuses[#statuses + 1] = 0
  elseif f[5] ~= 'running' or f[6] ~= delivery then
    statuses[#statuses + 1] = -1
  else
    free_slots(f[2], f[3], f[4], f[1])
    redis.call('ZREM', leases, member)
    redis.call('DEL', mkey)
    statuses[#statuses + 1] = 1
    acked = true
  end
end
-- freed slots may let gated runs go: hint waiting consumers
if acked then redis.call('PUBLISH', WAKE_CHANNEL, 'ack') end
return statuses
