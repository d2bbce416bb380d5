--[[ enqueue.lua: add runs to one base queue (keyless, or into concurrency-key variants).

A run id that already exists (queued, running or dead-lettered) is a no-op. The queue
size limit (the queue's max_size, else the env's max_queue_size, else the default)
counts keyless runs plus runs queued across all variants and is checked per run,
atomically. Times are computed here, on the script's clock (the server's, unless a
logical clock is passed). Every run's arguments are checked before anything is written.
Built twice: the age-order build refuses a queue whose order is fair (NEEDS_FAIR,
nothing written); the fair-order build also registers new flows in the fair order.

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG      env id      FIRST_ARG + 1  queue
  FIRST_ARG + 2  schedule name ('' = none)   FIRST_ARG + 3  schedule tick (ms)
    with a schedule, the call enqueues only if this tick is later than the schedule's
    last claimed tick (then it becomes the last): exactly once however many callers
  then 12 per run: run id, encoded key ('' = none), encoded tenant ('' = none),
    available at (ms, absolute; '' = now + delay), delay (ms), head start (ms, a time
    credit: the run orders as if this much older), TTL (ms from now, 0 = none),
    payload (JSON), outcome policy ('' | 'keep'), timeout (ms, 0 = none), trace context
    ('' = none; printable ASCII, at most 512), priority level ('' = the queue's default,
    its middle level; else 1..the queue's priority_levels, 1 the highest)
Reply
  {status (OK | NEEDS_FAIR | TICK_TAKEN), size limit in force (0 = none), one status
   per run (ENQUEUED, DUPLICATE, REJECTED_SIZE)}
]]
--@include prelude
--@include config_enqueue
--@include runs
--@include order

local FIELDS = 12
local tag = KEYS[1]
local env_id = arg_env(ARGV[FIRST_ARG])
local queue = arg_name(ARGV[FIRST_ARG + 1], 'queue', ARG_RULES.name_length)
local schedule = ARGV[FIRST_ARG + 2]
local tick = arg_int(ARGV[FIRST_ARG + 3], 'schedule tick', 0, MAX_TIME_MS)
if schedule ~= '' then arg_name(schedule, 'schedule name', ARG_RULES.schedule_name_bytes) end
local count = arg_groups(ARGV, FIRST_ARG + 4, FIELDS, 'run')

-- check every run before the first write
local runs = {}
for r = 0, count - 1 do
  local i = FIRST_ARG + 4 + r * FIELDS
  local run = {
    id = arg_name(ARGV[i], 'run id', ARG_RULES.name_length),
    ck = ARGV[i + 1], tenant = ARGV[i + 2],
    delay = arg_int(ARGV[i + 4], 'delay_ms', 0, MAX_TIME_MS),
    credit = arg_int(ARGV[i + 5], 'head_start_ms', 0, MAX_TIME_MS),
    ttl = arg_int(ARGV[i + 6], 'ttl_ms', 0, MAX_TIME_MS),
    payload = ARGV[i + 7],
    keep = arg_word(ARGV[i + 8], 'outcome policy', ARG_RULES.outcome_policies),
    timeout = arg_int(ARGV[i + 9], 'timeout_ms', 0, MAX_TIME_MS),
    trace = ARGV[i + 10],
    level = ARGV[i + 11] ~= '' and arg_int(ARGV[i + 11], 'priority', 1, MAX_LEVELS) or nil,
  }
  if run.trace ~= ''
      and (#run.trace > ARG_RULES.trace_context_chars or string.find(run.trace, '[^!-~]')) then
    fail('bad trace context')
  end
  if run.ck ~= '' and not string.match(run.ck, '^[%w_%.%-%%]+$') then fail('bad encoded key') end
  if run.tenant ~= '' and not string.match(run.tenant, '^[%w_%.%-%%]+$') then
    fail('bad encoded tenant')
  end
  if ARGV[i + 3] == '' then
    run.available = C.now + run.delay
  else
    run.available = arg_int(ARGV[i + 3], 'available_at_ms', 0, MAX_TIME_MS)
  end
  run.score = run.available - run.credit
  run.ttl_deadline = run.ttl > 0 and (C.now + run.ttl) or 0
  if run.ttl_deadline > MAX_TIME_MS then fail('ttl_ms out of range') end
  runs[#runs + 1] = run
end

local function push_field(fields, name, value)
  local n = #fields
  fields[n + 1] = name
  fields[n + 2] = value
end

-- The run hash's fields (the optional ones only when set).
local function run_fields(run)
  local field = RUN_FIELD
  local fields = {field.queue, queue, field.ck, run.ck, field.payload, run.payload,
    field.score, run.score, field.enqueued_at, C.now, field.attempts, 0, field.lease_token, 0,
    field.state, 'queued'}
  -- the optional ones (a closure per run cost more than the fields)
  if run.tenant ~= '' then push_field(fields, field.tenant, run.tenant) end
  if run.ttl_deadline > 0 then push_field(fields, field.ttl_deadline, run.ttl_deadline) end
  if run.keep ~= '' then push_field(fields, field.outcome_policy, run.keep) end
  if run.timeout > 0 then push_field(fields, field.timeout, run.timeout) end
  if run.trace ~= '' then push_field(fields, field.trace, run.trace) end
  if run.level ~= BASE_LEVEL then push_field(fields, field.level, run.level) end
  return fields
end

-- Create a run hash unless the run id is taken (returns false then). `free`: the caller
-- checked already that it is not. Else one command where the server has HSETEX (Valkey
-- >= 9, Redis >= 8: FNX sets the fields only if none of them exists, and every run hash
-- holds its queue and state), or EXISTS then HSET (no such command, or the user may not run it).
local function create_hash(mkey, fields, free)
  if not free then
    local done = redis.pcall('HSETEX', mkey, 'FNX', 'FIELDS', #fields / 2, unpack(fields))
    if type(done) == 'number' then return done == 1 end
    if redis.call('EXISTS', mkey) == 1 then return false end
  end
  redis.call('HSET', mkey, unpack(fields))
  return true
end

local X = state_new(C, tag)
local V = env_prefix(tag, env_id)
local env, by_name = enqueue_config_read(X, V, env_id, queue, HOOK.enqueue_joins)
local Q = by_name[queue]
if HOOK.needs_fair(by_name) then return {S.NEEDS_FAIR, 0} end
-- each run's level, checked against the queue's levels (before the first write)
local default_level = math.floor((Q.priority_levels + 1) / 2)
for _, run in ipairs(runs) do
  run.level = run.level or default_level
  if run.level > Q.priority_levels then
    fail('priority ' .. run.level .. ' out of range: queue ' .. queue .. ' has '
      .. Q.priority_levels .. ' levels')
  end
end
if schedule ~= '' then
  local schedules = env_key(V, 'schedules')
  local last = tonumber(redis.call('HGET', schedules, schedule))
  if last ~= nil and last >= tick then return {S.TICK_TAKEN, 0} end
  redis.call('HSET', schedules, schedule, tick)
end

local max_size = Q.max_size or 0
local size = nil -- on first need: keyless runs + runs queued across all variants
local reply = {S.OK, max_size}
for _, run in ipairs(runs) do
  local member = env_id .. ':' .. run.id
  local mkey = run_key(tag, member)
  local status
  -- a run id already used (queued, running or dead-lettered) is a no-op: DUPLICATE, also
  -- when the queue is full (so with a size limit it is checked before the size)
  local checked = max_size > 0
  if checked and redis.call('EXISTS', mkey) == 1 then
    status = S.DUPLICATE
  elseif checked then
    if size == nil then
      size = keyless_queued(Q) + ck_queued(X, Q.B, V, env_id, queue)
    end
    if size + 1 > max_size then status = S.REJECTED_SIZE end
  end
  if status == nil and not create_hash(mkey, run_fields(run), checked) then
    status = S.DUPLICATE
  end
  if status == nil then
    place_queued(X, level_queue(Q, run.level), flow_of(run.ck, run.tenant), run.id, run.score)
    if Q.promote_ms and run.level > 1 then
      -- its wait counts from when it became ready, and not before it was queued
      redis.call('ZADD', queue_key(Q.B, 'aging'), math.max(run.available, C.now) + Q.promote_ms,
        run.id)
    end
    if run.ttl_deadline > 0 then redis.call('ZADD', X.ttl, run.ttl_deadline, member) end
    if size then size = size + 1 end
    status = S.ENQUEUED
  end
  reply[#reply + 1] = status
end
if X.wake then
  -- the queue's head changed (it was empty, or this run is older): it may be new here
  if redis.call('SADD', env_key(V, 'queues'), queue) == 1 then
    -- a new queue: no consumer pool is known to serve every queue any more
    redis.call('HDEL', env_key(V, 'config'), 'pool_all')
  end
  redis.call('SADD', shard_key(tag, 'envs'), env_id)
end
HOOK.finish(X)
state_flush(X)
return reply
