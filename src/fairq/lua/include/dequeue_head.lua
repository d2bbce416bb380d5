-- dequeue_head.lua: KEYS/ARGV binding and gates shared by every dequeue script.
local B = KEYS[1]
local V = KEYS[2]
local master = KEYS[3]
local shard = { leases = KEYS[4], ttl = KEYS[5], expired = KEYS[6], mroot = KEYS[7] }
local env_id = ARGV[FIRST_ARG]
local queue = ARGV[FIRST_ARG + 1]
local max_count = tonumber(ARGV[FIRST_ARG + 2])
local lease_ms = tonumber(ARGV[FIRST_ARG + 3])

local env_limit, env_limit_burst, variant_limit = read_limits(B, V)
local env_busy = redis.call('SCARD', V .. ':inflight')
-- n: how many runs this call may deliver (env gate with burst; the queue or each
-- variant is capped by min(queue limit, env limit) without burst).
local n = math.min(max_count, env_limit_burst - env_busy)
