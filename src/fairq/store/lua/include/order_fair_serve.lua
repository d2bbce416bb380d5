-- order_fair_serve.lua: the serve engine of the fair order, only in the dequeue's fair
-- build (the other scripts carry the order's hooks, include/order_fair.lua, not this):
-- start-time fair queueing over the (tenant, queue) pairs of one environment's fair
-- queues, then over a tenant's keys, under the gates; parking of gated tenants and keys;
-- the environment's place among its shard's.
-- Queues whose order is age are served by serve_age.lua even in this build.
-- Its functions are fields of one table local to one block (only HOOK.serve leaves it):
-- a library's main chunk may hold at most 200 locals, and nothing else needs these.
--@require state config runs claim gates serve_age heap order_fair

do
  -- the engine's functions, as fields of one local (see above)
  local E = {}

  --- How many entries of a tenant's key set a dequeue reads first (its floor, its best key
  --- and the next; 3 instead of 6 was 3 % less server work with 100 named tenants,
  --- measured), and one fewer in a call with more candidate pairs than runs to serve,
  --- where most tenants are served once (2 % less again there; where tenants are served
  --- twice or more, the third entry saves a second read: E.load_keys). It reads
  --- more while the best key it knows may not be the tenant's best (load_more_keys). A
  --- tenant kept in B:tsolo is served as that read of its key set (floor, key) would
  --- serve it: see E.load_solo.
  local KEYS_LOADED = 3
  --- At most this many gather-and-serve rounds per call (each round after the first needs
  --- the previous one to have parked something, or to have found that it must read more of
  --- a queue's candidates).
  local MAX_ROUNDS = 16
  --- A gather reads at least this many copies of a queue's B:tq first (a small call would
  --- otherwise read again for every pair it serves).
  local FIRST_READ = 8
  --- An empty list or map, shared: never written (E.note and E.append make the table of
  --- their first entry in its place).
  E.NONE = {}

  -- Whether this call moved the floor across a tick (or created the state): time to prune
  -- and refresh TTLs.
  function E.floor_ticked(X, V)
    local f = X.tfloor[V]
    return not f.stored or math.floor(f.value / TICK) > math.floor(f.start / TICK)
  end

  --- A member parked by a cap comes back when one of its slots frees; this long after
  --- parking it is also re-checked (so a slot freed where nobody told the order, e.g. by
  --- an age-order build in a mixed deploy, cannot keep it out for good).
  local CAP_RECHECK_MS = 30000

  -- Park a member: 'c:' (held back by a cap; back on a freed slot) or 'd:' (held back
  -- by time; back when `due`).
  function E.park(X, Q, member, tag, due)
    redis.call('HSET', queue_key(Q.OB, 'parked'), member, (due and 'd:' or 'c:') .. exact(tag))
    redis.call('ZADD', queue_key(Q.OB, 'parked_due'), due or (X.now + CAP_RECHECK_MS), member)
    X.hpark = X.hpark or {}
    X.hpark[queue_key(Q.OB, 'parked_due')] = true
    if not Q.parked then
      redis.call('HSET', env_key(Q.V, 'config'), config_field(Q.oname, 'parked'), 1)
      Q.parked = true
    end
    X.parked_now = true
  end

  function E.park_pair(X, Q, tenant, tag, due)
    redis.call('ZREM', queue_key(Q.OB, 'ready_tenants'), tenant)
    E.park(X, Q, 't:' .. tenant, tag, due)
  end

  -- How many of the earliest parked members one read looks at (due ones go back; the
  -- first time gate still closed gives the wait; cap parks, due only for their re-check,
  -- are passed over).
  local DUE_PEEK = 8

  -- Time-gated tenants and keys whose time has come go back into the order; the next
  -- time gate still closed tells the caller when to come back (R.wait).
  function E.promote_due(X, Q, R)
    if not has_park(X, Q) then return end
    local dk = queue_key(Q.OB, 'parked_due')
    for _ = 1, 8 do
      local first = redis.call('ZRANGE', dk, 0, DUE_PEEK - 1, 'WITHSCORES')
      if #first == 0 then
        -- nothing parked any more: later scripts need not look
        redis.call('HDEL', env_key(Q.V, 'config'), config_field(Q.oname, 'parked'))
        Q.parked = false
        X.hpark[dk] = false
        return
      end
      local members = {}
      for i = 1, #first, 2 do members[#members + 1] = first[i] end
      local values = call_list('HMGET', queue_key(Q.OB, 'parked'), members)
      local all_due = true
      for i, member in ipairs(members) do
        local at = tonumber(first[2 * i])
        if at <= X.now then
          if values[i] then unpark(X, Q, member, values[i]) else redis.call('ZREM', dk, member) end
        else
          all_due = false
          if values[i] and string.sub(values[i], 1, 2) == 'd:' then
            wait_until(R, at)
            return
          end
        end
      end
      if not all_due or #members < DUE_PEEK then return end
    end
  end

  -- ------------------------------------------------------------------ the fair serve

  function E.key_better(a, b)
    if b == nil then return true end
    local at, bt = a.tag, b.tag
    if at ~= bt then return at < bt end
    at, bt = a.tie, b.tie
    if at ~= bt then return at < bt end
    return a.flow < b.flow
  end

  -- ------------------------------------------------------------------ the serve state

  -- A serve state refuses a field it does not declare (a misspelt read would be nil).
  local SERVE_STATE_META = {
    __index = function(_, name) error('fair serve: undeclared state field ' .. tostring(name)) end,
    __newindex = function(_, name)
      error('fair serve: undeclared state field ' .. tostring(name))
    end,
  }

  -- The state of one fair serve: one dequeue call over the fair queues of one environment.
  -- Every phase below is a function of this record (and of X, the script's state); its
  -- fields are all declared here, none is nil, and a read or write of any other fails.
  function E.serve_state(X, env, level, queues, heads, budget, lease_ms, out, R)
    return setmetatable({
      X = X, queues = queues,
      V = queues[1].OV, -- the prefix of the level's (and pool's) tenant tags (V:tt)
      heads = heads,       -- queue name -> its ready keyless head (or nil)
      budget = budget, lease_ms = lease_ms, out = out, R = R,
      by_id = {},          -- B -> tenant -> its pair {Q, T, tie, active, ten, keys...}
      plist = {},          -- the pairs, in the order found
      ten = {},            -- tenant -> {tag, weight, touched} (false while being read)
      touched = {},        -- tenants served in this call, in the order first served
      -- (what few calls need starts as the shared E.NONE: E.note / E.append make its
      -- table at its first entry)
      qdone = E.NONE,      -- B -> true: the queue serves no more in this call
      served = 0,          -- runs claimed so far
      served_of = E.NONE,  -- B|flow -> runs claimed in this call (for max_per_key)
      loaded = E.NONE,     -- the pairs whose key sets this call read (load_keys)
      lenders = E.NONE,    -- {p, flow, kc} held back by a cap of a queue that lends
      heap = false,        -- the active pairs by (tenant tag, tie, names); see serve_round
      widths = {},         -- B -> how many of its B:tq entries the gathers read (see gather)
      bounds = {},         -- B -> no pair of B:tq it did not read has a lower copy
      bound = math.huge,   -- the least of the last gather's bounds (see serve_round)
      widen = false,       -- the last round stopped to read more candidates
      full = E.NONE,       -- B -> a read of B:tq came back full (it may be big: keep_wide)
    }, SERVE_STATE_META)
  end

  -- F[field][key] = value (the map made at its first entry, in place of E.NONE).
  function E.note(F, field, key, value)
    local map = F[field]
    if map == E.NONE then
      map = {}
      F[field] = map
    end
    map[key] = value
  end

  -- Append `value` to the list F[field] (made at its first entry, in place of E.NONE).
  function E.append(F, field, value)
    local list = F[field]
    if list == E.NONE then
      list = {}
      F[field] = list
    end
    list[#list + 1] = value
  end

  function E.pair_of(F, Q, T, copy)
    local of_queue = F.by_id[Q.OB]
    if of_queue == nil then
      of_queue = {}
      F.by_id[Q.OB] = of_queue
    end
    local p = of_queue[T]
    if p == nil then
      -- every field a simple pair will use, so its table is sized once (copy: the B:tq
      -- copy of its tag it came with; nd: how many flows discovery found of it); 16
      -- fields fit without growing it, so the fields of a one-key tenant's pair (disc,
      -- solo, kf) fit beside these
      p = {Q = Q, T = T, tie = math.huge, active = true, hk = 0, ht = 0, ten = false,
        simple = false, flow = false, copy = copy, sk = false, nd = 0}
      of_queue[T] = p
      F.plist[#F.plist + 1] = p
    end
    return p
  end

  -- A ready head the discovery found in flow `flow` of pair p (kept per flow only where
  -- a pair can hold several flows, a queue with named tenants: p.disc, flow -> head, and
  -- p.nd, how many flows; elsewhere the flow is the pair's one flow, so it needs no
  -- load_keys).
  function E.note_head(p, flow, score)
    if p.Q.named then
      local disc = p.disc
      if disc == nil then
        p.disc, p.nd = {[flow] = score}, 1
      else
        if disc[flow] == nil then p.nd = p.nd + 1 end
        disc[flow] = score
      end
    elseif not p.simple then
      -- a queue without named tenants: the pair is simple, and this is its flow
      p.simple, p.flow = true, flow
    end
    if score < p.tie then p.tie = score end
  end

  function E.drop_pair(p)
    p.active = false
    p.dropped = true
    redis.call('ZREM', queue_key(p.Q.OB, 'ready_tenants'), p.T)
  end

  -- Whether every key of a pair's (fully loaded) key set left it in this call.
  function E.pair_emptied(X, p)
    local sk = p.sk
    if not (p.complete or (sk and sk.whole))
        or (X.kadded and X.kadded[p.Q.OB .. '|' .. p.T]) then
      return false
    end
    if sk then return sk.gone end
    for _, k in ipairs(p.keys) do
      if not k.gone then return false end
    end
    return true
  end

  -- ------------------------------------------------------------------ phase: gather

  -- Whether queue Q can serve in this call (its total cap and queue rate leave room).
  function E.queue_open(F, Q)
    local X, R = F.X, F.R
    if F.qdone[Q.OB] or Q.paused then return false end
    if total_room(X, Q) <= 0 then
      R.gated = true
      E.note(F, 'qdone', Q.OB, true)
    elseif Q.rate then
      local whole, at = bucket_peek(X, bucket(X, Q, 'q', Q.rate, Q.rate_burst))
      if whole <= 0 then
        wait_until(R, at)
        E.note(F, 'qdone', Q.OB, true)
      end
    end
    return not F.qdone[Q.OB]
  end

  -- The queue's `width` longest-waiting ready heads, and its keyless head: the flows and
  -- their heads (whatever their names: a flow nothing registered, after a cold start or
  -- an age-order enqueue, is found here), and whether that was every ready head.
  function E.discover_heads(F, Q, width)
    local X = F.X
    ck_index_flush(X)
    local disc = redis.call('ZRANGEBYSCORE', queue_key(Q.OB, 'ck_index'), '-inf', X.now,
      'WITHSCORES', 'LIMIT', 0, width)
    return disc, #disc < 2 * width -- (flow, head, ...), and whether that was every one
  end

  -- The discovered heads `disc` (flow, head, ... as discover_heads reads them) and the
  -- queue's keyless head (F.heads): a flow whose pair is not a candidate yet is registered
  -- by the join rules (unless parked), then a candidate; a registered one only among the
  -- first `adopt` (the keyless head always). Returns whether it registered any.
  function E.adopt_discovered(F, Q, disc, adopt)
    local X = F.X
    local unknown, unknown_at = nil, nil -- (made for the first)
    local of_queue = F.by_id[Q.OB] or E.NONE
    local n = #disc / 2
    local keyless = F.heads[Q.name]
    for i = 1, keyless ~= nil and n + 1 or n do
      local flow = i <= n and disc[2 * i - 1] or KEYLESS_FLOW
      local T = default_tenant(Q.name, flow)
      local p = of_queue[T]
      if p ~= nil then
        E.note_head(p, flow, i <= n and tonumber(disc[2 * i]) or keyless)
      elseif unknown == nil then
        unknown, unknown_at = {T}, {i}
      else
        unknown[#unknown + 1] = T
        unknown_at[#unknown_at + 1] = i
      end
    end
    if unknown == nil then return false end
    local fresh = false
    local scores = call_list('ZMSCORE', queue_key(Q.OB, 'ready_tenants'), unknown)
    for i, T in ipairs(unknown) do
      local at = unknown_at[i]
      local flow = at <= n and disc[2 * at - 1] or KEYLESS_FLOW
      local head = at <= n and tonumber(disc[2 * at]) or keyless
      local score = tonumber(scores[i])
      local joins = at <= adopt or flow == KEYLESS_FLOW
      if score == nil and not is_parked(X, Q, 'k:' .. flow) and not is_parked(X, Q, 't:' .. T) then
        if flow_tenant(flow) then register_key(X, Q, T, flow) end
        register_pair(X, Q, T)
        score = tonumber(redis.call('ZSCORE', queue_key(Q.OB, 'ready_tenants'), T))
        joins, fresh = true, true
      end
      if score ~= nil and joins then E.note_head(E.pair_of(F, Q, T, score), flow, head) end
    end
    return fresh
  end

  -- The tenant records of the pairs from `first` on: authoritative tag (V:tt, else the
  -- copy; never below the floor) and weight (its own, else, for a key serving as its own
  -- tenant, the key's weight in its queue, else 1).
  function E.attach_tenants(F, first)
    local X, V, plist, ten = F.X, F.V, F.plist, F.ten
    local names, weighted = {}, false
    for i = first, #plist do
      local p = plist[i]
      if ten[p.T] == nil then
        ten[p.T] = false
        names[#names + 1] = p.T
      end
      weighted = weighted or p.Q.weighted
    end
    local n = #names
    if n > 0 then
      -- the floor comes with the tags when nothing read it yet
      local need_floor = X.tfloor == nil or X.tfloor[V] == nil
      if need_floor then names[n + 1] = FLOOR_MEMBER end
      local auth = call_list('ZMSCORE', env_key(V, 'tenant_tags'), names)
      if need_floor then
        floor_load(X, V, auth[n + 1])
        names[n + 1] = nil
      end
      local weights = tenant_weights(X, F.queues[1], names, E.NONE)
      for i = 1, n do
        local T = names[i]
        ten[T] = {tag = tonumber(auth[i]), weight = weights[T], touched = false}
      end
    end
    if weighted then
      local by_queue = {}
      for i = first, #plist do
        local p = plist[i]
        local t = ten[p.T]
        if t.weight == nil and p.Q.weighted and string.sub(p.T, 1, 1) ~= '/' then
          local list = by_queue[p.Q.OB] or {Q = p.Q, keys = {}}
          by_queue[p.Q.OB] = list
          list.keys[#list.keys + 1] = p.T
        end
      end
      for _, list in pairs(by_queue) do
        local w = tenant_weights(X, list.Q, {}, list.keys)
        for _, k in ipairs(list.keys) do
          if ten[k].weight == nil then ten[k].weight = w[k] end
        end
      end
    end
    local floor = tenant_floor(X, V)
    for i = first, #plist do
      local p = plist[i]
      local t = ten[p.T]
      if t.tag == nil then t.tag = p.copy end
      if t.tag < floor then t.tag = floor end
      if t.weight == nil then t.weight = 1 end
      p.ten = t
    end
  end

  -- Phase 1: one round of candidates from every open queue (the lowest copies of B:tq,
  -- and the discovered heads), with their tenants. A call reads `budget` + 1 copies of a
  -- queue first (at least FIRST_READ) and twice as many each time it must read more (E.widen), up to budget x
  -- window; until it read them all, no pair it did not read has a copy below the queue's
  -- bound. Discovery reads as many heads (3 x width / window with a window under 3): a
  -- flow among them that nothing registered joins, a registered pair beyond the window is
  -- a candidate too. When one of them joined (a cold start, an age-order enqueue: there
  -- may be more), it reads on to max(budget x window, 3 x budget) heads, where every flow
  -- nothing registered joins, but no further registered pair is a candidate (E.discover).
  -- Returns how many new pairs it found.
  function E.gather(F)
    local before = #F.plist
    F.bound = math.huge
    for _, Q in ipairs(F.queues) do
      if E.queue_open(F, Q) then
        if Q.parked then E.promote_due(F.X, Q, F.R) end
        local most = F.budget * Q.window
        local width = math.min(F.widths[Q.OB] or math.max(F.budget + 1, FIRST_READ), most)
        F.widths[Q.OB] = width
        local win = redis.call('ZRANGE', queue_key(Q.OB, 'ready_tenants'), 0, width - 1,
          'WITHSCORES')
        for i = 1, #win, 2 do E.pair_of(F, Q, win[i], tonumber(win[i + 1])) end
        local bound = math.huge
        if #win == 2 * width then
          E.note(F, 'full', Q.OB, true)
          if width < most then bound = tonumber(win[#win]) end
        end
        F.bounds[Q.OB] = bound
        if bound < F.bound then F.bound = bound end
        E.discover(F, Q, width, most)
      end
    end
    if #F.plist > before then E.attach_tenants(F, before + 1) end
    return #F.plist - before
  end

  -- Discovery for a gather that read `width` of Q's copies (see gather). While the last
  -- reads registered flows (the queue's `unregistered` flag: a cold start, an age-order
  -- enqueue), every call reads all max(budget x window, 3 x budget) heads; the flag goes
  -- when such a read registers nothing.
  function E.discover(F, Q, width, most)
    local full = math.max(most, 3 * F.budget)
    local adopt = math.min(math.max(width, math.ceil(3 * width / Q.window)), full)
    local first = Q.unregistered and full or adopt
    local disc, all = E.discover_heads(F, Q, first)
    local fresh = E.adopt_discovered(F, Q, disc, adopt)
    if fresh and not all and first < full then
      E.adopt_discovered(F, Q, (E.discover_heads(F, Q, full)), adopt)
    end
    if fresh ~= Q.unregistered then
      local field = config_field(Q.name, 'unregistered')
      if fresh then
        redis.call('HSET', env_key(Q.V, 'config'), field, 1)
      else
        redis.call('HDEL', env_key(Q.V, 'config'), field)
      end
      Q.unregistered = fresh
    end
  end

  -- More candidates next gather: twice the width of every queue not read to its end.
  function E.widen(F)
    for _, Q in ipairs(F.queues) do
      if F.bounds[Q.OB] ~= nil and F.bounds[Q.OB] < math.huge then
        F.widths[Q.OB] = 2 * F.widths[Q.OB]
      end
    end
  end

  -- ------------------------------------------------------------------ keys of a pair

  -- The flows of a pair (loaded at its first pick, serve_pick): simple, or the first
  -- KEYS_LOADED entries of its key set (more are read when the call needs them:
  -- load_more_keys). Each key is a record {flow, tag, tie, active, weight} (and gone /
  -- touched once set). A pair's keys (p.keys) are kept in key order, the best first: by
  -- tag inside the tenant, then tie (the longest-waiting known head first), then name
  -- (E.key_better). The keys before p.kat are out of play for this call (drained, parked,
  -- held back, or given their share): keys[p.kat] is the best in play and keys[p.kat + 1]
  -- the next (E.listed_best); a key just served that stays in play moves to its new place
  -- before the pair's next pick (p.kmoved, key_settle), and new keys read go to theirs
  -- (key_insert). So one pick costs a few comparisons however many keys the tenant has.
  -- The pair's tie is the least of its keys' in play (keys_tie).
  function E.load_keys(F, p)
    local X, Q = F.X, p.Q
    if not Q.named then return E.simple_pair(p) end
    -- a tenant kept in B:tsolo (one key in play): read first where discovery found at
    -- most one of its flows; where it found several, its key set is read first (most
    -- such tenants have one), and B:tsolo only when there is none
    -- the first read's width (see KEYS_LOADED)
    local entries, width = nil, #F.plist > F.budget and KEYS_LOADED - 1 or KEYS_LOADED
    -- (in such a call, a tenant with discovered flows and a key set is probed first; a
    -- probe that did not load the pair leaves what it read in `probed`)
    local probe, probed = width < KEYS_LOADED and p.disc ~= nil, nil
    if p.solo == nil and p.nd > 1 then
      if probe then
        local loaded
        loaded, entries, probed = E.probe_keys(F, p)
        if loaded then return end
        probe = false
      else
        entries = redis.call('ZRANGE', E.key_set(p), 0, width - 1, 'WITHSCORES')
      end
    end
    if entries == nil or #entries == 0 then
      -- (a queue known to keep no B:tsolo entry: no call)
      if p.solo == nil and not (X.solo_none and X.solo_none[Q.OB]) then E.read_solo(F, p) end
      if p.solo then
        if E.load_solo(F, p, width) then return end
        -- discovery found a flow its entry does not name (it joins): a key set from now on
        SOLO.to_set(X, Q, p.T, p.solo, true)
        p.solo, entries = false, nil
      end
    end
    if entries == nil and probe then
      local loaded
      loaded, entries, probed = E.probe_keys(F, p)
      if loaded then return end
    end
    E.list_key_set(F, p, entries, width, probed)
  end

  -- Pair p's keys from the first `width` entries of its key set (`entries`; read here
  -- when nil) and the discovered flows that read does not list: their tags come from what
  -- a probe read (`probed`), else from one ZMSCORE with the key floor's (when the read
  -- did not hold it); a flow nothing registered is registered.
  function E.list_key_set(F, p, entries, width, probed)
    local X, Q = F.X, p.Q
    local kk = E.key_set(p) -- (named here: the reads and writes after this one use it)
    entries = entries or redis.call('ZRANGE', kk, 0, width - 1, 'WITHSCORES')
    local n = #entries
    if n == 0 then return E.simple_pair(p) end
    local complete = n < 2 * width
    p.complete, p.width = complete, width
    -- one pass over the read: the key floor's score (false: a whole set without one), and
    -- how many of the discovered flows it lists
    local disc, floor_raw, listed = p.disc, nil, 0
    if complete then floor_raw = false end
    for i = 1, n, 2 do
      local member = entries[i]
      if member == KEY_FLOOR_MEMBER then
        floor_raw = entries[i + 1]
      elseif disc and disc[member] then
        listed = listed + 1
      end
    end
    local missing = nil
    if disc and not (listed == 1 and p.nd == 1) then
      missing = E.unread(disc, entries)
    end
    local found = E.NONE
    if probed and not complete then
      -- the probe read them
      if floor_raw == nil then floor_raw = probed[KEY_FLOOR_MEMBER] end
      found = {}
      for i, flow in ipairs(missing or E.NONE) do found[i] = probed[flow] end
    elseif not complete and (missing or floor_raw == nil) then
      -- their tags and (when it was not read) the key floor, in one read
      local names = {KEY_FLOOR_MEMBER}
      for i, flow in ipairs(missing or E.NONE) do names[i + 1] = flow end
      found = call_list('ZMSCORE', kk, names)
      if floor_raw == nil then floor_raw = found[1] or false end
      table.remove(found, 1)
    end
    p.keys, p.kat, p.kmoved = {}, 1, false
    p.kf = key_floor(X, kk, floor_raw)
    E.list_keys(p, entries, false)
    E.read_bound(p, entries)
    if missing then
      local added = {}
      for i, flow in ipairs(missing) do
        local tag = tonumber(found[i])
        if tag == nil then tag = register_key(X, Q, p.T, flow) end
        if tag ~= nil then
          added[#added + 1] = flow
          added[#added + 1] = tag
        end
      end
      E.list_keys(p, added, false)
    end
    E.append(F, 'loaded', p)
    -- a tenant whose keys all left (parked, drained elsewhere) leaves the candidates
    if #p.keys == 0 and E.pair_emptied(X, p) then E.drop_pair(p) end
  end

  -- The probe of a tenant with discovered flows, in a call whose tenants are mostly
  -- served once: one ZMSCORE of its key floor and the discovered flows' tags. When the
  -- set has its floor and a discovered key is at it (clamped: tags below the floor count
  -- as the floor), that key beats every key not discovered (equal tags: a known head
  -- first), so the pair lists the discovered keys (registering a flow nothing registered)
  -- and knows no more: the read's bound is the floor, not the whole set, and a later read
  -- takes 4 entries, as after a read of 2. Returns true (loaded); else false, the set's
  -- first 2 entries and what the probe read (member -> score or false), when the set has
  -- a floor (else nil, nil).
  function E.probe_keys(F, p)
    local X, Q, disc = F.X, p.Q, p.disc
    local kk = E.key_set(p)
    if p.nd == 1 then return E.probe_one_key(F, p, kk, (next(disc))) end
    -- the flows in name order (registered in that order), then the floor member
    local names = {}
    for flow in pairs(disc) do names[#names + 1] = flow end
    local n = #names
    table.sort(names)
    names[n + 1] = KEY_FLOOR_MEMBER
    local got = redis.call('ZMSCORE', kk, unpack(names))
    local raw = got[n + 1]
    if not raw then return false, nil end -- no key set (B:tsolo, none, or no floor)
    local kf = key_floor(X, kk, raw)
    local at_floor = false
    for i = 1, n do
      local tag = tonumber(got[i])
      if tag ~= nil and tag <= kf.value then at_floor = true end
    end
    if not at_floor then
      local probed = {}
      for i = 1, n + 1 do probed[names[i]] = got[i] end
      return false, redis.call('ZRANGE', kk, 0, KEYS_LOADED - 2, 'WITHSCORES'), probed
    end
    E.probed_at_floor(F, p, kf)
    local added = {} -- (flow, tag, ... as list_keys takes them)
    for i = 1, n do
      local flow, tag = names[i], got[i]
      if not tag then tag = register_key(X, Q, p.T, flow) end
      if tag then
        added[#added + 1] = flow
        added[#added + 1] = tag
      end
    end
    E.list_keys(p, added, false)
    return true
  end

  -- probe_keys for a tenant discovery found one flow of (most probes): the same reads and
  -- the same outcome, its one key listed with no list of entries made for list_keys (the
  -- lists and the call were 1 % of the server's work at 1,000 and 10,000 keys of 100
  -- tenants, measured). A flow with no tag is not at the floor: nothing to register.
  function E.probe_one_key(F, p, kk, flow)
    local X = F.X
    local got = redis.call('ZMSCORE', kk, flow, KEY_FLOOR_MEMBER)
    local raw = got[2]
    if not raw then return false, nil end -- no key set (B:tsolo, none, or no floor)
    local kf = key_floor(X, kk, raw)
    local tag = tonumber(got[1])
    if tag == nil or tag > kf.value then
      return false, redis.call('ZRANGE', kk, 0, KEYS_LOADED - 2, 'WITHSCORES'),
        {[flow] = got[1], [KEY_FLOOR_MEMBER] = raw}
    end
    E.probed_at_floor(F, p, kf)
    -- (its tag clamped to the floor, as list_keys does)
    p.keys[1] = {flow = flow, tag = kf.value, tie = p.disc[flow], active = true,
      weight = key_weight(X, p.Q, flow)}
    return true
  end

  -- Pair p after a probe that found a discovered key at its key floor `kf`: loaded, its
  -- keys listed next (none yet), knowing no more of its set than that bound.
  function E.probed_at_floor(F, p, kf)
    p.keys, p.kat, p.kmoved = {}, 1, false
    p.complete, p.width, p.bound, p.kf = false, KEYS_LOADED - 1, kf.value, kf
    E.append(F, 'loaded', p)
  end

  -- The B:tsolo entries (p.solo, nil until read; false: none, its keys are in its key
  -- set, if any) of pair p, about to load its keys, and of the next pairs of its queue
  -- not read yet, as many as the call may still serve: one read for the pairs most calls
  -- serve.
  function E.read_solo(F, p)
    local Q = p.Q
    -- a queue whose named tenants all have key sets (several keys each): one probe a call
    -- instead of a read that finds none
    local X = F.X
    local none = X.solo_none and X.solo_none[Q.OB]
    if none == nil then
      none = redis.call('EXISTS', queue_key(Q.OB, 'solo_keys')) == 0
      X.solo_none = X.solo_none or {}
      X.solo_none[Q.OB] = none
    end
    if none then return end
    local of, names, n = {p}, {p.T}, 1
    local room, plist = F.budget - F.served, F.plist
    for i = 1, #plist do
      if n >= room then break end
      local o = plist[i]
      if o.solo == nil and o.Q == Q and o ~= p and o.nd <= 1 then
        n = n + 1
        of[n], names[n] = o, o.T
      end
    end
    local raw = call_list('HMGET', queue_key(Q.OB, 'solo_keys'), names)
    for j = 1, n do
      local o = of[j]
      o.solo = raw[j]
    end
  end

  -- Pair p's tenant has one key in play (p.solo, its B:tsolo entry): the pair's one key
  -- is p.sk, a key record that is also the tenant's key floor record (p.kf: its `value`)
  -- and the serve's record of the entry in X.solo_live (a script that moves the entry
  -- into a key set in this call takes them from there, and sets its `moved`); no key
  -- list, no key order. The key knows what a first read of the tenant's key set (its
  -- floor and its key, in a read of `width` entries) would: the whole set only when that
  -- is fewer than `width` (k.whole); the read's bound is the key's tag (k.bound). When the
  -- entry moved into a key set, the pair becomes a key-set pair (E.solo_moved). False
  -- (nothing loaded) when discovery found a flow the entry does not name.
  function E.load_solo(F, p, width)
    local floor, tag, flow = SOLO.parse(p.solo)
    local disc = p.disc
    if disc and (p.nd > 1 or disc[flow] == nil) then return false end
    if tag < floor then tag = floor end
    local Q = p.Q
    local k = {flow = flow, tag = tag, tie = disc and disc[flow] or math.huge, active = true,
      weight = 1, touched = false, gone = false, value = floor, dirty = false, moved = false,
      whole = 2 < width, bound = tag}
    if Q.weighted then
      k.weight = tonumber(redis.call('HGET', queue_key(Q.B, 'key_weights'), flow_key(flow))) or 1
    end
    -- (only these two fields: a pair's table holds 16 without growing)
    p.sk, p.kf = k, k
    local X = F.X
    local live = X.solo_live
    if live == nil then
      live = {}
      X.solo_live = live
    end
    local of = live[Q.OB]
    if of == nil then
      of = {}
      live[Q.OB] = of
    end
    of[p.T] = k
    E.append(F, 'loaded', p)
    return true
  end

  -- Pair p, loaded from B:tsolo, whose entry moved into a key set in this call (its key
  -- left, or a second key joined): from its next pick on it is the key-set pair of the
  -- first read its B:tsolo entry stood for (see load_solo), its key sk listed (out of
  -- play when it left); best_key reads on from there. Returns nil (no B:tsolo key).
  function E.solo_moved(p, sk)
    p.sk = false
    p.keys, p.kat, p.kmoved = {sk}, sk.active and 1 or 2, false
    -- (a read of 2 entries, floor and key, knows the whole set only when it is shorter)
    p.complete, p.width = sk.whole, sk.whole and KEYS_LOADED or 2
    p.bound = sk.whole and math.huge or sk.bound
    E.key_set(p)
    return nil
  end

  -- The name of pair p's key set (a pair loaded from B:tsolo names it only when needed).
  function E.key_set(p)
    local kk = p.kk
    if kk == nil then
      kk = tenant_key(p.Q.OB, p.T, 'keys')
      p.kk = kk
    end
    return kk
  end

  -- Pair p is simple: its one flow is the one whose default tenant it is (a key serving as
  -- its own tenant, or the queue's keyless runs).
  function E.simple_pair(p)
    p.simple = true
    p.flow = string.sub(p.T, 1, 1) == '/' and KEYLESS_FLOW or p.T
  end

  -- The discovered flows (`disc`: flow -> head) that `entries` (a read of the key set) do
  -- not list, sorted; nil when there are none.
  function E.unread(disc, entries)
    local missing = nil
    for flow in pairs(disc) do
      local read = false
      for i = 1, #entries, 2 do
        if entries[i] == flow then
          read = true
          break
        end
      end
      if not read then
        missing = missing or {}
        missing[#missing + 1] = flow
      end
    end
    if missing then table.sort(missing) end
    return missing
  end

  -- Add the keys of `entries` (flow, tag, ... as ZRANGE WITHSCORES gives them) to pair p's:
  -- tags at least the key floor, weights, heads discovered. With `dedupe`, keys it lists
  -- already are passed over.
  function E.list_keys(p, entries, dedupe)
    local Q, disc = p.Q, p.disc
    local floor = p.kf.value
    local listed = nil
    if dedupe then
      listed = {}
      for _, k in ipairs(p.keys) do listed[k.flow] = true end
    end
    if p.kmoved then E.key_settle(p) end
    local added = Q.weighted and {} -- the new keys, for their weights
    local keys = p.keys
    for i = 1, #entries, 2 do
      local flow = entries[i]
      -- (is_key_floor, written out: this loop runs for every entry read)
      if flow ~= KEY_FLOOR_MEMBER and flow ~= FLOOR_MEMBER and not (listed and listed[flow]) then
        local tag = tonumber(entries[i + 1])
        if tag < floor then tag = floor end
        local k = {flow = flow, tag = tag, tie = disc and disc[flow] or math.huge,
          active = true, weight = 1}
        -- (the first key in play needs no place found)
        if #keys < p.kat then keys[#keys + 1] = k else E.key_insert(p, k) end
        if added then added[#added + 1] = k end
      end
    end
    if added and #added > 0 then
      local flows = {}
      for j = 1, #added do flows[j] = flow_key(added[j].flow) end
      local raw = call_list('HMGET', queue_key(Q.B, 'key_weights'), flows)
      for j = 1, #added do added[j].weight = tonumber(raw[j]) or 1 end
    end
  end

  -- Put key k in its place among the keys in play of pair p (keys listed in tag order, as
  -- reads give them, go last after one comparison; else a binary search).
  function E.key_insert(p, k)
    local keys = p.keys
    local lo, hi = p.kat, #keys + 1 -- k goes before keys[hi]; keys before lo are better
    if hi == lo or not E.key_better(k, keys[hi - 1]) then
      keys[hi] = k
      return
    end
    hi = hi - 1
    while lo < hi do
      local mid = lo + (hi - lo - (hi - lo) % 2) / 2
      if E.key_better(k, keys[mid]) then hi = mid else lo = mid + 1 end
    end
    table.insert(keys, lo, k)
  end

  -- The key served last (keys[p.kat], when p.kmoved: its tag moved on) goes to its place
  -- (done before the pair's next pick, not at once: most pairs are picked once per call).
  function E.key_settle(p)
    p.kmoved = false
    local keys, at = p.keys, p.kat
    local kc = keys[at]
    if keys[at + 1] ~= nil and not E.key_better(kc, keys[at + 1]) then
      table.remove(keys, at)
      E.key_insert(p, kc)
    end
  end

  -- After a read of the first entries of p's key set: unless it read the whole set, no
  -- key it did not list has a tag below the last entry's (or the key floor).
  function E.read_bound(p, entries)
    if p.complete then
      p.bound = math.huge
    else
      p.bound = math.max(tonumber(entries[#entries]), p.kf.value)
    end
  end

  -- The next entries of an incompletely read key set (twice as many as the last read, from
  -- its start: the keys that left it in this call are no longer there); the new ones go
  -- to their places. Drops the pair when its set turned out to be empty.
  function E.load_more_keys(F, p)
    p.width = 2 * p.width
    local entries = redis.call('ZRANGE', p.kk, 0, p.width - 1, 'WITHSCORES')
    p.complete = #entries < 2 * p.width
    E.list_keys(p, entries, true)
    E.read_bound(p, entries)
    if E.pair_emptied(F.X, p) then E.drop_pair(p) end
  end

  -- A pair's best key in play and the next best, among the keys it lists.
  function E.listed_best(p)
    if p.kmoved then E.key_settle(p) end
    local keys, at = p.keys, p.kat
    return keys[at], keys[at + 1]
  end

  -- A pair's best key in play and the tag of the next best: while the best it lists may
  -- not be the tenant's (none listed, or its tag above the bound of what was read), more
  -- of the key set is read. The next tag is then at most the bound (a key not read may be
  -- there); nil when there is no other key.
  function E.best_key(F, p)
    local best, second = E.listed_best(p)
    while not p.complete and (best == nil or best.tag > p.bound) do
      E.load_more_keys(F, p)
      best, second = E.listed_best(p)
    end
    local next_tag = second and second.tag
    if not p.complete and (second == nil or next_tag > p.bound) then next_tag = p.bound end
    return best, next_tag
  end

  -- The least tie (longest-waiting known head) of pair p's keys in play, when key kc
  -- (keys[p.kat]) was just served: its new tie, and the rest in key order, where among the
  -- keys of one tag the first has the least tie: so the scan takes the first key of each
  -- tag and skips the others with a binary search (a tenant's keys in play mostly share
  -- a few tags: those served in this call, and those not).
  function E.keys_tie(p, kc)
    local keys = p.keys
    local least, i, n = kc.tie, p.kat + 1, #keys
    while i <= n do
      local k = keys[i]
      if k.tie < least then least = k.tie end
      local tag = k.tag
      i = i + 1
      if i <= n and keys[i].tag == tag then
        local hi = n + 1 -- the first key after the last of this tag
        while i < hi do
          local mid = i + (hi - i - (hi - i) % 2) / 2
          if keys[mid].tag == tag then i = mid + 1 else hi = mid end
        end
      end
    end
    return least
  end

  -- ------------------------------------------------------------------ the pair heap

  -- The active pairs are in a heap by (tenant tag, tie, names), each at most once. A pair
  -- carries the key it was pushed with (hk, ht); one whose key moved since (its tenant
  -- was served through another queue) goes back in with its current key when it comes up.
  function E.pair_less(a, b)
    local x, y = a.hk, b.hk
    if x ~= y then return x < y end
    x, y = a.ht, b.ht
    if x ~= y then return x < y end
    x, y = a.T, b.T
    if x ~= y then return x < y end
    return a.Q.name < b.Q.name
  end

  -- The pair heap's push and pop: heap.lua's, with pair_less written out for the tag and
  -- the tie, the keys that settle nearly every comparison (a Lua call per comparison was
  -- 2 % of a fair dequeue + ack with own keys, measured; the names go to pair_less).
  function E.heap_push(h, v)
    local n = h.n + 1
    h.n = n
    local vk, vt = v.hk, v.ht
    while n > 1 do
      local parent = (n - n % 2) / 2
      local above = h[parent]
      local ak, at = above.hk, above.ht
      if vk ~= ak then
        if vk > ak then break end
      elseif vt ~= at then
        if vt > at then break end
      elseif not E.pair_less(v, above) then
        break
      end
      h[n] = above
      n = parent
    end
    h[n] = v
  end

  -- Pair v goes down from the top of heap h (of n pairs) to its place: the top's key grew
  -- (it was served), or v is the last pair, moved up as the top leaves (heap_pop).
  function E.sift_down(h, v, n)
    local lk, lt, i = v.hk, v.ht, 1
    while true do
      local c = 2 * i
      if c > n then break end
      local child = h[c]
      if c < n then
        local right = h[c + 1]
        local rk, ck = right.hk, child.hk
        if rk ~= ck then
          if rk < ck then c, child = c + 1, right end
        elseif right.ht ~= child.ht then
          if right.ht < child.ht then c, child = c + 1, right end
        elseif E.pair_less(right, child) then
          c, child = c + 1, right
        end
      end
      -- stop unless the child goes before v
      local ck, ct = child.hk, child.ht
      if ck ~= lk then
        if ck > lk then break end
      elseif ct ~= lt then
        if ct > lt then break end
      elseif not E.pair_less(child, v) then
        break
      end
      h[i] = child
      i = c
    end
    h[i] = v
  end

  -- Remove and return the top pair (nil when empty).
  function E.heap_pop(h)
    local n = h.n
    if n == 0 then return nil end
    local top, last = h[1], h[n]
    h[n] = nil
    n = n - 1
    h.n = n
    if n > 0 then E.sift_down(h, last, n) end
    return top
  end

  -- Put pair p in the heap keyed by its tenant's tag and its tie now, when it is still in
  -- play (active, its queue not done). (The checks of a pair in play, and of a fresh key,
  -- are written out here and in top_best / peek_other: a Lua call per check per pick was
  -- about a tenth of the fair serve's own work.)
  function E.push_pair(F, p)
    if p.active and not F.qdone[p.Q.OB] then
      p.hk, p.ht = p.ten.tag, p.tie
      E.heap_push(F.heap, p)
    end
  end

  -- The best pair in play, left at the top of the heap: a pair out of play leaves it, one
  -- whose key moved since it was pushed (its tenant was served through another queue)
  -- goes down with its current key.
  function E.top_best(F)
    local heap, qdone = F.heap, F.qdone
    while true do
      local p = heap[1]
      if p == nil then return nil end
      if p.active and not qdone[p.Q.OB] then
        local tag, tie = p.ten.tag, p.tie
        if p.hk == tag and p.ht == tie then return p end
        p.hk, p.ht = tag, tie
        E.sift_down(heap, p, heap.n)
      else
        E.heap_pop(heap)
      end
    end
  end

  -- The pair at the top of the heap, just served: in play, it goes down with its new key
  -- (one pass, where a pop and a push took two); else it leaves.
  function E.settle_top(F, p)
    local heap = F.heap
    if p.active and not F.qdone[p.Q.OB] then
      p.hk, p.ht = p.ten.tag, p.tie
      E.sift_down(heap, p, heap.n)
    else
      E.heap_pop(heap)
    end
  end

  -- The best pair in play of another tenant than T, whose pair is the heap's top (top_best):
  -- the better of the top's two children when it is in play, fresh and another tenant's
  -- (every other pair's pushed key is at least that child's, and keys only grow); else,
  -- found by taking the best pairs off the top (top_best), all put back.
  function E.peek_other(F, T)
    local heap, qdone = F.heap, F.qdone
    local c, right = heap[2], heap[3]
    if c == nil then return nil end -- (the top is the only pair)
    if right ~= nil then
      local rk, ck = right.hk, c.hk
      if rk ~= ck then
        if rk < ck then c = right end
      elseif right.ht ~= c.ht then
        if right.ht < c.ht then c = right end
      elseif E.pair_less(right, c) then
        c = right
      end
    end
    if c.T ~= T and c.active and not qdone[c.Q.OB]
        and c.hk == c.ten.tag and c.ht == c.tie then
      return c
    end
    local held, found = {}, nil
    while found == nil do
      local p = E.top_best(F)
      if p == nil then break end
      held[#held + 1] = E.heap_pop(heap)
      if p.T ~= T then found = p end
    end
    for i = 1, #held do E.heap_push(heap, held[i]) end
    return found
  end

  -- ------------------------------------------------------------------ phase: serve a round

  -- Serve `got` runs just claimed for pair p (and key kc): advance the tenant's tag (and
  -- the environment's floor) and the key's tag inside the tenant (and its key floor).
  function E.advance(F, p, kc, got)
    local ten = p.ten
    local step = p.Q.quantum / ten.weight
    local start = ten.tag
    -- the floor: the start tag of the run most recently begun (it never decreases)
    local floor, last = F.X.tfloor[F.V], start + (got - 1) * step
    if last > floor.value then floor.value = last end
    ten.tag = start + got * step
    if not ten.touched then
      ten.touched = true
      F.touched[#F.touched + 1] = p.T
    end
    if kc ~= nil then
      local kstep = p.Q.quantum / kc.weight
      local klast = kc.tag + (got - 1) * kstep
      if klast > p.kf.value then
        p.kf.value = klast
        p.kf.dirty = true
      end
      kc.tag = kc.tag + got * kstep
      kc.touched = true
    end
  end

  -- Whether the cap that holds a flow back counts slots it holds (else none can free).
  function E.holds_slot(X, Q, flow, tenant, named, why)
    if why == 'tenant' and named then
      return tenant_running(X, Q.B, Q.V, Q.env_id, Q.name, tenant) > 0
    end
    return flow_running(X, Q, flow) > 0
  end

  -- Key kc of pair p leaves its tenant's key set for this call (drained, or parked until
  -- `due` / a freed slot when `park_why` is set); the pair leaves the candidates with it
  -- when it was the last key.
  function E.key_leaves(F, p, kc, park_why, due)
    kc.active = false
    kc.gone = true
    local X, Q = F.X, p.Q
    if kc == p.sk and not kc.moved then
      SOLO.to_set(X, Q, p.T, nil, false) -- its one key: a key set of its floor is left
    else
      redis.call('ZREM', p.kk or E.key_set(p), kc.flow)
    end
    if park_why then E.park(X, Q, 'k:' .. kc.flow, kc.tag, due) end
    if E.pair_emptied(X, p) then E.drop_pair(p) end
  end

  -- The flow of pair p (key kc) may not start now (`why`, and when a rate allows it
  -- again): park what is held back, or leave it out of this call.
  function E.hold_back(F, p, kc, flow, named, why, next_at)
    local Q = p.Q
    if why == 'total' or why == 'rate:queue' then
      E.note(F, 'qdone', Q.OB, true)
    elseif (why == 'key' or why == 'tenant')
        and not E.holds_slot(F.X, Q, flow, p.T, named, why) then
      -- a cap at or below 0 holds it back: no slot of it can free, so it is not parked
      -- (it waits for a settings change); this call skips it
      if kc ~= nil and why == 'key' then kc.active = false else p.active = false end
    elseif why == 'key' and not p.simple then
      E.key_leaves(F, p, kc, why, nil)
      if Q.borrow then E.append(F, 'lenders', {p = p, flow = flow, kc = kc}) end
    elseif why == 'key' or why == 'tenant' then
      p.active = false
      E.park_pair(F.X, Q, p.T, p.ten.tag, nil)
      if Q.borrow then E.append(F, 'lenders', {p = p, flow = flow, kc = kc}) end
    elseif why == 'rate:tenant' or (why == 'rate:key' and p.simple) then
      p.active = false
      E.park_pair(F.X, Q, p.T, p.ten.tag, next_at)
    elseif why == 'rate:key' then
      E.key_leaves(F, p, kc, why, next_at)
    elseif kc ~= nil then
      kc.active = false -- this key had its share of the call (max_per_key)
    else
      p.active = false
    end
  end

  -- How many runs pair p (key kc) takes before its start tag passes the next tenant's
  -- (`second`) or the read `bound`, or, inside the tenant, the next key's (`next_tag`), at
  -- most `take`. A tie is settled by the next pick, with the new heads.
  function E.run_length(p, kc, next_tag, second, take, bound)
    local run = take
    local step = p.Q.quantum / p.ten.weight
    -- before the next tenant's tag, or a pair not read yet (from the read bound on)
    local stop = bound
    if second ~= nil and second.ten.tag < stop then stop = second.ten.tag end
    -- (k = max(1, ceil(steps)), without the two calls when steps <= 1: most picks)
    if stop < math.huge then
      local steps = (stop - p.ten.tag) / step - 1e-9
      local k = steps > 1 and math.ceil(steps) or 1
      if k < run then run = k end
    end
    if kc ~= nil and next_tag ~= nil then
      local steps = (next_tag - kc.tag) / (p.Q.quantum / kc.weight) - 1e-9
      local k = steps > 1 and math.ceil(steps) or 1
      if k < run then run = k end
    end
    return run
  end

  -- Claim `run` runs of pair p's flow (key kc), advance the tags, and settle what the
  -- flow's new head says: drained, only future runs (parked until due), or more to serve.
  function E.serve_flow(F, p, kc, flow, run, buckets, sid)
    local X, Q = F.X, p.Q
    local got, head = claim(X, Q, flow, run, F.lease_ms, F.out)
    took(X, Q, flow, buckets, got)
    if got > 0 then
      F.served = F.served + got
      if sid then E.note(F, 'served_of', sid, (F.served_of[sid] or 0) + got) end
      E.advance(F, p, kc, got)
      -- its new head competes from now on
      if kc == p.sk then
        kc.tie = head or math.huge
        p.tie = kc.tie
      elseif kc ~= nil then
        kc.tie = head or math.huge
        p.tie = E.keys_tie(p, kc) -- over its keys in play, this one included
      else
        p.tie = head or math.huge
      end
    end
    if head == nil then -- the flow drained
      if kc ~= nil then E.key_leaves(F, p, kc, nil, nil) else E.drop_pair(p) end
    elseif head > X.now then -- only future runs left: out of the order until they are due
      wait_until(F.R, head)
      if kc ~= nil then
        E.key_leaves(F, p, kc, 'due', head)
      else
        p.active = false
        E.park_pair(X, Q, p.T, p.ten.tag, head)
      end
    elseif got == 0 then
      if kc ~= nil then kc.active = false else p.active = false end
    end
  end

  -- One pick: the best pair's best flow, served (or held back) under the gates.
  function E.serve_pick(F, p, second)
    local Q = p.Q
    if not p.simple and p.keys == nil and not p.sk then E.load_keys(F, p) end
    local flow, kc, next_tag, named
    if p.simple then
      flow, named = p.flow, false -- (a simple flow names no tenant)
    else
      kc = p.sk -- (a tenant kept in B:tsolo: its one key, no key order to keep)
      if kc and kc.moved then kc = E.solo_moved(p, kc) end
      if not kc then
        kc, next_tag = E.best_key(F, p)
      elseif not kc.active then
        kc = nil
      elseif not kc.whole then
        -- as the first read of its key set would serve it (see load_solo): up to that
        -- read's bound, then (reading on) the whole set is known
        if kc.tag > kc.bound then kc.whole = true else next_tag = kc.bound end
      end
      if kc == nil then
        -- nothing left in this pair in this call (drained, or every key held back)
        p.active = false
        return kc
      end
      flow = kc.flow
      named = kc == p.sk or flow_tenant(flow) ~= nil
    end
    -- runs of this flow served in this call count against max_per_key (when set)
    local sid = Q.max_per_key and (Q.B .. '|' .. flow)
    local room = F.budget - F.served
    if sid then room = math.min(room, Q.max_per_key - (F.served_of[sid] or 0)) end
    local take, buckets, why, next_at = flow_allowance(F.X, Q, flow, p.T, named, room, F.R,
      false)
    if take <= 0 then
      E.hold_back(F, p, kc, flow, named, why, next_at)
    else
      E.serve_flow(F, p, kc, flow, E.run_length(p, kc, next_tag, second, take, F.bound), buckets,
        sid)
    end
    return kc
  end

  -- Phase 2: the SFQ loop over the active pairs, until the budget is spent or nobody is
  -- left; or until the best pair's tag passes what the gather read (F.bound) or nobody is
  -- left while a queue was not read to its end: then it sets F.widen (read more first).
  function E.serve_round(F)
    F.heap = {n = 0}
    F.widen = false
    local plist = F.plist
    for i = 1, #plist do E.push_pair(F, plist[i]) end
    while F.served < F.budget do
      local p = E.top_best(F)
      if p == nil or p.ten.tag > F.bound then
        F.widen = F.bound < math.huge
        break
      end
      local kc = E.serve_pick(F, p, E.peek_other(F, p.T))
      -- the key just picked (keys[p.kat]): when it is still in play (its tag and tie
      -- moved), it goes to its new place before the pair's next pick (key_settle: most
      -- pairs are picked once per call); else the keys in play start after it
      if kc ~= nil and kc ~= p.sk then
        if kc.active then p.kmoved = true else p.kat = p.kat + 1 end
      end
      -- still in play (another of its keys, or its next runs): down with its new tag
      E.settle_top(F, p)
    end
  end

  -- ------------------------------------------------------------------ phases: borrow, write back

  -- Phase 3, borrowing: capped keys and tenants (F.lenders) may take slots nobody else of
  -- the queue can use now; never preempts.
  function E.borrow_idle_slots(F)
    local X = F.X
    for _, l in ipairs(F.lenders) do
      if F.served >= F.budget then break end
      local p, flow = l.p, l.flow
      local Q = p.Q
      local named = flow_tenant(flow) ~= nil
      local take, buckets = flow_allowance(X, Q, flow, p.T, named, F.budget - F.served, F.R, true)
      if take > 0 then
        local got = claim(X, Q, flow, take, F.lease_ms, F.out)
        took(X, Q, flow, buckets, got)
        if got > 0 then
          F.served = F.served + got
          E.advance(F, p, l.kc, got)
        end
      end
    end
  end

  --- A sorted set of the order's state that holds this many members or more is kept by
  --- the server as a skiplist, not as the compact list it keeps sets of up to 128 in
  --- (zset-max-listpack-entries): in a list, updating one member's tag scans the members
  --- before it, so with 100 tenants the tags' write-back cost 3 % of a dequeue. Adding a
  --- member longer than a list keeps (64 bytes) converts the set, and removing it at
  --- once leaves it converted (a server never converts a set back), so no reader sees it.
  --- (Fields of E, not locals: the fair build is at Lua's 200 locals.)
  E.WIDE_AT = 32
  -- 65 bytes, no tenant's or key's name
  E.WIDE_MEMBER = '~wide~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~'

  -- Keep a big set of the order's state a skiplist (see E.WIDE_AT); checked on ticks, for
  -- the sets a read of this call found may be big (V:tt, when a B:tq read came back full).
  function E.keep_wide(key)
    if redis.call('ZCARD', key) < E.WIDE_AT then return end
    -- (pcall: a server whose ACL refuses OBJECT leaves the set as it is)
    if redis.pcall('OBJECT', 'ENCODING', key) ~= 'listpack' then return end
    redis.call('ZADD', key, 0, E.WIDE_MEMBER)
    redis.call('ZREM', key, E.WIDE_MEMBER)
  end

  -- The tenants' tags: V:tt (authoritative, with the floor), the copies in B:tq.
  function E.write_tenant_tags(F, tick)
    local X, V = F.X, F.V
    local f = X.tfloor[V]
    local tt = env_key(V, 'tenant_tags')
    local tt_args, by_queue = {}, {}
    local touched, ten = F.touched, F.ten
    for i = 1, #touched do
      local T = touched[i]
      tt_args[2 * i - 1], tt_args[2 * i] = ten[T].tag, T
    end
    if #tt_args > 0 or f.value > f.start or not f.stored then
      tt_args[#tt_args + 1] = f.value
      tt_args[#tt_args + 1] = FLOOR_MEMBER
      call_chunked('ZADD', tt, tt_args)
    end
    if tick then
      redis.call('ZREMRANGEBYSCORE', tt, '-inf', '(' .. exact(f.value))
      redis.call('EXPIRE', tt, X.C.state_ttl)
      if F.full ~= E.NONE then E.keep_wide(tt) end
    end
    local plist = F.plist
    for i = 1, #plist do
      local p = plist[i]
      if p.ten.touched and not p.dropped then
        local args = by_queue[p.Q.OB] or {}
        by_queue[p.Q.OB] = args
        args[#args + 1] = p.ten.tag
        args[#args + 1] = p.T
      end
    end
    for B, args in pairs(by_queue) do
      call_chunked('ZADD', queue_key(B, 'ready_tenants'), args, 'XX')
      if tick then
        redis.call('EXPIRE', queue_key(B, 'ready_tenants'), X.C.state_ttl)
        if F.full[B] then E.keep_wide(queue_key(B, 'ready_tenants')) end
      end
    end
  end

  -- The keys of the tenants read in this call: one HSET a queue for the B:tsolo entries
  -- (a tenant with one key in play), the key sets of the others.
  function E.write_key_tags(F, tick)
    local loaded = F.loaded
    local solo = nil -- B -> its B:tsolo entries to write
    for i = 1, #loaded do
      local p = loaded[i]
      local sk = p.sk
      if sk and not sk.moved then
        if sk.touched then
          solo = solo or {}
          local args = solo[p.Q.OB] or {}
          solo[p.Q.OB] = args
          args[#args + 1] = p.T
          args[#args + 1] = SOLO.value(sk.value, sk.tag, sk.flow)
        end
      else
        -- a key set: its keys still in it (not drained or parked), and its floor (the
        -- arguments made for the first: most served keys drain)
        local args = nil
        if sk then
          if sk.touched and not sk.gone then args = {sk.tag, sk.flow} end
        else
          local keys = p.keys
          for j = 1, #keys do
            local k = keys[j]
            if k.touched and not k.gone then
              args = args or {}
              args[#args + 1] = k.tag
              args[#args + 1] = k.flow
            end
          end
        end
        local kf = p.kf
        if kf.dirty then
          args = args or {}
          args[#args + 1] = kf.value
          args[#args + 1] = KEY_FLOOR_MEMBER
          kf.dirty = false
        end
        if args then
          local kk = E.key_set(p)
          call_chunked('ZADD', kk, args)
          if tick then
            redis.call('EXPIRE', kk, F.X.C.state_ttl)
            if not (p.complete or sk) then E.keep_wide(kk) end
          end
        end
      end
    end
    if solo == nil then return end
    for B, args in pairs(solo) do
      call_chunked('HSET', queue_key(B, 'solo_keys'), args)
      if tick then redis.call('EXPIRE', queue_key(B, 'solo_keys'), F.X.C.state_ttl) end
    end
  end

  -- Phase 4: write the tags back. TTLs are refreshed (and tags the floor passed pruned)
  -- when the floor crossed a tick.
  function E.write_back(F)
    local X = F.X
    if X.tfloor == nil or X.tfloor[F.V] == nil then return end -- no candidate: nothing read
    local tick = E.floor_ticked(X, F.V)
    E.write_tenant_tags(F, tick)
    E.write_key_tags(F, tick)
  end

  -- The fair queues of one environment at one priority level, served in one SFQ order
  -- over (tenant, queue) pairs: gather and serve rounds (a round that parks gated
  -- candidates may uncover others behind them: gather again while rounds park, bounded, so
  -- keys at their cap cannot hide servable ones). `heads` maps a queue name to its ready
  -- keyless head (or nil). Returns the serve state (borrowing and the write-back come
  -- after every level: fair_finish).
  function E.fair_serve(X, env, level, queues, heads, budget, lease_ms, out, R)
    local F = E.serve_state(X, env, level, queues, heads, budget, lease_ms, out, R)
    local parked_any = false
    for round = 1, MAX_ROUNDS do
      X.parked_now = false
      if E.gather(F) == 0 and round > 1 and not F.widen then break end
      E.serve_round(F)
      parked_any = parked_any or X.parked_now
      if F.served >= budget or not (X.parked_now or F.widen) then break end
      if F.widen then E.widen(F) end
    end
    -- still nothing served but candidates were parked: more may lie behind them, so the
    -- caller should come back at once rather than sleep
    if F.served == 0 and parked_any then wait_until(R, X.now) end
    return F
  end

  -- After every level was served: borrowing (capped keys take the slots nobody else
  -- could use, `room` left in the call) and the write-back of one level's serve state.
  -- Returns the runs borrowed.
  function E.fair_finish(F, room)
    local before = F.served
    F.budget = before + room
    E.borrow_idle_slots(F)
    E.write_back(F)
    return F.served - before
  end

  -- The environment's place in the fair order across the environments of its shard.
  -- (Only for dequeues that chose this environment among the shard's: a dequeue limited
  -- to one environment, a worker's, does not compete with the others.) The shard's
  -- environment virtual time is the member '~floor' of T:etag.
  function E.env_charge(X, env, served)
    if served <= 0 or not X.charge_env then return end
    local etag = shard_key(X.tag, 'env_tags')
    local got = redis.call('ZMSCORE', etag, env.env_id, FLOOR_MEMBER)
    local floor = tonumber(got[2]) or 0
    local tag = tonumber(got[1]) or floor
    if tag < floor then tag = floor end
    local weight = tonumber(redis.call('HGET', shard_key(X.tag, 'env_weights'), env.env_id)) or 1
    redis.call('ZADD', etag, tag + served / weight, env.env_id, math.max(floor, tag), FLOOR_MEMBER)
    redis.call('EXPIRE', etag, X.C.state_ttl)
  end

  -- Serve the ready heads of one environment: level by level, the fair queues of a level
  -- together in one SFQ order (placed where their oldest head is), the age-order queues
  -- as in the age order; then the fair levels' borrowing and write-back.
  HOOK.serve = function(X, env, by_name, ready, budget, lease_ms, out, R)
    local fair, heads = {}, {}  -- level -> its fair queue views; level -> queue -> head
    for _, entry in ipairs(ready) do
      local Q = by_name[entry.queue]
      if Q.order == 'fair' then
        local level = entry.level
        if fair[level] == nil then fair[level], heads[level] = {}, {} end
        local of_level = heads[level]
        if of_level[Q.name] == nil then
          of_level[Q.name] = false
          fair[level][#fair[level] + 1] = level_view(Q, level)
        end
        if entry.kind == KIND_QUEUE then of_level[Q.name] = entry.score end
      end
    end
    local states = {}
    local served, fair_any = serve_entries(X, by_name, ready, budget, lease_ms, out, R,
      function(level, room)
        local of_level = {}
        for name, head in pairs(heads[level]) do if head then of_level[name] = head end end
        local F = E.fair_serve(X, env, level, fair[level], of_level, room, lease_ms, out, R)
        states[#states + 1] = F
        return F.served
      end)
    for _, F in ipairs(states) do served = served + E.fair_finish(F, budget - served) end
    if fair_any then E.env_charge(X, env, served) end
    return served
  end
end
