-- reclaim_main.lua: body of reclaim.lua / reclaim_vtime.lua (see their header).
local leases, master, mroot = KEYS[1], KEYS[2], KEYS[3]
local batch = tonumber(ARGV[FIRST_ARG])
local lapsed = redis.call('ZRANGEBYSCORE', leases, '-inf', NOW, 'LIMIT', 0, batch)
local reply = {0}
local touched = {}
for _, member in ipairs(lapsed) do
  redis.call('ZREM', leases, member)
  local mkey = mroot .. member
  local f = redis.call('HMGET', mkey, 'id', 'e', 'q', 'b', 'v', 'k', 'st', 's')
  if f[1] and f[7] == 'running' then
    local run, env_id, queue, B, V, ck = f[1], f[2], f[3], f[4], f[5], f[6]
    free_slots(B, V, ck, run)
    redis.call('HSET', mkey, 'st', 'queued')
    place_queued(B, ck, run, tonumber(f[8]))
    touched[B .. '|' .. (ck == '' and 'q' or 'ck')] = {B, env_id, queue, ck == '' and 'q' or 'ck'}
    reply[1] = reply[1] + 1
    reply[#reply + 1] = member
  end
end
for _, t in pairs(touched) do
  master_rebalance(master, t[1], t[2], t[3], t[4])
  hooks_finish(t[1])
end
if reply[1] > 0 then redis.call('PUBLISH', WAKE_CHANNEL, 'reclaim') end
return reply
