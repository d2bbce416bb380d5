--[[ dequeue_ck_vtime.lua: lease runs across the concurrency-key variants of one base
queue in fair order: start-time fair queueing over B:vtime.

Same KEYS, ARGV and reply as dequeue_ck.lua.

Pass 1 (fair): the 2 x window lowest tags (window = n x WINDOW_MULTIPLIER), tried
lowest tag first (a tag below the floor counts as the floor); equal tags go to the
variant whose head has waited longest (its B:ckindex score; the name only breaks a
tie of equal heads). Each serve advances the variant's tag by quantum / weight before
the next pick, so the batch is in SFQ order. A variant that is gated or has nothing
ready keeps its tag (no service, no advance) and does not spend a window slot; a
variant whose head lies in the future is not even tried. A listed variant with no
queued runs (drained by an age-order consumer) is dropped from the order.
Pass 2 (fill + discovery, always runs): ready variants in age order that pass 1 did
not try; those not registered yet are registered at max(floor, parked tag) (cold
start, mixed versions), and any room left in the batch is served from them.
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
  local scan = 2 * window
  local stored_floor = vt_floor(B)
  local floor = stored_floor
  local min_served_tag = nil
  local vt_written = false

  -- Pass 1 candidates: the lowest tags, clamped to the (read-repaired) floor.
  local ranked = redis.call('ZRANGE', vt, 0, scan - 1, 'WITHSCORES')
  if #ranked > 0 and tonumber(ranked[2]) > floor then floor = tonumber(ranked[2]) end
  vt_floor_known(B, floor)
  local cands, names, listed = {}, {}, {}
  for j = 1, #ranked, 2 do
    names[#names + 1] = ranked[j]
    listed[ranked[j]] = true
  end
  if #names > 0 then
    local heads = redis.call('ZMSCORE', B .. ':ckindex', unpack(names))
    local weights = redis.call('HMGET', B .. ':ckweights', unpack(names))
    for j, ck in ipairs(names) do
      local head = tonumber(heads[j])
      local tag = tonumber(ranked[2 * j])
      if head == nil then
        variant_drained(B, ck, tag) -- no queued runs: leave the order (tag parked)
      elseif head <= NOW then
        cands[#cands + 1] = { ck = ck, key = math.max(tag, floor), tie = head,
          weight = tonumber(weights[j]) or 1, served = 0, active = true }
      end
    end
  end

--@include pick
  local slots = 0
  local function advance(c)
    if c.served == 1 then slots = slots + 1 end
    if min_served_tag == nil or c.key < min_served_tag then min_served_tag = c.key end
    c.key = c.key + VT_QUANTUM / c.weight
    vt_pending[B .. '|' .. c.ck] = c.key -- parked as is if this serve drained it
  end
  local function written(c, head)
    vt_pending[B .. '|' .. c.ck] = nil
    if head then
      redis.call('ZADD', vt, c.tag or c.key, c.ck)
      vt_written = true
    end
  end
  local served = serve_in_order(cands, n,
    function(c) return slots < window end,
    advance,
    function(c, head)
      written(c, head)
      if head then c.tie = head end -- its new head competes from now on
    end)

  -- Pass 2: age order over ready variants pass 1 did not try.
  local attempted = {}
  for _, c in ipairs(cands) do if c.attempted then attempted[c.ck] = true end end
  local complete = #ranked < 2 * scan -- pass 1 saw every registered variant
  local aged = redis.call('ZRANGEBYSCORE', B .. ':ckindex', '-inf', NOW, 'WITHSCORES',
    'LIMIT', 0, math.max(window, 3 * n))
  local fill, unknown = {}, {}
  for j = 1, #aged, 2 do
    local ck = aged[j]
    if not attempted[ck] and not listed[ck] then
      fill[#fill + 1] = { ck = ck, key = tonumber(aged[j + 1]), tie = 0, served = 0,
        active = true }
      unknown[#unknown + 1] = ck
    end
  end
  -- Tags of the fill variants; register those that have none.
  local tags = {}
  if #unknown > 0 then
    local stored = complete and {} or redis.call('ZMSCORE', vt, unpack(unknown))
    local fresh = {}
    for j, ck in ipairs(unknown) do
      local tag = tonumber(stored[j])
      if tag == nil then fresh[#fresh + 1] = ck else tags[ck] = tag end
    end
    if #fresh > 0 then
      local parked = redis.call('ZMSCORE', B .. ':vidle', unpack(fresh))
      local register, unpark = {}, {}
      for j, ck in ipairs(fresh) do
        local tag = floor
        if tonumber(parked[j]) ~= nil then
          tag = math.max(floor, tonumber(parked[j]))
          unpark[#unpark + 1] = ck
        end
        tags[ck] = tag
        register[#register + 1] = tag
        register[#register + 1] = ck
      end
      redis.call('ZADD', vt, 'NX', unpack(register))
      if #unpark > 0 then redis.call('ZREM', B .. ':vidle', unpack(unpark)) end
      vt_written = true
    end
  end
  if served < n and #fill > 0 then
    serve_in_order(fill, n - served,
      function(c) return true end,
      function(c)
        local tag = math.max(c.tag or tags[c.ck] or floor, floor)
        if min_served_tag == nil or tag < min_served_tag then min_served_tag = tag end
        local weight = tonumber(redis.call('HGET', B .. ':ckweights', c.ck)) or 1
        c.tag = tag + VT_QUANTUM / weight
        vt_pending[B .. '|' .. c.ck] = c.tag
      end,
      function(c, head)
        written(c, head)
        if head then c.key = head end -- age order within the fill
      end)
  end

  if min_served_tag ~= nil and min_served_tag > floor then floor = min_served_tag end
  vt_floor_known(B, floor)
  if #out > 0 or floor > stored_floor then
    redis.call('SET', B .. ':vfloor', floor, 'EX', VT_STATE_TTL)
  end
  if vt_written then redis.call('EXPIRE', vt, VT_STATE_TTL) end
end
hooks_finish(B)
master_rebalance(master, B, env_id, queue, 'ck')
return flatten(out)
