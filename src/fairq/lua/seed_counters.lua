--[[ seed_counters.lua: make sure a base queue's CK counters exist (seeding a missing
one from the truth) and return them. Readers call it only when a counter is missing
while variants hold runs, so a dashboard never shows 0 for a keyed backlog.

KEYS
  1 B base-queue prefix
ARGV
  1..13 context
Reply
  {queued across variants, running across variants}
]]
--@include context
--@include keys
--@include counters

local B = KEYS[1]
return {ck_queued_value(B), ck_running_seed(B)}
