-- order_age.lua: the order hooks of the age order. The age order keeps no state of its
-- own (it serves oldest heads first), so most hooks do nothing. This file never touches
-- a fair-order key: a script built with it runs exactly the age order.
--@require state config runs serve_age

HOOK.flow_queued = function(X, Q, flow, score, is_new) end
HOOK.flow_drained = function(X, Q, flow) end
HOOK.slot_freed = function(X, Q, flow, ta) end
HOOK.charge = function(X, Q, flow, ta, duration_ms) end
HOOK.finish = function(X) end

-- The age-order scripts refuse to act on a queue whose order is fair (nothing written):
-- the caller then runs the fair-order build, which serves both orders.
HOOK.needs_fair = function(by_name) return any_fair(by_name) end

-- An enqueue needs only its queue's size limit and order (and named flag) here.
HOOK.enqueue_config = function(X, V, env_id, queue)
  return enqueue_config_read(X, V, env_id, queue)
end

-- Serve the ready heads-index entries of one environment, oldest head first.
-- `ready` is a list of {kind, queue, score}; `by_name` the queues' configs.
HOOK.serve = function(X, env, by_name, ready, budget, lease_ms, out, R)
  local served, lenders = 0, {}
  for _, entry in ipairs(ready) do
    if served >= budget then break end
    local Q = by_name[entry.queue]
    if entry.kind == KIND_QUEUE then
      served = served + serve_keyless(X, Q, budget - served, lease_ms, out, R)
    else
      served = served + serve_ck_age(X, Q, budget - served, lease_ms, out, R, lenders)
    end
  end
  if served < budget and #lenders > 0 then
    served = served + serve_borrowers(X, lenders, budget - served, lease_ms, out, R)
  end
  return served
end
