--[[ cancel.lua: remove a run that has not started: a queued run (it will never be
delivered) or a dead-lettered one. A running run is left alone (its worker finishes,
acks or nacks it).

KEYS
  1 V env prefix   2 T:master   3 T:ttl   4 T:m: (message-key prefix)
ARGV
  1..13 context   14 env id   15 run id
Reply
  1 cancelled (was queued), 2 removed from the dead-letter queue, 0 unknown run,
  -1 running (not cancelled)
]]
--@include context
--@include keys
--@include counters
--@include hooks_age
--@include runs
--@include serve
--@include cancel_main
