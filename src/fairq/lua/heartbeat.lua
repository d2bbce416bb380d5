--[[ heartbeat.lua: extend the leases of runs a consumer is still working on.

KEYS
  1 T:leases   2 T:m: (message-key prefix)
ARGV
  1..13 context   14 lease (ms)
  then per run: lease member (O:P:E:<run id>), delivery
Reply
  one status per run: 1 extended (new deadline NOW + lease), 0 lease lost
]]
--@include context

local leases, mroot = KEYS[1], KEYS[2]
local lease_ms = tonumber(ARGV[FIRST_ARG])
local deadline = NOW + lease_ms
local statuses = {}
for i = FIRST_ARG + 1, #ARGV - 1, 2 do
  local member, delivery = ARGV[i], ARGV[i + 1]
  local mkey = mroot .. member
  local f = redis.call('HMGET', mkey, 'st', 'd')
  if f[1] == 'running' and f[2] == delivery then
    redis.call('HSET', mkey, 'l', deadline)
    redis.call('ZADD', leases, 'XX', deadline, member)
    statuses[#statuses + 1] = 1
  else
    statuses[#statuses + 1] = 0
  end
end
return statuses
