-- state.lua: the per-script state X every helper takes as its first parameter, and
-- HOOK, the table the order include (order_age.lua / order_fair.lua) fills with the
-- order-specific hooks. Helpers call HOOK.<name>(...) so that a helper written before
-- the order include can still reach it.

local HOOK = {}

local function state_new(C, tag)
  return {
    C = C,
    tag = tag,
    now = C.now,
    heads = shard_key(tag, 'heads'),
    leases = shard_key(tag, 'leases'),
    ttl = shard_key(tag, 'ttl'),
    -- counters.lua: known values, pending deltas and truth functions per counter key
    cval = {}, cdelta = {}, cseed = {},
    -- tenant running counts (counters.lua): per B, seeded flag, values, pending deltas
    trseen = {}, trval = {}, trdelta = {},
    -- runs.lua: slot and index changes applied once at the end (state_flush)
    env_take = {}, env_free = {}, lease_add = {}, lease_del = {}, ttl_del = {},
    free_groups = {}, free_by = {},
    -- ck_index head moves not yet written: B -> {order, score}
    ckidx = {},
    -- keys to delete that exist (run hashes), deleted with the flush's gated flags
    deletes = {},
    recent = {}, history = {},
    -- queues whose heads-index member must be re-scored: B|kind -> {B, env_id, queue, kind}
    touched = {},
    -- environments whose consumers must be woken: V -> true
    wake_env = {},
    wake = false,
  }
end
