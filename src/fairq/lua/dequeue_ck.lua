--[[ dequeue_ck.lua: lease runs across the concurrency-key variants of one base queue,
in age order (oldest head first).

Looks at the WINDOW_MULTIPLIER x n variants with the oldest ready heads (ckindex) and
serves each at most MAX_PER_KEY times per call, always the oldest head next. Each
variant is gated on its own slots: min(queue limit, env limit).

KEYS
  1 B base-queue prefix   2 V env prefix   3 T:master   4 T:leases   5 T:ttl
  6 T:expired             7 T:m: (message-key prefix)
ARGV
  1..13 context   14 env id   15 queue   16 max_count   17 lease (ms)
Reply
  flat list, 7 fields per leased run: run id, payload, encoded ck, attempt, delivery,
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
if n > 0 then
  local window = redis.call('ZRANGEBYSCORE', B .. ':ckindex', '-inf', NOW, 'WITHSCORES',
    'LIMIT', 0, n * WINDOW_MULTIPLIER)
  local cands = {}
  for j = 1, #window, 2 do
    cands[#cands + 1] = { ck = window[j], key = tonumber(window[j + 1]), tie = 0,
      served = 0, active = true }
  end
--@include pick
  serve_in_order(cands, n,
    function(c) return true end,
    function(c) end,
    function(c, head) if head then c.key = head end end)
end
master_rebalance(master, B, env_id, queue, 'ck')
return flatten(out)
