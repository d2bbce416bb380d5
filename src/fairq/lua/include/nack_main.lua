-- nack_main.lua: body of nack.lua / nack_vtime.lua (see their header).
local leases, master, mroot = KEYS[1], KEYS[2], KEYS[3]
local member, delivery = ARGV[FIRST_ARG], ARGV[FIRST_ARG + 1]
local retry_at = tonumber(ARGV[FIRST_ARG + 2])
local increment = tonumber(ARGV[FIRST_ARG + 3])
local max_attempts = tonumber(ARGV[FIRST_ARG + 4])
local mkey = mroot .. member
local f = redis.call('HMGET', mkey, 'id', 'e', 'q', 'b', 'v', 'k', 'st', 'd', 'a')
if not f[1] or f[7] ~= 'running' or f[8] ~= delivery then return {0, 0} end
local run, env_id, queue, B, V, ck = f[1], f[2], f[3], f[4], f[5], f[6]
local attempt = tonumber(f[9]) + increment
free_slots(B, V, ck, run)
redis.call('ZREM', leases, member)
if increment > 0 and attempt >= max_attempts then
  -- dead letter: the message hash is kept for inspection and redrive
  redis.call('HSET', mkey, 'a', attempt, 'st', 'dlq', 'l', NOW)
  redis.call('ZADD', V .. ':dlq', NOW, run)
  redis.call('PUBLISH', WAKE_CHANNEL, env_id)
  return {2, attempt}
end
redis.call('HSET', mkey, 'a', attempt, 'st', 'queued', 's', retry_at)
place_queued(B, ck, run, retry_at)
master_rebalance(master, B, env_id, queue, ck == '' and 'q' or 'ck')
hooks_finish(B)
redis.call('PUBLISH', WAKE_CHANNEL, env_id)
return {1, attempt}
