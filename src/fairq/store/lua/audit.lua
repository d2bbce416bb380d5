--[[ audit.lua: record one admin action (who did what to which target, and when, on the
server's clock) in the environment's audit list, newest first, kept to the last
AUDIT_KEEP entries and for AUDIT_TTL_S after the last one.

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG      env id
  FIRST_ARG + 1  who (1..200 chars)
  FIRST_ARG + 2  action (a word, 1..64 chars)
  FIRST_ARG + 3  target (1..500 chars)
  FIRST_ARG + 4  detail (0..2000 chars)
Reply
  {OK, entries kept}
]]
--@include prelude

local AUDIT_KEEP = 1000
local AUDIT_TTL_S = 30 * 86400

local function arg_text(value, name, low, high)
  if value == nil or #value < low or #value > high then
    fail(name .. ' must be ' .. low .. '..' .. high .. ' characters')
  end
  return value
end

local tag = KEYS[1]
local env_id = arg_env(ARGV[FIRST_ARG])
local who = arg_text(ARGV[FIRST_ARG + 1], 'who', 1, 200)
local action = arg_text(ARGV[FIRST_ARG + 2], 'action', 1, 64)
if not string.match(action, '^[%w_%-]+$') then fail('action must be a word') end
local target = arg_text(ARGV[FIRST_ARG + 3], 'target', 1, 500)
local detail = arg_text(ARGV[FIRST_ARG + 4], 'detail', 0, 2000)
local key = env_key(env_prefix(tag, env_id), 'audit')
local kept = redis.call('LPUSH', key, cjson.encode({
  at = C.now, who = who, action = action, target = target, detail = detail,
}))
if kept > AUDIT_KEEP then
  redis.call('LTRIM', key, 0, AUDIT_KEEP - 1)
  kept = AUDIT_KEEP
end
redis.call('EXPIRE', key, AUDIT_TTL_S)
return {S.OK, kept}
