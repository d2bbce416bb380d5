--[[ seed_counters.lua: make sure a base queue's CK counters exist (seeding a missing
one from the truth) and return them. Readers call it only when a counter is missing
while variants hold runs, so a dashboard never shows 0 for a keyed backlog.

KEYS
  1 T  shard tag {prefix.N}
ARGV
  context: the context fields this build reads (the loader finds them), in order
  FIRST_ARG      env id
  FIRST_ARG + 1  queue
Reply
  {OK, queued across variants, running across variants}
]]
--@include prelude
--@include counters

local tag = KEYS[1]
local env_id = arg_env(ARGV[FIRST_ARG])
local queue = arg_name(ARGV[FIRST_ARG + 1], 'queue', ARG_RULES.name_length)
local X = state_new(C, tag)
local V = env_prefix(tag, env_id)
local B = queue_prefix(tag, env_id, queue)
local queued = ck_queued(X, B, V, env_id, queue)
local running = ck_running(X, B, V, env_id, queue)
return {S.OK, queued, running}
