"""What each limit layer costs the server per dequeue call (INFO commandstats, script-
internal commands included), against the same workload without it, in both orders.

Workload: one queue with 40 keyless runs, 10 keys serving as their own tenants and 10
keys of the named tenant ``acme`` (8 runs each); 12 dequeue calls of up to 10 runs at
one logical time, each followed by an ack of what it got (acks not counted). Each layer
is set so that it does not bind (the same runs are served, in the same order), so the
difference is the price of checking it: the total cap (1000), a cap override for every
key (50, below the env limit so that it is read), a cap for the named tenant (50), a
per-key rate limit (100,000/s, burst 1000). Borrowing is priced on a workload where it
acts: every key and the named tenant capped at 1, with and without ``borrow`` (per run
served, since it serves more per call).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from tests.integration.commandstats import reset_stats, total_calls
from tests.integration.limits_support import (
    T0,
    Order,
    both_orders,
    enqueue_runs,
    queue_for,
)

from fairq.keys import Environment
from fairq.store import RunQueue

Q = "cost"
CALLS = 12
NOW = T0 + 50_000
OWN = [f"k{i:02d}" for i in range(10)]
ACME = [f"m{i:02d}" for i in range(10)]

Layer = Callable[[RunQueue, Environment], Awaitable[None]]


async def _none(rq: RunQueue, env: Environment) -> None:
    return None


async def _total(rq: RunQueue, env: Environment) -> None:
    await rq.set_queue_total_concurrency(env, Q, 1000)


async def _key_caps(rq: RunQueue, env: Environment) -> None:
    for k in OWN + ACME:
        await rq.set_key_concurrency(env, Q, k, 50)


async def _tenant_cap(rq: RunQueue, env: Environment) -> None:
    await rq.set_tenant_concurrency(env, Q, "acme", 50)


async def _rate(rq: RunQueue, env: Environment) -> None:
    await rq.set_rate_limit(env, Q, 100_000, burst=1000, per="key")


async def _capped(rq: RunQueue, env: Environment) -> None:
    # every key (and the keyless runs) at 1, and the named tenant at 1 across its keys:
    # the call has more room than the caps let it use
    await rq.set_queue_concurrency(env, Q, 1)
    await rq.set_tenant_concurrency(env, Q, "acme", 1)


async def _borrowing(rq: RunQueue, env: Environment) -> None:
    await _capped(rq, env)
    await rq.set_queue_options(env, Q, borrow=True)


LAYERS: dict[str, Layer] = {
    "none": _none,
    "total cap": _total,
    "key cap overrides": _key_caps,
    "tenant cap": _tenant_cap,
    "rate limit (per key)": _rate,
    "capped at 1": _capped,
    "capped at 1 + borrow": _borrowing,
}
#: Most extra commands per dequeue call each non-binding layer may add.
BOUNDS = {"total cap": 3, "key cap overrides": 30, "tenant cap": 18, "rate limit (per key)": 16}


async def _measure(rq: RunQueue, env: Environment, layer: Layer) -> tuple[int, int, list[str]]:
    """(commands, runs served, run ids in order) over the CALLS dequeue calls."""
    await rq.set_env_limits(env, concurrency=100)
    await layer(rq, env)
    await enqueue_runs(rq, env, Q, "n", 40)
    for k in OWN:
        await enqueue_runs(rq, env, Q, f"{k}-", 8, key=k)
    for k in ACME:
        await enqueue_runs(rq, env, Q, f"{k}-", 8, key=k, tenant="acme")
    commands, order = 0, []
    for _ in range(CALLS):
        await reset_stats(rq.client)
        got = await rq.dequeue(10, env=env, queues=[Q], now_ms=NOW)
        commands += await total_calls(rq.client) - 1  # the script call itself counts once
        order += [d.run_id for d in got]
        await rq.ack(got, now_ms=NOW)
    return commands, len(order), order


@both_orders
async def test_what_each_limit_layer_costs_per_dequeue_call(
    make_queue: Any, order: Order, capsys: pytest.CaptureFixture[str]
) -> None:
    """Prints the commands per dequeue call of each layer and its extra over the
    workload without it; a non-binding layer serves the same runs in the same order and
    adds at most its bound; borrowing serves more per call than capping alone, at no
    higher cost per run served."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=10)
    results: dict[str, tuple[int, int, list[str]]] = {}
    for i, (name, layer) in enumerate(LAYERS.items()):
        results[name] = await _measure(rq, Environment("org1", "proj1", f"c{i}"), layer)
    base, base_served, base_order = results["none"]
    lines = [f"[{order}] commands per dequeue call ({CALLS} calls of up to 10 runs)"]
    for name, (commands, served, _) in results.items():
        ref = results["capped at 1"] if name == "capped at 1 + borrow" else results["none"]
        extra = (commands - ref[0]) / CALLS
        lines.append(
            f"  {name:22} {commands / CALLS:6.1f}/call  {commands / max(served, 1):5.2f}/run"
            f"  served {served:3}  extra {extra:+6.1f}/call"
        )
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    for name, bound in BOUNDS.items():
        commands, served, run_order = results[name]
        assert run_order == base_order, name  # it did not bind
        assert (commands - base) / CALLS <= bound, (name, commands, base)
    assert base_served == CALLS * 10
    capped, lent = results["capped at 1"], results["capped at 1 + borrow"]
    assert lent[1] > capped[1]
    assert lent[0] / lent[1] <= capped[0] / capped[1]  # borrowing costs no more per run
