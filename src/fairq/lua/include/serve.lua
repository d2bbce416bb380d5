-- serve.lua: the per-candidate serve body shared by every dequeue script.
-- shard = { leases = T:leases, ttl = T:ttl, expired = T:expired, mroot = T:m: }

-- Report a run whose TTL passed before it was delivered, and forget it.
local function expire_run(shard, mkey, member, env_id, queue, ck, run)
  redis.call('DEL', mkey)
  redis.call('ZREM', shard.ttl, member)
  redis.call('XADD', shard.expired, 'MAXLEN', '~', 10000, '*',
    'run', run, 'env', env_id, 'queue', queue, 'ck', ck, 'at', NOW)
end

-- Take run out of its (keyless or variant) queue. Returns 1 if it was there.
local function unqueue(B, ck, run)
  if ck == '' then return redis.call('ZREM', B .. ':queued', run) end
  return ck_queue_remove(B, ck, run)
end

-- Claim up to `limit` ready runs (score <= NOW, oldest score first) of one keyless
-- queue (ck = '') or one variant into their slots, leasing each until NOW + lease_ms.
-- Stale entries (hash gone) are dropped; TTL-expired runs are reported, never
-- delivered. Each delivered run appends one record to `out`:
--   {run id, payload, encoded ck, attempt, delivery, score, enqueued at}
-- Returns the number delivered.
local function claim(shard, B, V, env_id, queue, ck, limit, lease_ms, out)
  local qkey = ck == '' and (B .. ':queued') or variant_queued_key(B, ck)
  local delivered = 0
  for _ = 1, 8 do -- bounded: each round removes every run it looked at
    if delivered >= limit then break end
    local runs = redis.call('ZRANGEBYSCORE', qkey, '-inf', NOW, 'LIMIT', 0, limit - delivered)
    if #runs == 0 then break end
    for _, run in ipairs(runs) do
      local member = env_id .. ':' .. run
      local mkey = shard.mroot .. member
      local f = redis.call('HMGET', mkey, 'p', 'a', 's', 't', 'x')
      unqueue(B, ck, run)
      if not f[1] then
        -- stale: the run was finished elsewhere; nothing to deliver
      elseif tonumber(f[5]) > 0 and tonumber(f[5]) <= NOW then
        expire_run(shard, mkey, member, env_id, queue, ck, run)
      else
        local delivery = redis.call('HINCRBY', mkey, 'd', 1)
        local deadline = NOW + lease_ms
        redis.call('HSET', mkey, 'st', 'running', 'l', deadline, 'x', 0)
        if ck == '' then
          redis.call('SADD', B .. ':inflight', run)
        else
          ck_slot_take(B, ck, run)
        end
        redis.call('SADD', V .. ':inflight', run)
        redis.call('ZADD', shard.leases, deadline, member)
        if tonumber(f[5]) > 0 then redis.call('ZREM', shard.ttl, member) end
        out[#out + 1] = {run, f[1], ck, f[2], delivery, f[3], f[4]}
        delivered = delivered + 1
      end
    end
  end
  return delivered
end

-- Flatten delivered records into the reply.
local function flatten(out)
  local reply = {}
  for _, rec in ipairs(out) do
    for i = 1, 7 do reply[#reply + 1] = rec[i] end
  end
  return reply
end
