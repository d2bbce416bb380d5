-- state.lua: the per-script state X every helper takes as its first parameter, and
-- HOOK, the table the order include (order_age.lua / order_fair.lua) fills with the
-- order-specific hooks. Helpers call HOOK.<name>(...) so that a helper written before
-- the order include can still reach it.

local HOOK = {}

-- The per-call tables of a script's state, each made on first use (a call touches few):
-- STATE_TABLES, generated with the other fields of X from fairq/store/context.py
-- (STATE_FIELDS, where each is described; the loader refuses an undeclared one).
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

-- An empty table that may not be written (state_new makes writing it an error: a
-- library's load cannot set metatables): what state_peek hands out for a table not made
-- yet, and the fields read of an environment that has no config.
local EMPTY = {}
local EMPTY_META = {
  __newindex = function() error('a table from state_peek is read-only') end,
}

-- A per-call table for reading only: the one made, else an empty one. (Reading it as
-- X.<name> would make it; a flush that visits every table would make them all.)
local function state_peek(X, name)
  return rawget(X, name) or EMPTY
end

-- The shard-wide keys every script uses, per shard tag.
local SHARD_COMMON = memo_new(1024)

local function shard_common(tag)
  return {shard_key(tag, 'heads'), shard_key(tag, 'leases'), shard_key(tag, 'ttl')}
end

local function state_new(C, tag)
  if not EMPTY_META.sealed then -- (a flag: getmetatable would be a C call per call)
    setmetatable(EMPTY, EMPTY_META)
    EMPTY_META.sealed = true
  end
  local common = SHARD_COMMON.values[tag] or memo_get(SHARD_COMMON, tag, shard_common, tag)
  return setmetatable({
    C = C,
    tag = tag,
    now = C.now,
    heads = common[1],
    leases = common[2],
    ttl = common[3],
    wake = false,
    -- (set, so reading them costs no call of __index)
    head_known = false,
    made = false,
  }, STATE_META)
end
