--[[ reclaim.lua: requeue runs whose lease lapsed without a heartbeat (a lost
consumer). Each goes back to its queue at its old score with its slots freed; the
attempt count is unchanged (at-least-once delivery). Maintenance: run on a timer.

KEYS
  1 T:leases   2 T:master   3 T:m: (message-key prefix)
ARGV
  1..13 context   14 batch size
Reply
  {count requeued, lease member...}
]]
--@include context
--@include keys
--@include counters
--@include hooks_age
--@include runs
--@include reclaim_main
