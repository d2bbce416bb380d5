--[[ dequeue_ck_vtime.lua: lease runs across the concurrency-key variants of one base
queue in fair order: start-time fair queueing over B:vtime.

Same KEYS, ARGV and reply as dequeue_ck.lua.

Candidates (scan = 2 x window, window = n x WINDOW_MULTIPLIER):
  * the scan lowest tags of B:vtime (a tag below the floor counts as the floor), and
  * the max(scan, 3 n) oldest ready heads of B:ckindex (discovery: a variant that has
    no tag yet, after a cold start or an age-order enqueue, is registered here at
    max(floor, parked tag); and among equal tags the longest-waiting heads are always
    seen, whatever their names).
A listed variant with no queued runs (drained by an age-order consumer) leaves the
order (its tag parked); one whose head lies in the future is not tried.
Pass 1 (fair): the candidates, lowest tag first; equal tags go to the variant whose
head has waited longest (the name only breaks a tie of equal heads). Each serve
advances the variant's tag by quantum / weight before the next pick, so the batch is
in SFQ order. A gated variant keeps its tag (no service, no advance) and does not
spend a window slot.
Pass 2 (fill): every ready candidate is already in pass 1, which stops only when the
batch is full or nothing it sees can be served; the age order cannot serve more.
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

  local ranked = redis.call('ZRANGE', vt, 0, scan - 1, 'WITHSCORES')
  if #ranked > 0 and tonumber(ranked[2]) > floor then floor = tonumber(ranked[2]) end
  vt_floor_known(B, floor)
  local complete = #ranked < 2 * scan -- we saw every registered variant
  local tag_of = {}
  for j = 1, #ranked, 2 do tag_of[ranked[j]] = tonumber(ranked[j + 1]) end

  -- Discovery: the oldest ready heads, and the tags of those not ranked above.
  local aged = redis.call('ZRANGEBYSCORE', B .. ':ckindex', '-inf', NOW, 'WITHSCORES',
    'LIMIT', 0, math.max(scan, 3 * n))
  local head_of, unknown = {}, {}
  for j = 1, #aged, 2 do
    head_of[aged[j]] = tonumber(aged[j + 1])
    if tag_of[aged[j]] == nil then unknown[#unknown + 1] = aged[j] end
  end
  if #unknown > 0 then
    local stored = complete and {} or redis.call('ZMSCORE', vt, unpack(unknown))
    local fresh = {}
    for j, ck in ipairs(unknown) do
      local tag = tonumber(stored[j])
      if tag == nil then fresh[#fresh + 1] = ck else tag_of[ck] = tag end
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
        tag_of[ck] = tag
        register[#register + 1] = tag
        register[#register + 1] = ck
      end
      redis.call('ZADD', vt, 'NX', unpack(register))
      if #unpark > 0 then redis.call('ZREM', B .. ':vidle', unpack(unpark)) end
      vt_written = true
    end
  end

  -- Heads of ranked variants the discovery scan did not see (future, drained, or
  -- younger than every scanned head).
  local order, unseen = {}, {}
  for j = 1, #aged, 2 do order[#order + 1] = aged[j] end
  for j = 1, #ranked, 2 do
    if head_of[ranked[j]] == nil then unseen[#unseen + 1] = ranked[j] end
  end
  if #unseen > 0 then
    local heads = redis.call('ZMSCORE', B .. ':ckindex', unpack(unseen))
    for j, ck in ipairs(unseen) do
      local head = tonumber(heads[j])
      if head == nil then
        variant_drained(B, ck, tag_of[ck]) -- no queued runs: leave the order
        tag_of[ck] = nil
      elseif head <= NOW then
        head_of[ck] = head
        order[#order + 1] = ck
      end
    end
  end

  local cands, names = {}, {}
  for _, ck in ipairs(order) do
    if tag_of[ck] ~= nil then
      cands[#cands + 1] = { ck = ck, key = math.max(tag_of[ck], floor), tie = head_of[ck],
        weight = 1, served = 0, active = true }
      names[#names + 1] = ck
    end
  end
  if #names > 0 then
    local weights = redis.call('HMGET', B .. ':ckweights', unpack(names))
    for j, c in ipairs(cands) do c.weight = tonumber(weights[j]) or 1 end
  end

--@include pick
  local slots = 0
  serve_in_order(cands, n,
    function(c) return slots < window end,
    function(c)
      if c.served == 1 then slots = slots + 1 end
      if min_served_tag == nil or c.key < min_served_tag then min_served_tag = c.key end
      c.key = c.key + VT_QUANTUM / c.weight
      vt_pending[B .. '|' .. c.ck] = c.key -- parked as is if this serve drains it
    end,
    function(c, head)
      vt_pending[B .. '|' .. c.ck] = nil
      if head then
        redis.call('ZADD', vt, c.key, c.ck)
        vt_written = true
        c.tie = head -- its new head competes from now on
      end
    end)

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
