-- heap.lua: a binary min-heap ordered by a `less` function, so the serving loops take
-- the best candidate in O(log n) instead of scanning every candidate per run.

local function heap_new(less)
  return {n = 0, less = less}
end

local function heap_push(h, v)
  local n = h.n + 1
  h.n = n
  h[n] = v
  local less = h.less
  while n > 1 do
    local parent = math.floor(n / 2)
    if not less(h[n], h[parent]) then break end
    h[n], h[parent] = h[parent], h[n]
    n = parent
  end
end

-- Remove and return the least element (nil when empty).
local function heap_pop(h)
  local n = h.n
  if n == 0 then return nil end
  local top = h[1]
  h[1] = h[n]
  h[n] = nil
  n = n - 1
  h.n = n
  local i, less = 1, h.less
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and less(h[l], h[m]) then m = l end
    if r <= n and less(h[r], h[m]) then m = r end
    if m == i then break end
    h[i], h[m] = h[m], h[i]
    i = m
  end
  return top
end
