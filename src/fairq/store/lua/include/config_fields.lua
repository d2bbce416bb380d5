-- config_fields.lua: reading an environment's config hash (V:config), where most options
-- are unset: an unconfigured environment has no hash, a configured one a few fields.
--@require state

-- The fields of config hash `key` that are set, of the list `fields` a caller would
-- name, as one flat list of field, value pairs (fields not in `fields` may come too: a
-- caller looks each one up). The hash's length first: none, nothing is read; fewer
-- fields than `fields`, all of them (HGETALL: its reply is the few set, where an HMGET
-- names every field and gets a reply for each); else the HMGET of `fields`.
local function config_set_fields(key, fields)
  local length = redis.call('HLEN', key)
  if length == 0 then return EMPTY end
  if length < #fields then return redis.call('HGETALL', key) end
  local raw = call_list('HMGET', key, fields)
  local set, n = {}, 0
  for i = 1, #fields do
    if raw[i] then set[n + 1], set[n + 2], n = fields[i], raw[i], n + 2 end
  end
  return set
end
