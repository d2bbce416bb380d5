-- claim.lua: lease the ready runs at the head of one flow.
--@require state counters runs

local claim
do
  -- (its helpers are locals of this block only: a library's main chunk may hold at most
  -- 200 locals at a time)

  -- Lease one run `run` (its entry's score `score`) of queue Q: a stale entry (hash gone)
  -- is passed over, a run whose TTL passed is reported, any other is delivered (appended
  -- to `out` and `taken`). Returns how long a delivered run waited (ms), else nil.
  local function claim_run(X, Q, run, ck, ta, deadline, taken, out)
    local member = Q.env_id .. ':' .. run
    local mkey = run_key(X.tag, member)
    local payload, attempts, score, enqueued_at, ttl_deadline, lease_token, timeout,
      outcome_policy, trace = run_read_claim(mkey)
    local expires = tonumber(ttl_deadline)
    if not payload then
      return nil -- stale: the run was finished elsewhere; nothing to deliver
    elseif expires > 0 and expires <= X.now then
      expire_run(X, Q, ck, run, member, tonumber(attempts))
      return nil
    end
    local token = tonumber(lease_token) + 1
    if expires > 0 then
      -- a delivered run loses its TTL (a retry must not expire it)
      redis.call('HSET', mkey, RUN_FIELD.state, 'running', RUN_FIELD.lease_deadline, deadline,
        RUN_FIELD.lease_start, X.now, RUN_FIELD.lease_token, token, RUN_FIELD.slot_tenant, ta,
        RUN_FIELD.ttl_deadline, 0)
      X.ttl_del[#X.ttl_del + 1] = member
    else
      redis.call('HSET', mkey, RUN_FIELD.state, 'running', RUN_FIELD.lease_deadline, deadline,
        RUN_FIELD.lease_start, X.now, RUN_FIELD.lease_token, token, RUN_FIELD.slot_tenant, ta)
    end
    X.lease_add[#X.lease_add + 1] = deadline
    X.lease_add[#X.lease_add + 1] = member
    taken[#taken + 1] = run
    delivery_add(out, run, Q.name, payload, ck, ta, attempts, token, score, enqueued_at,
      timeout or 0, outcome_policy, trace)
    return math.max(0, X.now - (tonumber(score) or X.now))
  end

  -- After a claim of flow `flow` (tenant `ta`): the slots and counters of the runs
  -- `taken`, the flow's new `head` (nil = empty) in the heads index or ck_index, and the
  -- history of the `delivered` runs (`waited` ms in all).
  local function claim_settle(X, Q, flow, ta, taken, head, delivered, waited)
    if #taken > 0 then
      call_chunked('SADD', flow_slots_key(Q, flow), taken)
      if not flow_keyless(flow) then ck_running_add(X, Q.B, Q.V, Q.env_id, Q.name, #taken) end
      if ta ~= '' then tenant_running_add(X, Q.B, Q.V, Q.env_id, Q.name, ta, #taken) end
      local env_take = X.env_take[Q.V] or {}
      X.env_take[Q.V] = env_take
      for _, run in ipairs(taken) do env_take[#env_take + 1] = run end
    end
    if flow == KEYLESS_FLOW then
      touch(X, Q, KIND_QUEUE)
      -- the keyless queue's new head is known: the heads index needs no read
      X.head_known = X.head_known or {}
      X.head_known[Q.OB] = head or false
    else
      touch(X, Q, KIND_CK)
      ck_index_set(X, Q.OB, flow, head or false)
    end
    if delivered > 0 then
      history_add(X, Q, 'served', delivered)
      history_add(X, Q, 'wait_ms', waited)
      local tenant = ta ~= '' and ta or default_tenant(Q.name, flow)
      history_add(X, Q, HISTORY.tenant_prefix .. tenant, delivered)
    end
  end

  -- Claim up to `limit` ready runs (score <= now, oldest first) of flow `flow` of queue
  -- Q into their slots, leasing each until now + lease_ms. The runs' slots count under
  -- the flow's named tenant (its `ta`, '' = none). Stale entries (hash gone) are
  -- dropped; runs whose TTL passed are reported, never delivered. Each delivered run is
  -- appended to `out` (delivery_add: the fields fairq/store/run_hash.py's
  -- DELIVERY_FIELDS lists). With `max_score`, only runs scored below it (or equal, when
  -- `tie_ok`) are claimed. Returns the number delivered and the flow's next head score
  -- (nil = empty).
  function claim(X, Q, flow, limit, lease_ms, out, max_score, tie_ok)
    local ta = flow_tenant(flow) or ''
    local ck = flow_key(flow)
    local queued_key = flow_queued_key(Q, flow)
    local delivered, head, waited = 0, nil, 0
    local taken = {}
    local deadline = X.now + lease_ms
    for _ = 1, 8 do -- bounded: each round removes every run it looked at
      local want = limit - delivered
      if want <= 0 then break end
      -- want + 1 entries by rank: the ready ones to claim, and what follows (the new head)
      local entries = redis.call('ZRANGE', queued_key, 0, want, 'WITHSCORES')
      head = nil
      local looked = {}
      for i = 1, #entries, 2 do
        local run, score = entries[i], tonumber(entries[i + 1])
        local past = max_score ~= nil
          and (score > max_score or (score == max_score and not tie_ok))
        if score > X.now or #looked >= want or past then
          head = score
          break
        end
        looked[#looked + 1] = run
        local wait = claim_run(X, Q, run, ck, ta, deadline, taken, out)
        if wait ~= nil then
          waited = waited + wait
          delivered = delivered + 1
        end
      end
      if #looked > 0 then
        local gone = call_chunked('ZREM', queued_key, looked)
        if gone > 0 and flow ~= KEYLESS_FLOW then
          ck_queued_add(X, Q.B, Q.V, Q.env_id, Q.name, -gone)
        end
      end
      -- head == nil: every entry there was consumed, so the flow is empty
      if head == nil or head > X.now or (max_score ~= nil and head >= max_score) then break end
    end
    claim_settle(X, Q, flow, ta, taken, head, delivered, waited)
    return delivered, head
  end
end
