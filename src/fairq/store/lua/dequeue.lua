--[[ dequeue.lua: lease ready runs of one environment, across the listed queues.

Priority levels first: the ready runs of level 1 (the highest) are served before any of
level 2, and so on; inside a level, the order below. A queue that promotes waiting runs
(max_wait_promote) moves the runs due for it up one level first.
Gates: env slots < floor(env limit x burst); then, per queue, the queue's total cap,
rate limit and pause; per key its cap (override, else min(queue limit, env limit)),
per tenant its cap, per key / tenant their rate limits. Keyless runs of a queue share
its limit. Order: queues in the age order are served oldest head first (keys too); the
queues in the fair order are served together in start-time fair queueing order over
(tenant, queue) pairs, then over a tenant's keys (see include/order_fair.lua).
Built twice: for the age order (it refuses a queue whose order is fair: NEEDS_FAIR,
nothing written) and for the fair order (it serves both).

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG      env id (org:project:env)
  FIRST_ARG + 1  max_count (1..1000)
  FIRST_ARG + 2  lease (ms, 1..86400000)
  FIRST_ARG + 3  which runs: '' (all), 'q' (keyless only), 'ck' (keyed only)
  FIRST_ARG + 4  charge the environment's place among its shard's (1 / 0: only for a
                 dequeue that chose this environment among others)
  FIRST_ARG + 5  the consumer's pool (0: a consumer of every queue; else the id of the set
                 of queues it serves, 1..2^48): in the fair order each pool has its own
                 tenant state, and the queues served here join this pool's
  FIRST_ARG + 6  queue names... (the candidates; at most 1000)
Reply
  {status, wait (ms from now until something held back becomes ready, -1 = nothing
   known), gated (1: ready work was left behind a limit), deliveries}
  deliveries: 12 fields per run: run id, queue, payload, encoded key ('' = none), named
  tenant ('' = none), attempt, lease token, score (ms), enqueued at (ms), timeout (ms,
  0 = none), outcome policy ('' | 'keep'), trace context ('' = none)
]]
--@include prelude
--@include config
--@include order
--@include order_serve
--@include aging

local tag = KEYS[1]
local env_id = arg_env(ARGV[FIRST_ARG])
local max_count = arg_int(ARGV[FIRST_ARG + 1], 'max_count', 1, ARG_RULES.dequeue_count)
local lease_ms = arg_int(ARGV[FIRST_ARG + 2], 'lease_ms', 1, ARG_RULES.lease_ms)
local kinds = arg_word(ARGV[FIRST_ARG + 3], 'kinds', {'', KIND_QUEUE, KIND_CK})
local charge_env = arg_int(ARGV[FIRST_ARG + 4], 'charge_env', 0, 1) == 1
local pool = arg_int(ARGV[FIRST_ARG + 5], 'pool', 0, 2 ^ 48)
local queues = {}
for i = FIRST_ARG + 6, #ARGV do
  queues[#queues + 1] = arg_name(ARGV[i], 'queue', ARG_RULES.name_length)
end
if #queues > ARG_RULES.dequeue_queues then
  fail('at most ' .. ARG_RULES.dequeue_queues .. ' queues per dequeue')
end

local X = state_new(C, tag)
X.charge_env = charge_env
local V = env_prefix(tag, env_id)
local env, by_name = config_read(X, V, env_id, queues)
if HOOK.needs_fair(by_name) then return {S.NEEDS_FAIR, -1, 0, {}} end
HOOK.use_pool(X, env, by_name, pool)
for _, q in ipairs(queues) do promote_waiting(X, by_name[q]) end

-- the candidates' heads-index entries (one per queue, kind and level with keys): ready
-- ones by level, then oldest first; the earliest future one
local members, meta = {}, {}
for _, q in ipairs(queues) do
  for _, level in ipairs(queue_levels(by_name[q])) do
    for _, kind in ipairs({KIND_QUEUE, KIND_CK}) do
      if kinds == '' or kinds == kind then
        members[#members + 1] = heads_member(kind, env_id, level_name(q, level))
        meta[#meta + 1] = {kind = kind, queue = q, level = level}
      end
    end
  end
end
local scores = call_list('ZMSCORE', X.heads, members)
local R = result_new()
local ready = {}
for i, m in ipairs(meta) do
  local score = tonumber(scores[i])
  if score ~= nil then
    if score <= X.now then
      m.score = score
      m.member = members[i]
      ready[#ready + 1] = m
    else
      wait_until(R, score)
    end
  end
end
table.sort(ready, function(a, b)
  if a.level ~= b.level then return a.level < b.level end
  if a.score ~= b.score then return a.score < b.score end
  return a.member < b.member
end)

local out = {}
if #ready > 0 then
  local busy = redis.call('SCARD', env_key(V, 'inflight'))
  local n = math.min(max_count, env.limit_burst - busy)
  if n <= 0 then
    R.gated = true
  else
    HOOK.serve(X, env, by_name, ready, n, lease_ms, out, R)
  end
end
buckets_flush(X)
HOOK.finish(X)
state_flush(X)
if R.gated then redis.call('SET', env_key(V, 'gated'), 1, 'EX', 60) end
local wait = -1
if R.wait ~= nil then wait = math.max(0, R.wait - X.now) end
return {S.OK, wait, R.gated and 1 or 0, out}
