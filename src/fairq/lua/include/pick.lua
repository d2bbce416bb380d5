-- pick.lua: serve variants in order of a sort key, several times each if allowed.
-- A candidate is {ck = encoded key, key = primary sort value, tie = secondary,
-- served = 0, active = true}. The active candidate with the lowest (key, tie, ck)
-- is tried next, so with MAX_PER_KEY > 1 one call still serves in key order.
-- Hooks (all take the candidate):
--   admit(c)            may refuse a candidate not yet served (pass-1 window slots)
--   on_served(c)        after a run was claimed, before the variant is re-scored
--   on_head(c, head)    after a serve, with the variant's new head score (nil = drained)
-- A variant that is at its concurrency limit, or has nothing ready, is dropped
-- for the rest of the call without any change to its order state.
local function pick_next(cands)
  local best = nil
  for _, c in ipairs(cands) do
    if c.active and (best == nil or c.key < best.key
        or (c.key == best.key and (c.tie < best.tie
          or (c.tie == best.tie and c.ck < best.ck)))) then
      best = c
    end
  end
  return best
end

-- Returns the number of runs served.
local function serve_in_order(cands, budget, admit, on_served, on_head)
  local served_total = 0
  while served_total < budget do
    local c = pick_next(cands)
    if c == nil then break end
    c.attempted = true
    if c.served == 0 and not admit(c) then
      c.active = false
    elseif redis.call('SCARD', variant_inflight_key(B, c.ck)) >= variant_limit then
      c.active = false -- gated: no serve, no change
    else
      local got = claim(shard, B, V, env_id, queue, c.ck, 1, lease_ms, out)
      if got > 0 then
        c.served = c.served + got
        served_total = served_total + got
        on_served(c)
      end
      local head = ck_refresh(B, c.ck)
      if got > 0 then
        on_head(c, head)
        if head == nil or head > NOW or c.served >= MAX_PER_KEY then c.active = false end
      else
        c.active = false -- nothing ready (future head) or drained
      end
    end
  end
  return served_total
end
