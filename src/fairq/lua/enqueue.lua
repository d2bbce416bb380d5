--[[ enqueue.lua: add runs to one base queue (keyless, or into concurrency-key variants).

Age-order version: registers nothing in virtual time (see enqueue_vtime.lua).
A run id that already exists (queued, running or dead-lettered) is a no-op. The queue
size limit (queue's max_size, else the env's max_queue_size, else the default) counts
keyless runs plus runs queued across all variants and is checked per run, atomically.

KEYS
  1 B      base-queue prefix  T:q:O:P:E:Q
  2 V      env prefix         T:e:O:P:E
  3 master T:master (ZSET)
  4 ttl    T:ttl (ZSET)
  5 envs   T:envs (SET)
  6 mroot  T:m: (message-key prefix)
ARGV
  1..13 context (include/context.lua)
  14 env id O:P:E   15 queue name
  then per run: run id, encoded ck ('' = none), score (ms), payload (JSON),
                TTL deadline (ms, 0 = none), enqueued at (ms)
Reply
  one status per run (1 enqueued, 0 duplicate, -1 rejected: size limit), then the
  size limit in force (0 = none)
]]
--@include context
--@include keys
--@include counters
--@include hooks_age
--@include runs
--@include enqueue_main
