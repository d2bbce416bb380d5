--[[ nack.lua: give a leased run back: requeue it at retry_at, or dead-letter it
once its attempt count reaches max_attempts (only when incrementing). Frees its slots.

KEYS
  1 T:leases   2 T:master   3 T:m: (message-key prefix)
ARGV
  1..13 context   14 lease member (O:P:E:<run id>)   15 delivery
  16 retry at (ms; the new score)   17 increment attempt (1/0)   18 max attempts
Reply
  {status, attempt}: status 1 requeued, 2 dead-lettered, 0 lease lost
]]
--@include context
--@include keys
--@include counters
--@include hooks_age
--@include runs
--@include nack_main
