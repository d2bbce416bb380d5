-- order_age.lua: the order hooks of the age order. The age order keeps no state of its
-- own (it serves oldest heads first), so most hooks do nothing. This file never touches
-- a fair-order key: a script built with it runs exactly the age order.
--@require state runs

HOOK.flow_queued = function(X, Q, flow, score, is_new) end
HOOK.flow_drained = function(X, Q, flow) end
HOOK.slot_freed = function(X, Q, flow, ta) end
HOOK.charge = function(X, Q, flow, ta, duration_ms) end
HOOK.finish = function(X) end
HOOK.use_pool = function(X, env, by_name, pool) end

-- The age-order scripts refuse to act on a queue whose order is fair (nothing written):
-- the caller then runs the fair-order build, which serves both orders.
HOOK.needs_fair = function(by_name)
  for _, q in pairs(by_name) do
    if q.order == 'fair' then return true end
  end
  return false
end

-- The enqueue's form of needs_fair: one queue context.
HOOK.needs_fair_queue = function(Q) return Q.order == 'fair' end

-- An enqueue needs only its queue's size limit and order (and named flag) here.
HOOK.enqueue_joins = false
-- flow_queued does nothing: whether a flow's head in the heads index is new or lower
-- than before need not be told apart.
HOOK.asks_new_flow_head = false
