--[[ audit.lua: record one admin action (who did what to which target, and when, on the
server's clock) in the environment's audit list, newest first, kept to the last
AUDIT.keep entries and for AUDIT.ttl_s after the last one.

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG      env id
  FIRST_ARG + 1  who (AUDIT.who_low..AUDIT.who_high bytes)
  FIRST_ARG + 2  action (a word, AUDIT.action_low..AUDIT.action_high bytes)
  FIRST_ARG + 3  target (AUDIT.target_low..AUDIT.target_high bytes)
  FIRST_ARG + 4  detail (AUDIT.detail_low..AUDIT.detail_high bytes)
Reply
  {OK, entries kept}
]]
--@include prelude

local function arg_text(value, name, low, high)
  if value == nil or #value < low or #value > high then
    fail(name .. ' must be ' .. low .. '..' .. high .. ' bytes')
  end
  return value
end

local tag = KEYS[1]
local env_id = arg_env(ARGV[FIRST_ARG])
local who = arg_text(ARGV[FIRST_ARG + 1], 'who', AUDIT.who_low, AUDIT.who_high)
local action = arg_text(ARGV[FIRST_ARG + 2], 'action', AUDIT.action_low, AUDIT.action_high)
if not string.match(action, '^[%w_%-]+$') then fail('action must be a word') end
local target = arg_text(ARGV[FIRST_ARG + 3], 'target', AUDIT.target_low, AUDIT.target_high)
local detail = arg_text(ARGV[FIRST_ARG + 4], 'detail', AUDIT.detail_low, AUDIT.detail_high)
local key = env_key(env_prefix(tag, env_id), 'audit')
local kept = redis.call('LPUSH', key, cjson.encode({
  at = C.now, who = who, action = action, target = target, detail = detail,
}))
if kept > AUDIT.keep then
  redis.call('LTRIM', key, 0, AUDIT.keep - 1)
  kept = AUDIT.keep
end
redis.call('EXPIRE', key, AUDIT.ttl_s)
return {S.OK, kept}
