-- serve_age.lua: serving one queue in the age order (oldest ready head first), and the
-- result every serve function reports into:
--   R.gated  ready work was left behind a limit (a freed slot should wake consumers)
--   R.wait   the earliest time (ms) something now held back becomes ready (or nil)
--@require state config runs claim gates heap levels

local function result_new()
  return {gated = false, wait = nil}
end

local function wait_until(R, at)
  if at ~= nil and (R.wait == nil or at < R.wait) then R.wait = at end
end

-- How many runs of `flow` may start now (budget, caps, rates); also reports why not.
-- Returns take, buckets; take <= 0 means held back (R updated).
local function flow_allowance(X, Q, flow, tenant, named, budget, R, borrowing)
  local total = total_room(X, Q)
  if total <= 0 then
    R.gated = true
    return 0, nil, 'total'
  end
  local room, bound = flow_room(X, Q, flow, tenant, named)
  if borrowing then room = math.huge end
  if room <= 0 then
    R.gated = true
    return 0, nil, bound
  end
  local buckets = flow_buckets(X, Q, flow, tenant)
  local rate, scope, next_at = rate_room(X, buckets)
  if rate <= 0 then
    wait_until(R, next_at)
    return 0, buckets, 'rate:' .. scope, next_at
  end
  -- the total cap binds this take: what is left of the queue is held back by it
  if total <= math.min(budget, room, rate) then R.gated = true end
  return math.min(budget, room, total, rate), buckets, nil
end

local function took(X, Q, flow, buckets, n)
  if buckets then rate_take(buckets, n) end
  flow_took(X, Q, flow, n)
  queue_took(X, Q, n)
end

-- Keyless runs of Q, oldest first. Returns how many were served.
local function serve_keyless(X, Q, budget, lease_ms, out, R)
  if Q.paused then return 0 end
  local take, buckets = flow_allowance(X, Q, KEYLESS_FLOW, default_tenant(Q.name, KEYLESS_FLOW),
    false, budget, R, false)
  if take <= 0 then return 0 end
  local got, head = claim(X, Q, KEYLESS_FLOW, take, lease_ms, out)
  took(X, Q, KEYLESS_FLOW, buckets, got)
  if head ~= nil and head > X.now then wait_until(R, head) end
  return got
end

-- Candidates compare by head, then name (only to break a tie of equal heads).
local function cand_less(a, b)
  if a.head ~= b.head then return a.head < b.head end
  return a.c.flow < b.c.flow
end

-- The next active candidate of the heap (its entries hold the head they were pushed with;
-- a candidate's head only changes while it is out of the heap).
local function cand_pop(h)
  while true do
    local e = heap_pop(h)
    if e == nil or e.c.active then return e end
  end
end

-- Serve a candidate list in age order: each candidate {flow, head, tenant, named,
-- served}; the oldest head next, at most `per_key` runs each. Returns served.
local function serve_candidates_age(X, Q, cands, budget, per_key, lease_ms, out, R, borrowing,
    capped)
  local h = heap_new(cand_less)
  for _, c in ipairs(cands) do
    if c.active then heap_push(h, {c = c, head = c.head}) end
  end
  local served = 0
  while served < budget do
    local best = cand_pop(h)
    if best == nil then break end
    local c = best.c
    local next_entry = cand_pop(h)
    local second = next_entry and next_entry.c
    if next_entry then heap_push(h, next_entry) end
    local take, buckets, why = flow_allowance(X, Q, c.flow, c.tenant, c.named,
      math.min(budget - served, per_key - c.served), R, borrowing)
    if take <= 0 then
      c.active = false
      if why == 'total' then break end
      if (why == 'key' or why == 'tenant') and capped then capped[#capped + 1] = c end
    else
      -- claim only what is older than the next candidate's head (the age order, in one call)
      local limit_score = second and second.head or nil
      local got, head = claim(X, Q, c.flow, take, lease_ms, out,
        limit_score, second and c.flow < second.flow)
      took(X, Q, c.flow, buckets, got)
      c.served = c.served + got
      served = served + got
      if got == 0 or head == nil or head > X.now or c.served >= per_key then
        c.active = false
        if head ~= nil and head > X.now then wait_until(R, head) end
      else
        c.head = head
        heap_push(h, {c = c, head = head})
      end
    end
  end
  return served
end

-- The keyed runs of Q in age order: the WINDOW x budget variants with the oldest ready
-- heads, each served at most max_per_key times (default 1) per call. Keys held back by
-- their cap are added to `lenders` when the queue lets capped keys borrow idle slots.
local function serve_ck_age(X, Q, budget, lease_ms, out, R, lenders)
  if Q.paused then return 0 end
  ck_index_flush(X)
  local entries = redis.call('ZRANGEBYSCORE', queue_key(Q.OB, 'ck_index'), '-inf', X.now,
    'WITHSCORES', 'LIMIT', 0, budget * Q.window)
  local cands = {}
  for i = 1, #entries, 2 do
    local flow = entries[i]
    local named = flow_tenant(flow)
    cands[#cands + 1] = {flow = flow, head = tonumber(entries[i + 1]), served = 0, active = true,
      tenant = named or flow, named = named ~= nil}
  end
  local per_key = Q.max_per_key or 1
  local capped = {}
  local served = serve_candidates_age(X, Q, cands, budget, per_key, lease_ms, out, R, false,
    capped)
  if served < budget then
    -- the call has room left: a consumer will wait, so tell it when a variant whose
    -- runs all lie in the future becomes ready
    local later = redis.call('ZRANGEBYSCORE', queue_key(Q.OB, 'ck_index'), '(' .. exact(X.now), '+inf',
      'WITHSCORES', 'LIMIT', 0, 1)
    if #later > 0 then wait_until(R, tonumber(later[2])) end
  end
  if Q.borrow and #capped > 0 then
    lenders[#lenders + 1] = {Q = Q, cands = capped, per_key = per_key}
  end
  return served
end

-- Borrowing: once every queue of the call had its turn and slots are still free, keys
-- held back only by their own (borrowing) cap may take them. Never preempts: lent
-- slots drain by themselves, and the next call serves contenders first.
local function serve_borrowers(X, lenders, budget, lease_ms, out, R)
  local served = 0
  for _, l in ipairs(lenders) do
    if served >= budget then break end
    for _, c in ipairs(l.cands) do c.active = true end
    served = served + serve_candidates_age(X, l.Q, l.cands, budget - served, l.per_key, lease_ms,
      out, R, true, nil)
  end
  return served
end

-- Serve the ready heads-index entries of one environment in their order (by priority
-- level, then oldest head first): age-order queues by age; with `serve_fair` (the fair
-- build), the fair queues of a level all together, the first time one of theirs comes up
-- (serve_fair(level, room) returns what it served). Then borrowing (after every level:
-- it takes only slots nobody else can use). Returns the runs served and whether fair
-- queues were.
local function serve_entries(X, by_name, ready, budget, lease_ms, out, R, serve_fair)
  local served, lenders, fair_done, fair_any = 0, {}, {}, false
  for _, entry in ipairs(ready) do
    if served >= budget then break end
    local Q = level_view(by_name[entry.queue], entry.level)
    if serve_fair ~= nil and Q.order == 'fair' then
      if not fair_done[entry.level] then
        fair_done[entry.level], fair_any = true, true
        served = served + serve_fair(entry.level, budget - served)
      end
    elseif entry.kind == KIND_QUEUE then
      served = served + serve_keyless(X, Q, budget - served, lease_ms, out, R)
    else
      served = served + serve_ck_age(X, Q, budget - served, lease_ms, out, R, lenders)
    end
  end
  if served < budget and #lenders > 0 then
    served = served + serve_borrowers(X, lenders, budget - served, lease_ms, out, R)
  end
  return served, fair_any
end
