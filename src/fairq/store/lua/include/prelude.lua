-- prelude.lua: argument checks. Every script checks all of its arguments with these
-- before its first write, so a refused argument (FQ2 -> fairq.errors.InvalidLimitError)
-- can never leave a change half applied. Their bounds (UNLIMITED, MAX_TIME_MS,
-- ARG_RULES) are generated from the Python side's (fairq/store/shared.py).

local function fail(what)
  error({err = 'FQ2 ' .. what})
end

-- A finite number in [low, high].
local function arg_num(value, name, low, high)
  local n = tonumber(value)
  if n == nil or n ~= n or n == math.huge or n == -math.huge
      or (low ~= nil and n < low) or (high ~= nil and n > high) then
    fail(name .. ' must be a number in ' .. tostring(low) .. '..' .. tostring(high))
  end
  return n
end

-- An integer in [low, high].
local function arg_int(value, name, low, high)
  -- '0', the commonest argument (no delay, no TTL ...), without tonumber
  if value == '0' and (low == nil or low <= 0) and (high == nil or high >= 0) then return 0 end
  local n = arg_num(value, name, low, high)
  if n ~= math.floor(n) then fail(name .. ' must be an integer') end
  return n
end

-- A string of 1..max_len bytes without ':' (a name fairq built or validated).
local function arg_name(value, name, max_len)
  if type(value) ~= 'string' or #value == 0 or #value > max_len or string.find(value, ':', 1, true) then
    fail(name .. ' is not a valid name')
  end
  return value
end

-- One of the listed words.
local function arg_word(value, name, words)
  for _, w in ipairs(words) do
    if value == w then return value end
  end
  fail(name .. ' must be one of ' .. table.concat(words, ', '))
end

-- A memo kept by the library across calls: values made once per key (a queue name, a
-- shard tag, an env id: few in practice), all forgotten at once when it holds `size`.
local function memo_new(size)
  return {values = {}, n = 0, size = size}
end

-- The value of `key`, made by make(a, b) on first need.
local function memo_get(m, key, make, a, b)
  local v = m.values[key]
  if v == nil then
    v = make(a, b)
    if m.n >= m.size then m.values, m.n = {}, 0 end
    m.values[key] = v
    m.n = m.n + 1
  end
  return v
end

-- An environment id: org:project:env. Ids already checked are kept (the pattern costs
-- more than the lookup).
local ENV_IDS_CHECKED = memo_new(1024)

local function env_id_checked(value)
  if type(value) ~= 'string' or not string.match(value, '^[^:]+:[^:]+:[^:]+$') then
    fail('env id must be org:project:env')
  end
  return true
end

local function arg_env(value)
  -- (the lookup spelt here: a call of memo_get costs more than it)
  if ENV_IDS_CHECKED.values[value] == nil then
    memo_get(ENV_IDS_CHECKED, value, env_id_checked, value)
  end
  return value
end

-- The env id and run id of a lease member (org:project:env:run).
local function split_member(member)
  local env_id, run = string.match(member, '^([^:]+:[^:]+:[^:]+):([^:]+)$')
  return env_id, run
end

-- A lease member, checked; returns it, its env id and its run id.
local function arg_member(value)
  if type(value) ~= 'string' then fail('run member must be env:run') end
  local env_id, run = split_member(value)
  if env_id == nil then fail('run member must be org:project:env:run') end
  return value, env_id, run
end

-- A lease token (an integer in 0..1e15), checked; returns its text. Plain digits (what
-- fairq sends) are taken without a number conversion; anything else is checked by arg_int.
local function arg_token(value)
  if type(value) == 'string' and #value <= ARG_RULES.lease_token_digits
      and string.find(value, '^%d+$') then
    return value
  end
  arg_int(value, 'lease token', 0, ARG_RULES.lease_token)
  return value
end

-- Whether a run hash's stored lease token is `token` (text): the texts compared first,
-- the numbers only when they differ (so '03' is 3).
local function same_token(stored, token)
  return stored == token or (stored ~= nil and tonumber(stored) == tonumber(token))
end

-- Groups of `size` arguments of `args` from `first` on, checked: returns their count.
local function arg_groups(args, first, size, what)
  local extra = #args - first + 1
  if extra < 0 or extra % size ~= 0 then
    fail(what .. ' arguments must come in groups of ' .. size)
  end
  return extra / size
end

-- A number as text, exactly as redis.call passes a number argument (%.17g): for scores
-- built into strings (a range bound, a stored tag) that must round-trip unchanged.
local function exact(x)
  return string.format('%.17g', x)
end

-- redis.call on many members at once, chunked so no call passes Lua's unpack limit.
local UNPACK_CHUNK = 4000
-- Arguments after `items` (e.g. 'XX') go before them in every call.
local function call_chunked(command, key, items, ...)
  local npre = select('#', ...)
  if npre <= 1 and #items <= UNPACK_CHUNK then -- the usual case: one call, no copy
    if #items == 0 then return 0 end
    local got
    if npre == 0 then
      got = redis.call(command, key, unpack(items))
    else
      got = redis.call(command, key, (...), unpack(items))
    end
    return type(got) == 'number' and got or 0
  end
  local pre = {...}
  local total = 0
  for i = 1, #items, UNPACK_CHUNK do
    local args = {}
    for j = 1, #pre do args[#args + 1] = pre[j] end
    for j = i, math.min(#items, i + UNPACK_CHUNK - 1) do args[#args + 1] = items[j] end
    local got = redis.call(command, key, unpack(args))
    if type(got) == 'number' then total = total + got end
  end
  return total
end

-- Like call_chunked for commands whose reply is a list (ZMSCORE, HMGET): concatenated.
local function call_list(command, key, items)
  if #items <= UNPACK_CHUNK then -- the usual case: one call, no copy
    if #items == 0 then return {} end
    return redis.call(command, key, unpack(items))
  end
  local out = {}
  for i = 1, #items, UNPACK_CHUNK do
    local args = {}
    for j = i, math.min(#items, i + UNPACK_CHUNK - 1) do args[#args + 1] = items[j] end
    local got = redis.call(command, key, unpack(args))
    for j = 1, #got do out[#out + 1] = got[j] end
  end
  return out
end

-- DEL many keys (chunked); returns how many existed.
local function del_keys(keys)
  if #keys <= UNPACK_CHUNK then
    if #keys == 0 then return 0 end
    return redis.call('DEL', unpack(keys))
  end
  local total = 0
  for i = 1, #keys, UNPACK_CHUNK do
    local chunk = {}
    for j = i, math.min(#keys, i + UNPACK_CHUNK - 1) do chunk[#chunk + 1] = keys[j] end
    total = total + redis.call('DEL', unpack(chunk))
  end
  return total
end
