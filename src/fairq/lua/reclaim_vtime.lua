--[[ reclaim_vtime.lua: reclaim.lua for the fair order (same KEYS, ARGV, reply); each
requeued run's variant is registered in virtual time. ]]
--@include context
--@include keys
--@include counters
--@include hooks_vtime
--@include runs
--@include reclaim_main
