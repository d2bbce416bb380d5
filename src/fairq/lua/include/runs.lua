-- runs.lua: where a run lives, read from and written to its message hash.
-- Message hash fields: id run id, e env id, q queue, b base-queue prefix B,
-- v env prefix V, k encoded concurrency key ('' = none), p payload, s score (ms),
-- t enqueued at (ms), a attempt, d deliveries (the lease token), x TTL deadline
-- (ms, 0 = none), st state ('queued' | 'running' | 'dlq'), l lease deadline (ms).

-- Rebalance a queue's master-queue member from the head it stands for.
local function master_rebalance(master, B, env_id, queue, kind)
  local head
  if kind == 'ck' then
    head = redis.call('ZRANGE', B .. ':ckindex', 0, 0, 'WITHSCORES')
  else
    head = redis.call('ZRANGE', B .. ':queued', 0, 0, 'WITHSCORES')
  end
  local member = master_member(kind, env_id, queue)
  if #head == 0 then
    redis.call('ZREM', master, member)
  else
    redis.call('ZADD', master, head[2], member)
  end
end

-- Re-score a variant in the CK index from its head, or drop it when empty.
-- Returns the head score, or nil when the variant drained.
local function ck_refresh(B, ck)
  local head = redis.call('ZRANGE', variant_queued_key(B, ck), 0, 0, 'WITHSCORES')
  if #head == 0 then
    redis.call('ZREM', B .. ':ckindex', ck)
    variant_drained(B, ck)
    return nil
  end
  redis.call('ZADD', B .. ':ckindex', head[2], ck)
  return tonumber(head[2])
end

-- Put a run (whose hash already says where it belongs) into its queue at score.
-- Returns 1 if it was added.
local function place_queued(B, ck, run, score)
  if ck == '' then
    return redis.call('ZADD', B .. ':queued', score, run)
  end
  local added = ck_queue_add(B, ck, score, run)
  ck_refresh(B, ck)
  variant_filled(B, ck)
  return added
end

-- Free every slot a run holds (queue or variant, and env). Returns 1 if it held one.
local function free_slots(B, V, ck, run)
  local removed
  if ck == '' then
    removed = redis.call('SREM', B .. ':inflight', run)
  else
    removed = ck_slot_free(B, ck, run)
  end
  redis.call('SREM', V .. ':inflight', run)
  return removed
end

-- Env limit, env limit with burst, and the per-queue (per-variant) limit.
local function read_limits(B, V)
  local env = redis.call('HMGET', V .. ':limits', 'concurrency', 'burst_factor')
  local env_limit = tonumber(env[1] or DEFAULT_ENV_CONCURRENCY)
  local burst = tonumber(env[2] or DEFAULT_BURST_FACTOR)
  local queue_limit = tonumber(redis.call('HGET', B .. ':limits', 'concurrency') or UNLIMITED)
  return env_limit, math.floor(env_limit * burst), math.min(queue_limit, env_limit)
end
