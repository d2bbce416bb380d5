-- redrive_main.lua: body of redrive.lua / redrive_vtime.lua (see their header).
local V, master, mroot = KEYS[1], KEYS[2], KEYS[3]
local env_id, run = ARGV[FIRST_ARG], ARGV[FIRST_ARG + 1]
local score = tonumber(ARGV[FIRST_ARG + 2])
local mkey = mroot .. env_id .. ':' .. run
local f = redis.call('HMGET', mkey, 'q', 'b', 'k', 'st')
if f[4] ~= 'dlq' then return 0 end
redis.call('ZREM', V .. ':dlq', run)
local queue, B, ck = f[1], f[2], f[3]
redis.call('HSET', mkey, 'a', 0, 'st', 'queued', 's', score)
place_queued(B, ck, run, score)
master_rebalance(master, B, env_id, queue, ck == '' and 'q' or 'ck')
hooks_finish(B)
redis.call('PUBLISH', WAKE_CHANNEL, env_id)
return 1
