--[[ nack_vtime.lua: nack.lua for the fair order (same KEYS, ARGV, reply); a requeued
run's variant is registered in virtual time like an enqueue. ]]
--@include context
--@include keys
--@include counters
--@include hooks_vtime
--@include runs
--@include nack_main
