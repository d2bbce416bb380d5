-- shares.lua: a queue's shares record (fairq/store/share_record.py): per 10-s bucket, the
-- backlog samples (sample_shares.lua) and what each flow received, counted when a run
-- finishes (ack, nack, reclaim) in the bucket of its lease start.

-- Add `adds` (field -> number) to one shares bucket. Fields already there add up; once
-- the bucket holds SHARES.max_fields fields, a new flow's fields go to the overflow
-- flow's. The TTL is set when the call added a field (a new bucket always does).
local function shares_bucket_add(key, adds)
  local names = {}
  for name in pairs(adds) do names[#names + 1] = name end
  local old = call_list('HMGET', key, names)
  local new = false
  for i = 1, #names do
    if not old[i] then new = true end
  end
  local full = new and redis.call('HLEN', key) >= SHARES.max_fields
  local args, over = {}, {}
  for i, name in ipairs(names) do
    local n = adds[name]
    if full and not old[i] and name ~= SHARES.samples_field then
      local prefix = string.sub(name, 1, 2)
      over[prefix] = (over[prefix] or 0) + n
    else
      args[#args + 1] = name
      args[#args + 1] = (tonumber(old[i]) or 0) + n
    end
  end
  local added = 0
  if #args > 0 then added = redis.call('HSET', key, unpack(args)) end
  for prefix, n in pairs(over) do
    redis.call('HINCRBYFLOAT', key, prefix .. SHARES.overflow_flow, n)
    added = added + 1
  end
  if added > 0 then redis.call('EXPIRE', key, SHARES.ttl_s) end
end

-- A run of `flow` leased at `started` (ms) finished at `now`: note one run and its run
-- time in the bucket of its lease start (a lease older than the longest window counts
-- in that window's first bucket). `SH` collects a call's notes for shares_flush.
local function shares_received(SH, B, flow, started, now)
  if started == nil then return end
  local first = math.floor(now / SHARES.bucket_ms) - SHARES.window_buckets + 1
  local key = shares_key(B, math.max(math.floor(started / SHARES.bucket_ms), first))
  local adds = SH[key]
  if adds == nil then
    adds = {}
    SH[key] = adds
  end
  local runs, ms = SHARES.runs_prefix .. flow, SHARES.run_ms_prefix .. flow
  adds[runs] = (adds[runs] or 0) + 1
  adds[ms] = (adds[ms] or 0) + math.max(0, now - started)
end

-- Write what shares_received collected (once, at the end of the call).
local function shares_flush(SH)
  for key, adds in pairs(SH) do shares_bucket_add(key, adds) end
end
