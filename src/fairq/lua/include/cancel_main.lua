-- cancel_main.lua: body of cancel.lua / cancel_vtime.lua (see their header).
local V, master, ttl_index, mroot = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local env_id, run = ARGV[FIRST_ARG], ARGV[FIRST_ARG + 1]
local member = env_id .. ':' .. run
local mkey = mroot .. member
local f = redis.call('HMGET', mkey, 'st', 'q', 'b', 'k')
local state, queue, B, ck = f[1], f[2], f[3], f[4]
if not state then return 0 end
if state == 'running' then return -1 end
if state == 'dlq' then
  redis.call('ZREM', V .. ':dlq', run)
  redis.call('DEL', mkey)
  return 2
end
unqueue(B, ck, run)
if ck ~= '' then ck_refresh(B, ck) end
redis.call('ZREM', ttl_index, member)
redis.call('DEL', mkey)
master_rebalance(master, B, env_id, queue, ck == '' and 'q' or 'ck')
hooks_finish(B)
return 1
