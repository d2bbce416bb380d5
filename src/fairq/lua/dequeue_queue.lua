--[[ dequeue_queue.lua: lease up to max_count ready keyless runs of one base queue.

Gates: env slots < floor(env limit x burst); queue slots < min(queue limit, env limit)
(queue limit 0 = paused). Oldest score first.

KEYS
  1 B base-queue prefix   2 V env prefix   3 T:master   4 T:leases   5 T:ttl
  6 T:expired             7 T:m: (message-key prefix)
ARGV
  1..13 context   14 env id   15 queue   16 max_count   17 lease (ms)
Reply
  flat list, 7 fields per leased run: run id, payload, '' (no ck), attempt, delivery,
  score (ms), enqueued at (ms)
]]
--@include context
--@include keys
--@include counters
--@include hooks_age
--@include runs
--@include serve
--@include dequeue_head

local out = {}
local queue_busy = redis.call('SCARD', B .. ':inflight')
local take = math.min(n, variant_limit - queue_busy)
if take > 0 then
  claim(shard, B, V, env_id, queue, '', take, lease_ms, out)
end
master_rebalance(master, B, env_id, queue, 'q')
return flatten(out)
