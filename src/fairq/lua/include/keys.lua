-- keys.lua: suffixes appended to a base-queue prefix B or an env prefix V.
-- B and V always come from KEYS or from a message hash written by fairq, so every
-- derived key shares their hash tag (see fairq/keys.py for the schema).
local function variant_queued_key(B, ck) return B .. ':ck:' .. ck .. ':queued' end
local function variant_inflight_key(B, ck) return B .. ':ck:' .. ck .. ':inflight' end
local function master_member(kind, env_id, queue) return kind .. ':' .. env_id .. ':' .. queue end
