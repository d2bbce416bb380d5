--[[ expire_ttl_vtime.lua: expire_ttl.lua for the fair order (same KEYS, ARGV, reply);
a variant drained by expiry parks its virtual-time tag. ]]
--@include context
--@include keys
--@include counters
--@include hooks_vtime
--@include runs
--@include serve
--@include expire_main
