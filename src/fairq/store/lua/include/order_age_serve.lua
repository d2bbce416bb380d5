-- order_age_serve.lua: the serve engine of the age order, only in the dequeue's age
-- build: every ready queue of the environment served oldest head first (serve_age.lua),
-- then borrowing.
--@require state config runs claim gates serve_age order_age

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
