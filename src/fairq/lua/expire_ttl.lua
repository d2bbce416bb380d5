--[[ expire_ttl.lua: expire queued runs whose TTL passed before any delivery: remove
them, report each on T:expired, never deliver them. Maintenance: run on a timer
(dequeue also expires a due run it meets).

KEYS
  1 T:ttl   2 T:master   3 T:m: (message-key prefix)   4 T:expired
ARGV
  1..13 context   14 batch size
Reply
  {count expired, lease member...}
]]
--@include context
--@include keys
--@include counters
--@include hooks_age
--@include runs
--@include serve
--@include expire_main
