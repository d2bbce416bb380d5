--[[ release.lua: free the concurrency slots of leased runs without finishing them
(for example while a run waits on something external). The lease stays; a later
ack, nack or lease expiry frees nothing twice.

KEYS
  1 T:m: (message-key prefix)
ARGV
  1..13 context
  then per run: lease member (O:P:E:<run id>), delivery
Reply
  one status per run: 1 released, 0 held no slot, -1 lease lost
]]
--@include context
--@include keys
--@include counters
--@include hooks_age
--@include runs

local mroot = KEYS[1]
local statuses, freed = {}, false
for i = FIRST_ARG, #ARGV - 1, 2 do
  local member, delivery = ARGV[i], ARGV[i + 1]
  local f = redis.call('HMGET', mroot .. member, 'id', 'b', 'v', 'k', 'st', 'd')
  if not f[1] or f[5] ~= 'running' or f[6] ~= delivery then
    statuses[#statuses + 1] = -1
  else
    local removed = free_slots(f[2], f[3], f[4], f[1])
    statuses[#statuses + 1] = removed
    if removed == 1 then freed = true end
  end
end
if freed then redis.call('PUBLISH', WAKE_CHANNEL, 'release') end
return statuses
