-- heap.lua: a binary min-heap ordered by a `less` function, so the serving loops take
-- the best candidate in O(log n) instead of scanning every candidate per run. The
-- orders given are total (ties broken by names), so what comes out first never depends
-- on the heap's layout. Sifting holds the moving element aside and shifts the others
-- (one write per level, no math.floor call).

local function heap_new(less)
  return {n = 0, less = less}
end

local function heap_push(h, v)
  local n = h.n + 1
  h.n = n
  local less = h.less
  while n > 1 do
    local parent = (n - n % 2) / 2
    local above = h[parent]
    if not less(v, above) then break end
    h[n] = above
    n = parent
  end
  h[n] = v
end

-- Remove and return the least element (nil when empty).
local function heap_pop(h)
  local n = h.n
  if n == 0 then return nil end
  local top, last = h[1], h[n]
  h[n] = nil
  n = n - 1
  h.n = n
  if n == 0 then return top end
  local less, i = h.less, 1
  while true do
    local c = 2 * i
    if c > n then break end
    local child = h[c]
    if c < n then
      local right = h[c + 1]
      if less(right, child) then c, child = c + 1, right end
    end
    if not less(child, last) then break end
    h[i] = child
    i = c
  end
  h[i] = last
  return top
end
