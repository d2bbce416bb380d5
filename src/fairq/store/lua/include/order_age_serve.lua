-- order_age_serve.lua: the serve engine of the age order, only in the dequeue's age
-- build: every ready queue of the environment served oldest head first (serve_age.lua),
-- then borrowing.
--@require state config runs claim gates serve_age order_age

-- Serve the ready heads-index entries of one environment, oldest head first.
-- `ready` is a list of {kind, queue, score}; `by_name` the queues' configs.
HOOK.serve = function(X, env, by_name, ready, budget, lease_ms, out, R)
  return (serve_entries(X, by_name, ready, budget, lease_ms, out, R, nil))
end
