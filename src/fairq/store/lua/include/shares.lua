-- shares.lua: a queue's shares record (fairq/store/share_record.py): per 10-s bucket, the
-- backlog samples (sample_shares.lua) and what each flow received, counted when a run
-- finishes (ack, nack, reclaim) in the bucket of its lease start.

-- Add `adds` (field -> number) to one shares bucket. Fields already there add up; once
-- the bucket holds SHARES.max_fields fields, a new flow's fields go to the overflow
-- flow's. The TTL is set when the call added a field (a new bucket always does).
local function shares_bucket_add(key, adds)
  local names = {}
  for name in pairs(adds) do names[#names + 1] = name end
  names[#names + 1] = SHARES.wide_field -- (read, then dropped from names)
  local old = call_list('HMGET', key, names)
  local narrow = not old[#names]
  names[#names] = nil
  local new = false
  for i = 1, #names do
    if not old[i] then new = true end
  end
  local length = new and redis.call('HLEN', key)
  local full = length and length >= SHARES.max_fields
  local args, over = {}, {}
  if narrow and length and length + #names >= SHARES.wide_at then
    args[1], args[2] = SHARES.wide_field, SHARES.wide_value -- (see history.py: WIDE_AT)
  end
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
-- in that window's first bucket). `SH` collects a call's notes for shares_flush: per
-- queue and bucket number, per flow {runs, ms} (names are built once, at the flush).
local function shares_received(SH, B, flow, started, now)
  if started == nil then return end
  local first = math.floor(now / SHARES.bucket_ms) - SHARES.window_buckets + 1
  local bucket = math.max(math.floor(started / SHARES.bucket_ms), first)
  local of_queue = SH[B]
  if of_queue == nil then
    of_queue = {}
    SH[B] = of_queue
  end
  local flows = of_queue[bucket]
  if flows == nil then
    flows = {}
    of_queue[bucket] = flows
  end
  local got = flows[flow]
  if got == nil then
    flows[flow] = {1, math.max(0, now - started)}
  else
    got[1], got[2] = got[1] + 1, got[2] + math.max(0, now - started)
  end
end

-- Write what shares_received collected (once, at the end of the call).
local function shares_flush(SH)
  local runs, ms = SHARES.runs_prefix, SHARES.run_ms_prefix
  for B, of_queue in pairs(SH) do
    for bucket, flows in pairs(of_queue) do
      local adds = {}
      for flow, got in pairs(flows) do
        adds[runs .. flow], adds[ms .. flow] = got[1], got[2]
      end
      shares_bucket_add(shares_key(B, bucket), adds)
    end
  end
end
