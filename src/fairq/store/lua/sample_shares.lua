--[[ sample_shares.lua: one sample of who is backlogged, for every queue of the shard
with ready work: each backlogged flow's entitled share at this moment goes into the
queue's shares bucket of the script's clock (fairq/store/share_record.py). Maintenance:
run on a timer, under the maintenance lock.

Backlogged = has runs ready now: the keyless runs of the queue (their head is due) and
every flow in the queue's ck_index with a head due now, whether the order serves it or
holds it back at a cap or rate. A tenant's share is its weight (V:tw; a key serving as
its own tenant: else its key weight, B:ckweights; else 1) over the summed weights of the
queue's backlogged tenants; a flow's share is its tenant's times its key weight over the
summed key weights of the tenant's backlogged flows. The shares of a sample sum to 1.
With priority levels, only the highest level with ready work counts (strict priority:
the order serves nobody of a lower level while it has work that can start).

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG      most queues sampled (1..ARG_RULES.sample_queues; the ready ones with
                 the oldest heads first)
  FIRST_ARG + 1  most flows read per queue (1..ARG_RULES.sample_flows; oldest heads first)
Reply
  {OK, queues sampled, flows sampled}
]]
--@schema fair
--@include prelude
--@include shares

local tag = KEYS[1]
local max_queues = arg_int(ARGV[FIRST_ARG], 'queues', 1, ARG_RULES.sample_queues)
local max_flows = arg_int(ARGV[FIRST_ARG + 1], 'flows', 1, ARG_RULES.sample_flows)
local now = C.now

-- The ready queues (a queue has up to two heads-index members per priority level:
-- keyless and keyed), each at its highest level with ready work.
local function ready_queues()
  local members = redis.call('ZRANGEBYSCORE', shard_key(tag, 'heads'), '-inf', now,
    'LIMIT', 0, 2 * MAX_LEVELS * max_queues)
  local by_id, list = {}, {}
  for _, member in ipairs(members) do
    local kind, env_id, named = string.match(member, '^([^:]+):([^:]+:[^:]+:[^:]+):(.+)$')
    if kind then
      local queue, level = string.match(named, '^(.+)@(%d)$')
      queue, level = queue or named, tonumber(level) or BASE_LEVEL
      local id = env_id .. ':' .. queue
      local q = by_id[id]
      if q == nil and #list < max_queues then
        q = {env_id = env_id, name = queue, level = level, keyless = false, keyed = false}
        by_id[id], list[#list + 1] = q, q
      end
      if q and level < q.level then q.level, q.keyless, q.keyed = level, false, false end
      if q and level == q.level then
        if kind == KIND_QUEUE then q.keyless = true else q.keyed = true end
      end
    end
  end
  return list
end

-- The weights of a queue's backlogged tenants and of their keys.
local function weights_of(V, B, tenants, flows)
  local tw = call_list('HMGET', env_key(V, 'tenant_weights'), tenants)
  local keys, keyed = {}, {}
  for _, flow in ipairs(flows) do
    local key = flow_key(flow)
    if key ~= '' then
      keys[#keys + 1], keyed[#keyed + 1] = key, flow
    end
  end
  local kw = {}
  local raw = call_list('HMGET', queue_key(B, 'key_weights'), keys)
  for i, flow in ipairs(keyed) do kw[flow] = tonumber(raw[i]) or 1 end
  local tenant_w = {}
  for i, t in ipairs(tenants) do
    -- a key serving as its own tenant (the tenant's name is its flow's) falls back to
    -- its key weight
    tenant_w[t] = tonumber(tw[i]) or kw[t] or 1
  end
  return tenant_w, kw
end

-- The tenant a flow's runs belong to (the rule of include/runs.lua's default_tenant):
-- its named tenant, else its key, or for the keyless runs the queue ('/<queue>').
local function tenant_of(queue, flow)
  if flow == KEYLESS_FLOW then return '/' .. queue end
  return flow_tenant(flow) or flow
end

-- Each backlogged flow's share at this sample: field -> share (and one sample).
local function sample_queue(q, B, flows)
  local tenants, flows_of = {}, {}
  for _, flow in ipairs(flows) do
    local t = tenant_of(q.name, flow)
    if flows_of[t] == nil then
      flows_of[t] = {}
      tenants[#tenants + 1] = t
    end
    table.insert(flows_of[t], flow)
  end
  local tenant_w, kw = weights_of(env_prefix(tag, q.env_id), B, tenants, flows)
  local total = 0
  for _, t in ipairs(tenants) do total = total + tenant_w[t] end
  local adds = {[SHARES.samples_field] = 1}
  for _, t in ipairs(tenants) do
    local share, own = tenant_w[t] / total, flows_of[t]
    local key_total = 0
    -- a tenant of one flow (a key serving as its own tenant, the keyless runs) gives it
    -- its whole share
    local simple = #own == 1
    for _, flow in ipairs(own) do key_total = key_total + (simple and 1 or (kw[flow] or 1)) end
    for _, flow in ipairs(own) do
      local w = simple and 1 or (kw[flow] or 1)
      local name = SHARES.share_prefix .. flow
      adds[name] = (adds[name] or 0) + share * w / key_total
    end
  end
  return adds
end

local bucket = math.floor(now / SHARES.bucket_ms)
local queues, flows_sampled = 0, 0
for _, q in ipairs(ready_queues()) do
  local B = queue_prefix(tag, q.env_id, q.name)
  local flows = {}
  if q.keyless then flows[1] = KEYLESS_FLOW end
  if q.keyed then
    local ready = redis.call('ZRANGEBYSCORE', queue_key(level_name(B, q.level), 'ck_index'),
      '-inf', now,
      'LIMIT', 0, max_flows)
    for _, flow in ipairs(ready) do flows[#flows + 1] = flow end
  end
  if #flows > 0 then
    shares_bucket_add(shares_key(B, bucket), sample_queue(q, B, flows))
    queues, flows_sampled = queues + 1, flows_sampled + #flows
  end
end
return {S.OK, queues, flows_sampled}
