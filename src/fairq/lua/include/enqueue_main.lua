-- enqueue_main.lua: body of enqueue.lua / enqueue_vtime.lua (see their header).
local B = KEYS[1]
local V = KEYS[2]
local master = KEYS[3]
local ttl_index = KEYS[4]
local env_index = KEYS[5]
local mroot = KEYS[6]
local env_id = ARGV[FIRST_ARG]
local queue = ARGV[FIRST_ARG + 1]
local FIELDS = 6

local max_size = tonumber(redis.call('HGET', B .. ':limits', 'max_size')
  or redis.call('HGET', V .. ':limits', 'max_queue_size') or DEFAULT_QUEUE_SIZE_LIMIT)
local size = nil -- computed on first need: keyless runs + runs across all variants

local statuses = {}
local touched_keyless, touched_ck, wake = false, false, false
local i = FIRST_ARG + 2
while i + FIELDS - 1 <= #ARGV do
  local run, ck, score = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local payload, ttl_deadline, enqueued_at = ARGV[i + 3], tonumber(ARGV[i + 4]), ARGV[i + 5]
  local member = env_id .. ':' .. run
  local mkey = mroot .. member
  local status
  if redis.call('EXISTS', mkey) == 1 then
    status = 0 -- idempotent: this run id is already queued, running or dead-lettered
  else
    if max_size > 0 and size == nil then
      size = redis.call('ZCARD', B .. ':queued') + ck_queued_value(B)
    end
    if max_size > 0 and size + 1 > max_size then
      status = -1
    else
      redis.call('HSET', mkey, 'id', run, 'e', env_id, 'q', queue, 'b', B, 'v', V, 'k', ck,
        'p', payload, 's', score, 't', enqueued_at, 'a', 0, 'd', 0, 'x', ttl_deadline,
        'st', 'queued')
      place_queued(B, ck, run, score)
      if ttl_deadline > 0 then redis.call('ZADD', ttl_index, ttl_deadline, member) end
      if size then size = size + 1 end
      if ck == '' then touched_keyless = true else touched_ck = true end
      wake = true -- also for delayed runs: a sleeping consumer recomputes its wake-up time
      status = 1
    end
  end
  statuses[#statuses + 1] = status
  i = i + FIELDS
end

if touched_keyless then master_rebalance(master, B, env_id, queue, 'q') end
if touched_ck then master_rebalance(master, B, env_id, queue, 'ck') end
if touched_keyless or touched_ck then
  redis.call('SADD', V .. ':queues', queue)
  redis.call('SADD', env_index, env_id)
end
hooks_finish(B)
if wake then redis.call('PUBLISH', WAKE_CHANNEL, env_id) end
statuses[#statuses + 1] = max_size
return statuses
