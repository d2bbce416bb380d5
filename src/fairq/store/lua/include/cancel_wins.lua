-- cancel_wins.lua: a cancel asked while a run ran wins over any further attempt.
-- cancel.lua marks a running run (its cancel_requested field); the scripts that would
-- give that run another attempt (nack: a retry or a dead letter; reclaim: a lapsed
-- lease) end it cancelled instead, and a redrive starts clean.
--@require runs

-- End a run cancelled: record its outcome and a recent entry, count it, forget its
-- hash (and with it the mark). The caller has freed its slots and its lease.
-- `run_fields` holds what the run's hash said: ck, tenant (named at enqueue, nil =
-- none), slot_tenant (the tenant it was counted under, '' = none), attempts, started
-- (its lease start, nil = it never ran) and error (of the attempt that ended, '' = none).
local function end_cancelled(X, Q, member, run, run_fields)
  local r = run_fields
  redis.call('DEL', run_key(X.tag, member))
  write_outcome(X, member, {status = 'cancelled', queue = Q.name, key = r.ck,
    tenant = r.tenant or '', attempts = r.attempts, started_at = r.started,
    finished_at = X.now, error = r.error ~= '' and r.error or nil})
  recent_add(X, Q, run, 'cancelled', r.attempts, r.started, r.ck, r.slot_tenant)
  history_add(X, Q, 'cancelled', 1)
end
