--[[ redrive.lua: move a dead-lettered run back to its queue with attempt 0.

KEYS
  1 V env prefix   2 T:master   3 T:m: (message-key prefix)
ARGV
  1..13 context   14 env id   15 run id   16 score (ms)
Reply
  1 redriven, 0 not in the dead-letter queue
]]
--@include context
--@include keys
--@include counters
--@include hooks_age
--@include runs
--@include redrive_main
