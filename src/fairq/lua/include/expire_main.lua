-- expire_main.lua: body of expire_ttl.lua / expire_ttl_vtime.lua (see their header).
local ttl_index, master, mroot, expired = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local shard = { ttl = ttl_index, expired = expired }
local batch = tonumber(ARGV[FIRST_ARG])
local due = redis.call('ZRANGEBYSCORE', ttl_index, '-inf', NOW, 'LIMIT', 0, batch)
local reply = {0}
local touched = {}
for _, member in ipairs(due) do
  local mkey = mroot .. member
  local f = redis.call('HMGET', mkey, 'id', 'e', 'q', 'b', 'k', 'st')
  if f[1] and f[6] == 'queued' then
    local run, env_id, queue, B, ck = f[1], f[2], f[3], f[4], f[5]
    unqueue(B, ck, run)
    if ck ~= '' then ck_refresh(B, ck) end
    expire_run(shard, mkey, member, env_id, queue, ck, run)
    touched[B .. '|' .. (ck == '' and 'q' or 'ck')] = {B, env_id, queue, ck == '' and 'q' or 'ck'}
    reply[1] = reply[1] + 1
    reply[#reply + 1] = member
  else
    redis.call('ZREM', ttl_index, member)
  end
end
for _, t in pairs(touched) do
  master_rebalance(master, t[1], t[2], t[3], t[4])
  hooks_finish(t[1])
end
return reply
