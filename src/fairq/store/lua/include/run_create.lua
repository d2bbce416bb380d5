-- run_create.lua: what an enqueue writes of one run besides its place in the order: its
-- hash, created only if its id is free, and the texts of the reply. Defined once per
-- library (a function defined in a script's body is a new closure on every call).
--@require runs

-- A queue name (arg_name's rules): names already checked are kept (the checks cost two
-- C calls, the lookup none).
local QUEUES_CHECKED = memo_new(1024)

local function queue_checked(value)
  arg_name(value, 'queue', ARG_RULES.name_length)
  return true
end

local function arg_queue(value)
  if QUEUES_CHECKED.values[value] == nil then
    memo_get(QUEUES_CHECKED, value, queue_checked, value)
  end
  return value
end

-- An enqueue's names of its environment and queue, per shard tag, env id and queue
-- name, kept (concatenating makes a new string on every call): V (the env prefix),
-- config (the env's config key), B (the queue's prefix). At most ENQUEUE_NAMES_MAX,
-- then all forgotten at once.
local ENQUEUE_NAMES, ENQUEUE_NAMES_N, ENQUEUE_NAMES_MAX = {}, 0, 1024

local function enqueue_names(tag, env_id, queue)
  local of_tag = ENQUEUE_NAMES[tag]
  local of_env = of_tag and of_tag[env_id]
  local names = of_env and of_env[queue]
  if names then return names end
  if ENQUEUE_NAMES_N >= ENQUEUE_NAMES_MAX then ENQUEUE_NAMES, ENQUEUE_NAMES_N = {}, 0 end
  of_tag = ENQUEUE_NAMES[tag] or {}
  ENQUEUE_NAMES[tag] = of_tag
  of_env = of_tag[env_id] or {}
  of_tag[env_id] = of_env
  local V = env_prefix(tag, env_id)
  names = {V = V, config = env_key(V, 'config'), B = queue_prefix(tag, env_id, queue)}
  of_env[queue] = names
  ENQUEUE_NAMES_N = ENQUEUE_NAMES_N + 1
  return names
end

-- One run's argument of an enqueue: run id, encoded key, encoded tenant, its options
-- (one field, below), payload, separated by single spaces (the payload, last, is the
-- only one that may hold a space).
-- (A run id holds no ':': the pattern checks it, sparing a search of its own.)
local RUN_ARG_PATTERN = '^([^ :]+) ([^ ]*) ([^ ]*) ([^ ]*) (.*)$'
-- A run's options: available at, delay, head start, TTL, outcome policy, timeout, level,
-- trace context, separated by commas (the trace, last, is the only one that may hold one).
local RUN_OPTIONS_PATTERN = '^([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),(.*)$'

local function run_options_checked(text)
  local available_at, delay, credit, ttl, keep, timeout, level, trace =
    string.match(text, RUN_OPTIONS_PATTERN)
  if available_at == nil then fail('run options must be 8 fields separated by commas') end
  local o = {
    available_at = available_at ~= ''
      and arg_int(available_at, 'available_at_ms', 0, MAX_TIME_MS),
    delay = arg_int(delay, 'delay_ms', 0, MAX_TIME_MS),
    credit = arg_int(credit, 'head_start_ms', 0, MAX_TIME_MS),
    ttl = arg_int(ttl, 'ttl_ms', 0, MAX_TIME_MS),
    keep = arg_word(keep, 'outcome policy', ARG_RULES.outcome_policies),
    timeout = arg_int(timeout, 'timeout_ms', 0, MAX_TIME_MS),
    level = level ~= '' and arg_int(level, 'priority', 1, MAX_LEVELS),
    trace = trace,
  }
  if trace ~= '' and (#trace > ARG_RULES.trace_context_chars or string.find(trace, '[^!-~]')) then
    fail('bad trace context')
  end
  return o
end

-- A run's options, checked: {available_at (false: now + delay), delay, credit (the head
-- start), ttl, keep, timeout, level (false: the queue's default), trace}; kept per text
-- (a queue's runs mostly have the same options: the checks cost more than the lookup).
-- Read only.
local RUN_OPTIONS = memo_new(256)

local function run_options(text)
  return RUN_OPTIONS.values[text] or memo_get(RUN_OPTIONS, text, run_options_checked, text)
end

-- The fields of a new run's hash (the optional ones only when set, and those with a
-- default -- key, attempts, lease token: run_hash.py's `absent` -- only when not it), from its
-- slots runs[t + 1 ..] (enqueue.lua's list).
local function run_fields(runs, t, queue, now)
  local field = RUN_FIELD
  local tenant, keep, trace, ttl_deadline, level, timeout = runs[t + 3], runs[t + 4],
    runs[t + 5], runs[t + 9], runs[t + 10], runs[t + 11]
  local ck = runs[t + 2]
  local fields = {field.queue, queue, field.payload, runs[t + 6], field.score, runs[t + 8],
    field.enqueued_at, now, field.state, 'queued'}
  local n = 10
  if ck ~= '' then fields[n + 1], fields[n + 2], n = field.ck, ck, n + 2 end
  if tenant ~= '' then fields[n + 1], fields[n + 2], n = field.tenant, tenant, n + 2 end
  if ttl_deadline > 0 then
    fields[n + 1], fields[n + 2], n = field.ttl_deadline, ttl_deadline, n + 2
  end
  if keep ~= '' then fields[n + 1], fields[n + 2], n = field.outcome_policy, keep, n + 2 end
  if timeout > 0 then fields[n + 1], fields[n + 2], n = field.timeout, timeout, n + 2 end
  if trace ~= '' then fields[n + 1], fields[n + 2], n = field.trace, trace, n + 2 end
  if level ~= BASE_LEVEL then fields[n + 1], fields[n + 2], n = field.level, level, n + 2 end
  return fields, n
end

-- Create a hash of n fields (the field, value pairs ...) unless it exists (returns false
-- then). `free`: the caller checked already that it does not. Else one command where
-- the server has HSETEX (Valkey >= 9, Redis >= 8: FNX sets the fields only if none of
-- them exists, and every run hash holds its queue and state), or EXISTS then HSET (no
-- such command, or the user may not run it).
local function hash_create(key, free, n, ...)
  if not free then
    local done = redis.pcall('HSETEX', key, 'FNX', 'FIELDS', n, ...)
    if done == 1 then return true elseif done == 0 then return false end
    if redis.call('EXISTS', key) == 1 then return false end
  end
  redis.call('HSET', key, ...)
  return true
end

-- Create the hash of the run in runs[t + 1 ..] unless its id is taken (returns false
-- then). A run with none of the optional fields (the usual one) passes its fields as
-- they are (a list of them and its unpack cost more than the command's arguments).
local function create_run_hash(mkey, runs, t, queue, now, free)
  if runs[t + 3] == '' and runs[t + 4] == '' and runs[t + 5] == '' and runs[t + 9] == 0
      and runs[t + 10] == BASE_LEVEL and runs[t + 11] == 0 then
    local field, ck = RUN_FIELD, runs[t + 2]
    if ck == '' then
      return hash_create(mkey, free, 5, field.queue, queue, field.payload, runs[t + 6],
        field.score, runs[t + 8], field.enqueued_at, now, field.state, 'queued')
    end
    return hash_create(mkey, free, 6, field.queue, queue, field.ck, ck, field.payload,
      runs[t + 6], field.score, runs[t + 8], field.enqueued_at, now, field.state, 'queued')
  end
  local fields, n = run_fields(runs, t, queue, now)
  return hash_create(mkey, free, n / 2, unpack(fields, 1, n))
end

-- The text of a number of the reply (a number's text costs a formatting call; the few
-- values met are kept).
local REPLY_TEXTS = memo_new(64)

local function reply_text(n)
  return memo_get(REPLY_TEXTS, n, tostring, n)
end

-- The reply of a call of one run: 'OK <size limit> <status>' (kept per limit and status).
local REPLIES_ONE = memo_new(64)

local function reply_one_text(max_size, status)
  return reply_text(S.OK) .. ' ' .. reply_text(max_size) .. ' ' .. reply_text(status)
end

local function reply_one(max_size, status)
  local key = max_size * 64 + status
  return REPLIES_ONE.values[key] or memo_get(REPLIES_ONE, key, reply_one_text, max_size, status)
end

-- Why a run's argument did not match RUN_ARG_PATTERN.
local function bad_run_argument(arg)
  if string.match(arg, '^[^ :]+ ') then fail('a run must be 5 fields separated by spaces') end
  fail('run id is not a valid name')
end
