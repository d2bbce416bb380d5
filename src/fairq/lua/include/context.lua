-- context.lua: the ARGV prefix every fairq script shares (ARGV[1..13]).
--   ARGV[1]  now (ms, the caller's clock; logical in simulations)
--   ARGV[2]  CK counter TTL (s)
--   ARGV[3]  virtual-time quantum (> 0)
--   ARGV[4]  virtual-time state TTL (s)
--   ARGV[5]  join policy for new variants: 'floor' | 'behind_leader'
--   ARGV[6]  arrival cap (virtual time above the floor a newcomer may start)
--   ARGV[7]  maximum parked tags kept per base queue
--   ARGV[8]  pub/sub channel for wake-up hints
--   ARGV[9]  default env concurrency limit
--   ARGV[10] default env burst factor
--   ARGV[11] default queue size limit (0 = none)
--   ARGV[12] maximum serves per variant per dequeue call
--   ARGV[13] pass-1 scan window multiplier
-- Script-specific arguments start at ARGV[14] (FIRST_ARG).
local NOW = tonumber(ARGV[1])
local COUNTER_TTL = tonumber(ARGV[2])
local VT_QUANTUM = tonumber(ARGV[3])
local VT_STATE_TTL = tonumber(ARGV[4])
local VT_JOIN_POLICY = ARGV[5]
local VT_ARRIVAL_CAP = tonumber(ARGV[6])
local VT_IDLE_MAX = tonumber(ARGV[7])
local WAKE_CHANNEL = ARGV[8]
local DEFAULT_ENV_CONCURRENCY = tonumber(ARGV[9])
local DEFAULT_BURST_FACTOR = tonumber(ARGV[10])
local DEFAULT_QUEUE_SIZE_LIMIT = tonumber(ARGV[11])
local MAX_PER_KEY = tonumber(ARGV[12])
local WINDOW_MULTIPLIER = tonumber(ARGV[13])
local FIRST_ARG = 14
--- Unlimited, as a number.
local UNLIMITED = 1000000000
-- A caller bug, not a domain outcome: refuse before touching anything (FQ2 ->
-- fairq.errors.InvalidLimitError via raise_for_code).
local numeric = {NOW, COUNTER_TTL, VT_QUANTUM, VT_STATE_TTL, VT_ARRIVAL_CAP, VT_IDLE_MAX,
  DEFAULT_ENV_CONCURRENCY, DEFAULT_BURST_FACTOR, DEFAULT_QUEUE_SIZE_LIMIT, MAX_PER_KEY,
  WINDOW_MULTIPLIER}
for i = 1, 11 do
  if numeric[i] == nil then error({err = 'FQ2 context argument ' .. i .. ' is not a number'}) end
end
