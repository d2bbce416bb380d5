-- runs.lua: where a run lives, and the bookkeeping every state change shares.
-- A run's hash is read with the generated run_read_<name> readers and written with the
-- generated RUN_FIELD names (its fields are listed in fairq/store/run_hash.py).
-- A queue context Q is {name, env_id, V, B, ...} (see config.lua). A flow is where a
-- run waits: flow_of(k, n) (the generated schema): a key scoped by the run's named
-- tenant ('N/K', or 'N/' for its keyless runs), a key of no named tenant ('K'), or
-- KEYLESS_FLOW for the keyless runs of no named tenant. Every flow but KEYLESS_FLOW is
-- a variant (its own queued set, listed in the queue's ck_index); the keyless flows
-- (KEYLESS_FLOW and 'N/') share the queue's keyless slots, the others have their own.
--@require state counters levels

-- The tenant a flow's runs belong to: its named tenant, else its key, or, for the
-- keyless runs of no named tenant, the queue itself ('/<queue>': no encoded name starts
-- with '/').
local function default_tenant(queue, flow)
  if flow == KEYLESS_FLOW then return '/' .. queue end
  return flow_tenant(flow) or flow
end

-- The queued set of a flow, and the set of the slots its runs hold.
local function flow_queued_key(Q, flow)
  if flow == KEYLESS_FLOW then return queue_key(Q.OB, 'queued') end
  return variant_key(Q.OB, flow, 'queued')
end

local function flow_slots_key(Q, flow)
  if flow_keyless(flow) then return queue_key(Q.B, 'inflight') end
  return variant_key(Q.B, flow, 'inflight')
end

local function touch(X, Q, kind)
  local id = Q.OB .. '|' .. kind
  local touched = X.touched
  if touched[id] == nil then touched[id] = {Q.OB, Q.env_id, Q.oname, kind} end
end

-- Put a heads-index member at `score` if it is new or older than its current head.
-- Returns 'new', 'lower' or nil.
local function heads_place(X, Q, kind, score)
  local member = heads_member(kind, Q.env_id, Q.oname)
  if not HOOK.asks_new_flow_head then
    -- (the hooks do not tell a new head from a lower one: one ZADD, LT = only lower an
    -- existing score, CH = count it, instead of ZSCORE and then maybe ZADD)
    if redis.call('ZADD', X.heads, 'LT', 'CH', score, member) == 1 then return 'lower' end
    return nil
  end
  local current = redis.call('ZSCORE', X.heads, member)
  -- (a score's text to a number by arithmetic: tonumber would be a C call)
  if current then current = current + 0 end
  if not current then
    redis.call('ZADD', X.heads, score, member)
    return 'new'
  elseif score < current then
    redis.call('ZADD', X.heads, score, member)
    return 'lower'
  end
  return nil
end

-- Head moves of flows in their queue's ck_index (score, or false when the flow drained),
-- written once per queue by ck_index_flush: a dequeue moves many flows' heads.
local function ck_index_set(X, B, ck, score)
  local pend = X.ckidx[B]
  if pend == nil then
    pend = {order = {}, score = {}}
    X.ckidx[B] = pend
  end
  if pend.score[ck] == nil then pend.order[#pend.order + 1] = ck end
  pend.score[ck] = score
end

-- Apply the pending head moves (before anything reads a ck_index again).
local function ck_index_flush(X)
  local pending = rawget(X, 'ckidx')
  if pending == nil then return end
  for B, pend in pairs(pending) do
    local add, rem = {}, {}
    for _, ck in ipairs(pend.order) do
      local score = pend.score[ck]
      if score then
        add[#add + 1] = score
        add[#add + 1] = ck
      else
        rem[#rem + 1] = ck
      end
    end
    if #add > 0 then call_chunked('ZADD', queue_key(B, 'ck_index'), add) end
    if #rem > 0 then call_chunked('ZREM', queue_key(B, 'ck_index'), rem) end
  end
  X.ckidx = nil
end

local function heads_rebalance(X, B, env_id, queue, kind)
  -- a claim of this script may already know the keyless queue's new head (false: empty)
  local known = nil
  if kind == KIND_QUEUE and X.head_known then known = X.head_known[B] end
  local score = known or nil
  if known == nil then
    local key = kind == KIND_CK and queue_key(B, 'ck_index') or queue_key(B, 'queued')
    score = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]
  end
  local member = heads_member(kind, env_id, queue)
  if score == nil then
    redis.call('ZREM', X.heads, member)
  else
    redis.call('ZADD', X.heads, score, member)
  end
end

-- A named tenant's flow became non-empty: flag the queue (so the fair order knows to
-- look for tenants owning several keys there).
local function mark_named(Q, flow)
  if not Q.named and flow_tenant(flow) then
    redis.call('HSET', env_key(Q.V, 'config'), config_field(Q.name, 'named'), 1)
    Q.named = true
  end
end

-- Put a run (whose hash already says where it belongs) into its flow at `score`.
-- Returns 1 if it was added.
local function place_queued(X, Q, flow, run, score)
  if flow == KEYLESS_FLOW then
    if X.head_known then X.head_known[Q.OB] = nil end
    local added = redis.call('ZADD', queue_key(Q.OB, 'queued'), score, run)
    local change = heads_place(X, Q, KIND_QUEUE, score)
    if change then
      X.wake = true
      HOOK.flow_queued(X, Q, flow, score, change == 'new')
    end
    return added
  end
  local added = redis.call('ZADD', variant_key(Q.OB, flow, 'queued'), score, run)
  if added == 1 then ck_queued_add(X, Q.B, Q.V, Q.env_id, Q.name, 1) end
  if state_peek(X, 'ckidx')[Q.OB] then ck_index_flush(X) end
  local index = queue_key(Q.OB, 'ck_index')
  local head = tonumber(redis.call('ZSCORE', index, flow))
  if head == nil or score < head then
    redis.call('ZADD', index, score, flow)
    if heads_place(X, Q, KIND_CK, score) then X.wake = true end
    if head == nil then mark_named(Q, flow) end
    HOOK.flow_queued(X, Q, flow, score, head == nil)
  end
  return added
end

-- Take a run out of its flow (it stays in its hash). Returns 1 if it was there.
local function unqueue(X, Q, flow, run)
  if flow == KEYLESS_FLOW then
    touch(X, Q, KIND_QUEUE)
    local removed = redis.call('ZREM', queue_key(Q.OB, 'queued'), run)
    if removed == 1 and redis.call('EXISTS', queue_key(Q.OB, 'queued')) == 0 then
      HOOK.flow_drained(X, Q, KEYLESS_FLOW)
    end
    return removed
  end
  local removed = redis.call('ZREM', variant_key(Q.OB, flow, 'queued'), run)
  if removed == 1 then ck_queued_add(X, Q.B, Q.V, Q.env_id, Q.name, -1) end
  return removed
end

-- Re-score a variant in the CK index from its head, or drop it when it drained.
-- Returns the head score, or nil when the variant drained.
local function variant_refresh(X, Q, flow)
  touch(X, Q, KIND_CK)
  local head = redis.call('ZRANGE', variant_key(Q.OB, flow, 'queued'), 0, 0, 'WITHSCORES')
  if #head == 0 then
    redis.call('ZREM', queue_key(Q.OB, 'ck_index'), flow)
    HOOK.flow_drained(X, Q, flow)
    return nil
  end
  redis.call('ZADD', queue_key(Q.OB, 'ck_index'), head[2], flow)
  return tonumber(head[2])
end

-- Take a queued run out of its flow and keep the indexes right (cancel, expiry).
local function unqueue_and_refresh(X, Q, flow, run)
  local removed = unqueue(X, Q, flow, run)
  if flow ~= KEYLESS_FLOW then variant_refresh(X, Q, flow) end
  return removed
end

-- Free every slot a running run of `flow` holds (its key's or the queue's keyless
-- ones, its tenant's, the environment's). `ta` is the named tenant it was counted under
-- ('' = none). Returns 1 if it held a slot.
local function free_slots(X, Q, flow, run, ta)
  local removed = redis.call('SREM', flow_slots_key(Q, flow), run)
  if removed == 1 then
    if not flow_keyless(flow) then ck_running_add(X, Q.B, Q.V, Q.env_id, Q.name, -1) end
    if ta ~= nil and ta ~= '' then tenant_running_add(X, Q.B, Q.V, Q.env_id, Q.name, ta, -1) end
    local frees = X.env_free[Q.V] or {}
    X.env_free[Q.V] = frees
    frees[#frees + 1] = run
    HOOK.slot_freed(X, Q, flow, ta)
  end
  return removed
end

-- free_slots for many runs at once (ack): one SREM per slot set and tenant, applied by
-- state_flush. Counters move by what each SREM really removed.
local function free_slots_later(X, Q, flow, run, ta)
  ta = ta or ''
  local id = Q.B .. '|' .. flow .. '|' .. ta
  local g = X.free_by[id]
  if g == nil then
    g = {Q = Q, flow = flow, ta = ta, runs = {}}
    X.free_by[id] = g
    X.free_groups[#X.free_groups + 1] = g
  end
  g.runs[#g.runs + 1] = run
end

local function slots_flush(X)
  local groups = rawget(X, 'free_groups')
  if groups == nil then return end
  for _, g in ipairs(groups) do
    local Q, flow = g.Q, g.flow
    local removed = call_chunked('SREM', flow_slots_key(Q, flow), g.runs)
    if removed > 0 then
      if not flow_keyless(flow) then ck_running_add(X, Q.B, Q.V, Q.env_id, Q.name, -removed) end
      if g.ta ~= '' then tenant_running_add(X, Q.B, Q.V, Q.env_id, Q.name, g.ta, -removed) end
      local frees = X.env_free[Q.V] or {}
      X.env_free[Q.V] = frees
      for _, run in ipairs(g.runs) do frees[#frees + 1] = run end
      HOOK.slot_freed(X, Q, flow, g.ta)
    end
  end
  X.free_groups, X.free_by = nil, nil
end

-- A queue context for a run read from its hash (scripts that start from a run): one
-- per queue and call, shared by the call's runs of that queue.
local function run_queue(X, env_id, queue)
  local of_env = X.runq[env_id]
  if of_env == nil then
    of_env = {}
    X.runq[env_id] = of_env
  end
  local Q = of_env[queue]
  if Q == nil then
    Q = level_base({name = queue, env_id = env_id, V = env_prefix(X.tag, env_id),
      B = queue_prefix(X.tag, env_id, queue)})
    of_env[queue] = Q
  end
  return Q
end

-- A run's outcome document (fairq/outcomes.py reads it): `outcome` holds its fields
-- (OUTCOME_FIELDS) by name, a missing one left out, and its result as JSON text (spliced
-- in as it is; 'null' when missing). The one writer of the document.
local function outcome_json(outcome)
  local head = {}
  for _, name in ipairs(OUTCOME_FIELDS) do
    if name ~= 'result' then head[name] = outcome[name] end
  end
  return string.sub(cjson.encode(head), 1, -2) .. ',"result":' .. (outcome.result or 'null') .. '}'
end

local function write_outcome(X, member, outcome)
  redis.call('SET', outcome_key(X.tag, member), outcome_json(outcome), 'EX', X.C.outcome_ttl)
end

-- What a worker sends of a run's outcome (fairq.outcomes.KeptOutcome.packed): the byte
-- lengths of the error and the traceback ('-' = none), a space after each, then the
-- error, the traceback and the result JSON. Checked; returns {error, traceback, result}.
local function kept_outcome(packed)
  local error_len, traceback_len, at = string.match(packed, '^([%d%-]+) ([%d%-]+) ()')
  if at == nil then fail('a kept outcome must start with two lengths') end
  local texts = {}
  for i, len in ipairs({error_len, traceback_len}) do
    if len ~= '-' then
      local n = tonumber(len)
      if n == nil or n ~= math.floor(n) or at + n - 1 > #packed then
        fail('a kept outcome is cut short')
      end
      texts[i] = string.sub(packed, at, at + n - 1)
      at = at + n
    end
  end
  if at > #packed then fail('a kept outcome needs its result') end
  return {error = texts[1], traceback = texts[2], result = string.sub(packed, at)}
end

-- A finished run for the queue's recent list (newest first, bounded): one line
-- (HISTORY.recent_line; fairq/store/readers.py reads it).
local function recent_add(X, Q, run, status, attempts, started, ck, ta)
  if (X.C.recent_runs or 0) <= 0 then return end
  local list = X.recent[Q.B]
  if list == nil then
    list = {}
    X.recent[Q.B] = list
  end
  -- (a number turned into text costs a sprintf: the call's clock is turned once)
  local now = X.now_text
  if now == nil then
    now = tostring(X.now)
    X.now_text = now
  end
  list[#list + 1] = HISTORY.recent_line(status, now, attempts, started and (X.now - started) or '',
    ck, ta or '', run)
end

-- Add to a counter of the queue's current history bucket (the call's bucket is one for
-- all its queues: its number is turned into text once).
local function history_add(X, Q, field, n)
  local bucket = X.bucket_text
  if bucket == nil then
    bucket = tostring(math.floor(X.now / HISTORY.bucket_ms))
    X.bucket_text = bucket
  end
  local h = X.history[Q.B]
  if h == nil then
    h = {key = history_key(Q.B, bucket), fields = {}}
    X.history[Q.B] = h
  end
  h.fields[field] = (h.fields[field] or 0) + n
end

-- Report a queued run whose TTL passed before it was delivered, and forget it.
local function expire_run(X, Q, ck, run, member, attempts)
  redis.call('DEL', run_key(X.tag, member))
  X.ttl_del[#X.ttl_del + 1] = member
  write_outcome(X, member, {
    status = 'expired', queue = Q.name, key = ck, attempts = attempts,
    finished_at = X.now,
  })
  recent_add(X, Q, run, 'expired', attempts, nil, ck, '')
  history_add(X, Q, 'expired', 1)
end

-- Write the history counters the call collected (history_add), one HMGET and one HSET
-- per bucket.
local function history_flush(X)
  local overflow_field, tenant_prefix = HISTORY.overflow_field, HISTORY.tenant_prefix
  local prefix_end = #tenant_prefix
  for _, h in pairs(state_peek(X, 'history')) do
    local names = {}
    for field in pairs(h.fields) do names[#names + 1] = field end
    names[#names + 1] = overflow_field
    names[#names + 1] = HISTORY.wide_field -- (read, then dropped from names)
    local old = redis.call('HMGET', h.key, unpack(names))
    local narrow = not old[#names]
    names[#names] = nil
    local fresh, new_tenant = true, false
    for i = 1, #names do
      if old[i] then
        fresh = false
      elseif i < #names and string.sub(names[i], 1, prefix_end) == tenant_prefix then
        new_tenant = true
      end
    end
    -- bounded: once a bucket holds HISTORY.max_fields fields, further tenants are
    -- counted together under the overflow field
    local length = (fresh and 0) or (new_tenant and redis.call('HLEN', h.key))
    local full = length and length >= HISTORY.max_fields
    local args, overflow = {}, 0
    if narrow and length and length + #names >= HISTORY.wide_at then
      args[1], args[2] = HISTORY.wide_field, HISTORY.wide_value -- (see history.py: WIDE_AT)
    end
    for i = 1, #names - 1 do
      local field, n = names[i], h.fields[names[i]]
      if full and not old[i] and string.sub(field, 1, prefix_end) == tenant_prefix then
        overflow = overflow + n
      else
        args[#args + 1] = field
        args[#args + 1] = (tonumber(old[i]) or 0) + n
      end
    end
    if overflow > 0 then
      args[#args + 1] = overflow_field
      args[#args + 1] = (tonumber(old[#names]) or 0) + overflow
    end
    redis.call('HSET', h.key, unpack(args))
    if fresh then redis.call('EXPIRE', h.key, HISTORY.ttl_s) end
  end
end

-- Apply what the script collected: slots, leases, TTL index, counters, heads index,
-- recent lists, history, and the wake-up hint. Call once, at the end.
local function state_flush(X)
  if not X.made then
    -- no state table was made (an enqueue behind older runs, a dequeue that found
    -- nothing): only the wake-up hint can be due
    if X.wake then redis.call('PUBLISH', X.C.wake_channel, 'work') end
    return
  end
  ck_index_flush(X)
  slots_flush(X)
  for V, runs in pairs(state_peek(X, 'env_take')) do
    call_chunked('SADD', env_key(V, 'inflight'), runs)
  end
  -- a consumer found ready work behind a limit (a gated flag): freed slots may let it
  -- go. The flags go in one DEL with the keys known to exist (X.deletes): more deleted
  -- than those means a flag was set.
  local dels, flags = rawget(X, 'deletes') or {}, 0
  for V, runs in pairs(state_peek(X, 'env_free')) do
    call_chunked('SREM', env_key(V, 'inflight'), runs)
    dels[#dels + 1] = env_key(V, 'gated')
    flags = flags + 1
  end
  if #dels > 0 and del_keys(dels) > #dels - flags then X.wake = true end
  X.deletes = nil
  local lease_add, lease_del = state_peek(X, 'lease_add'), state_peek(X, 'lease_del')
  if #lease_add > 0 then call_chunked('ZADD', X.leases, lease_add) end
  if #lease_del > 0 then call_chunked('ZREM', X.leases, lease_del) end
  local ttl_del = state_peek(X, 'ttl_del')
  if #ttl_del > 0 then call_chunked('ZREM', X.ttl, ttl_del) end
  counters_flush(X)
  for _, t in pairs(state_peek(X, 'touched')) do heads_rebalance(X, t[1], t[2], t[3], t[4]) end
  for B, entries in pairs(state_peek(X, 'recent')) do
    local length = call_chunked('LPUSH', queue_key(B, 'recent'), entries)
    local keep = X.C.recent_runs
    if length > keep + math.max(16, math.floor(keep / 10)) then
      redis.call('LTRIM', queue_key(B, 'recent'), 0, keep - 1)
    end
  end
  history_flush(X)
  if X.wake then redis.call('PUBLISH', X.C.wake_channel, 'work') end
end
