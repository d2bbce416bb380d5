--[[ dequeue_ck_vtime.lua: lease runs across the concurrency-key variants of one base
queue in fair order: start-time fair queueing over B:vtime.

Same KEYS, ARGV and reply as dequeue_ck.lua.

Pass 1 (fair): the 2 x window lowest tags (window = n x WINDOW_MULTIPLIER), tried
lowest tag first; ties go to the variant whose head has waited longest. Each serve
advances the variant's tag by quantum / weight before the next pick, so the batch is
in SFQ order. A variant that is gated or has nothing ready does not spend a window
slot and keeps its tag (no service, no advance).
Pass 2 (fill + discovery, always runs): ready variants in age order that pass 1 did
not try are registered at the floor (cold start, mixed versions) and serve any room
left in the batch.
Floor: max(stored floor, lowest stored tag, lowest tag served); it never decreases.
]]
--@include context
--@include keys
--@include counters
--@include hooks_vtime
--@include runs
--@include serve
--@include dequeue_head

local out = {}
if n > 0 then
  local vt = B .. ':vtime'
  local window = n * WINDOW_MULTIPLIER
  local stored_floor = vt_floor(B)
  local floor = stored_floor
  local min_served_tag = nil

  -- Pass 1 candidates: the lowest tags, clamped to the (read-repaired) floor.
  local ranked = redis.call('ZRANGE', vt, 0, 2 * window - 1, 'WITHSCORES')
  if #ranked > 0 and tonumber(ranked[2]) > floor then floor = tonumber(ranked[2]) end
  local cands, names, has_tie = {}, {}, false
  for j = 1, #ranked, 2 do
    local tag = math.max(tonumber(ranked[j + 1]), floor)
    if #cands > 0 and cands[#cands].key == tag then has_tie = true end
    cands[#cands + 1] = { ck = ranked[j], key = tag, tie = 0, weight = 1, served = 0,
      active = true }
    names[#names + 1] = ranked[j]
  end
  if #names > 0 then
    local weights = redis.call('HMGET', B .. ':ckweights', unpack(names))
    for j, c in ipairs(cands) do c.weight = tonumber(weights[j]) or 1 end
    if has_tie then
      -- equal tags: the variant whose head has waited longest goes first
      local heads = redis.call('ZMSCORE', B .. ':ckindex', unpack(names))
      for j, c in ipairs(cands) do c.tie = tonumber(heads[j]) or math.huge end
    end
  end

--@include pick
  local slots = 0
  local function advance(c)
    if c.served == 1 then slots = slots + 1 end
    if min_served_tag == nil or c.key < min_served_tag then min_served_tag = c.key end
    c.key = c.key + VT_QUANTUM / c.weight
    redis.call('ZADD', vt, c.key, c.ck)
  end
  local served = serve_in_order(cands, n,
    function(c) return slots < window end,
    advance,
    function(c, head) end)

  -- Pass 2: age order over ready variants pass 1 did not try.
  local attempted = {}
  for _, c in ipairs(cands) do if c.attempted then attempted[c.ck] = true end end
  local aged = redis.call('ZRANGEBYSCORE', B .. ':ckindex', '-inf', NOW, 'WITHSCORES',
    'LIMIT', 0, math.max(window, 3 * n))
  local fill, register = {}, {}
  for j = 1, #aged, 2 do
    if not attempted[aged[j]] then
      fill[#fill + 1] = { ck = aged[j], key = tonumber(aged[j + 1]), tie = 0, served = 0,
        active = true }
      register[#register + 1] = floor
      register[#register + 1] = aged[j]
    end
  end
  if #register > 0 then
    redis.call('ZADD', vt, 'NX', unpack(register))
  end
  if served < n and #fill > 0 then
    serve_in_order(fill, n - served,
      function(c) return true end,
      function(c)
        local tag = math.max(tonumber(redis.call('ZSCORE', vt, c.ck) or floor), floor)
        if min_served_tag == nil or tag < min_served_tag then min_served_tag = tag end
        local weight = tonumber(redis.call('HGET', B .. ':ckweights', c.ck)) or 1
        redis.call('ZADD', vt, tag + VT_QUANTUM / weight, c.ck)
      end,
      function(c, head) if head then c.key = head end end)
  end

  if min_served_tag ~= nil and min_served_tag > floor then floor = min_served_tag end
  if #out > 0 or floor > stored_floor then
    redis.call('SET', B .. ':vfloor', floor, 'EX', VT_STATE_TTL)
  end
  if #out > 0 or #register > 0 then redis.call('EXPIRE', vt, VT_STATE_TTL) end
end
hooks_finish(B)
master_rebalance(master, B, env_id, queue, 'ck')
return flatten(out)
