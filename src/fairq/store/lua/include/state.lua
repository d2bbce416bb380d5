-- state.lua: the per-script state X every helper takes as its first parameter, and
-- HOOK, the table the order include (order_age.lua / order_fair.lua) fills with the
-- order-specific hooks. Helpers call HOOK.<name>(...) so that a helper written before
-- the order include can still reach it.

local HOOK = {}

-- The per-call tables of a script's state, each made on first use (a call touches few).
local STATE_TABLES = {
  -- counters.lua: known values, pending deltas and truth functions per counter key
  counter_value = true, counter_delta = true, counter_seed = true,
  -- tenant running counts (counters.lua), per B: seeded in this call (a tenant not in
  -- the hash then holds 0), values before this call, pending deltas, and the queue
  -- whose truth seeds the hash when it is missing at the flush
  tenant_running_seeded = true, tenant_running_base = true, tenant_running_delta = true,
  tenant_running_queue = true,
  -- runs.lua: queue contexts of runs read from their hashes (run_queue): env -> queue -> Q
  runq = true,
  -- runs.lua: slot and index changes applied once at the end (state_flush)
  env_take = true, env_free = true, lease_add = true, lease_del = true, ttl_del = true,
  free_groups = true, free_by = true,
  -- ck_index head moves not yet written: B -> {order, score}
  ckidx = true,
  -- keys to delete that exist (run hashes), deleted with the flush's gated flags
  deletes = true,
  recent = true, history = true,
  -- queues whose heads-index member must be re-scored: B|kind -> {B, env_id, queue, kind}
  touched = true,
}
local STATE_META = {
  __index = function(X, name)
    if STATE_TABLES[name] then
      local t = {}
      rawset(X, name, t)
      rawset(X, 'made', true) -- state_flush has something to look at
      return t
    end
  end,
}

-- What state_peek hands out for a table not made yet: empty, and not to be written
-- (state_new makes writing it an error: a library's load cannot set metatables).
local STATE_NONE = {}
local STATE_NONE_META = {
  __newindex = function() error('a table from state_peek is read-only') end,
}

-- A per-call table for reading only: the one made, else an empty one. (Reading it as
-- X.<name> would make it; a flush that visits every table would make them all.)
local function state_peek(X, name)
  return rawget(X, name) or STATE_NONE
end

-- The shard-wide keys every script uses, per shard tag.
local SHARD_COMMON = memo_new(1024)

local function shard_common(tag)
  return {shard_key(tag, 'heads'), shard_key(tag, 'leases'), shard_key(tag, 'ttl')}
end

local function state_new(C, tag)
  if getmetatable(STATE_NONE) == nil then setmetatable(STATE_NONE, STATE_NONE_META) end
  local common = memo_get(SHARD_COMMON, tag, shard_common, tag)
  return setmetatable({
    C = C,
    tag = tag,
    now = C.now,
    heads = common[1],
    leases = common[2],
    ttl = common[3],
    wake = false,
  }, STATE_META)
end
