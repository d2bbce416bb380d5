--[[ cancel_vtime.lua: cancel.lua for the fair order (same KEYS, ARGV, reply); a variant
drained by the cancel parks its virtual-time tag. ]]
--@include context
--@include keys
--@include counters
--@include hooks_vtime
--@include runs
--@include serve
--@include cancel_main
