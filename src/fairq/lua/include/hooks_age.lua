-- hooks_age.lua: variant life-cycle hooks for the age order: nothing to do.
-- The fair order's scripts include hooks_vtime.lua instead; nothing else differs.
local function variant_filled(B, ck) end
local function variant_drained(B, ck) end
local function hooks_finish(B) end
