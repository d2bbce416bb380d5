--[[ enqueue_vtime.lua: enqueue.lua for the fair order.

Identical KEYS, ARGV and reply to enqueue.lua. Additionally registers each variant
that gains queued runs in B:vtime (NX, at the floor or per the join policy; a
variant that drained earlier returns at max(floor, parked tag)).
]]
--@include context
--@include keys
--@include counters
--@include hooks_vtime
--@include runs
--@include enqueue_main
