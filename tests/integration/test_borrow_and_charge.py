"""Borrowing (capped keys may use idle slots) and charging by run time, step-driven on a
logical clock with a fixed number of slots (the env limit).

Each step: ack the runs whose hold ended, enqueue that step's arrivals, then ONE dequeue
call for up to ``SLOTS`` runs at ``now = step * STEP_MS``. A run's hold is a number of
steps, so its run time on the script clock (lease start to ack) is ``hold * STEP_MS``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.integration.limits_support import T0, Order, both_orders, enqueue_runs, queue_for

from fairq.keys import Environment
from fairq.models import Delivery
from fairq.store import RunQueue

Q = "lend"
SLOTS = 4
STEP_MS = 100


@dataclass
class Trace:
    """What a step-driven drain saw."""

    #: step -> key -> runs started
    starts: dict[int, Counter[str]] = field(default_factory=dict)
    #: step -> key -> runs it held when the step's call began (after the acks)
    held: dict[int, Counter[str]] = field(default_factory=dict)
    #: key -> slot-steps held
    slot_steps: Counter[str] = field(default_factory=Counter)
    #: the step whose call found nothing queued or running (the makespan)
    end: int = -1

    def started(self, key: str, step: int) -> int:
        return self.starts.get(step, Counter())[key]


async def drive(
    rq: RunQueue,
    env: Environment,
    *,
    hold: Callable[[Delivery], int],
    arrivals: dict[int, list[tuple[str, int]]] | None = None,
    steps: int = 400,
    stop_when_empty: bool = True,
) -> Trace:
    """Run the step loop; ``arrivals``: step -> [(key, how many runs)]."""
    trace = Trace()
    running: list[tuple[int, Delivery]] = []
    for step in range(steps):
        now = T0 + 10_000 + step * STEP_MS
        done = [d for end, d in running if end <= step]
        running = [(end, d) for end, d in running if end > step]
        if done:
            await rq.ack(done, now_ms=now)
        for key, n in (arrivals or {}).get(step, []):
            await enqueue_runs(rq, env, Q, f"{key}.{step}-", n, key=key, at=now - n)
        trace.held[step] = Counter(str(d.concurrency_key) for _, d in running)
        got = await rq.dequeue(SLOTS, env=env, queues=[Q], now_ms=now)
        trace.starts[step] = Counter(str(d.concurrency_key) for d in got)
        running += [(step + hold(d), d) for d in got]
        for _, d in running:
            trace.slot_steps[str(d.concurrency_key)] += 1
        if stop_when_empty and not running:
            stats = await rq.queue_stats(env, Q)
            if stats.queued == 0 and (not arrivals or step >= max(arrivals)):
                trace.end = step
                return trace
    return trace


async def lender(make_queue: Any, env: Environment, order: Order, **options: Any) -> RunQueue:
    """A queue on ``SLOTS`` slots; with ``cap`` the per-key limit, with ``borrow`` on."""
    rq = await queue_for(make_queue, order, max_per_key_per_call=SLOTS)
    await rq.set_env_limits(env, concurrency=SLOTS)
    if options.get("cap") is not None:
        await rq.set_queue_concurrency(env, Q, options["cap"])
    if options.get("borrow"):
        await rq.set_queue_options(env, Q, borrow=True)
    return rq


def one_step(_: Delivery) -> int:
    return 1


# --------------------------------------------------------------------------- borrowing


@both_orders
async def test_a_lone_capped_key_drains_with_the_uncapped_makespan(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """40 one-step runs of one key on 4 slots: uncapped it drains in 10 steps; capped at
    1 it takes 40; capped at 1 with borrowing it drains in the uncapped 10 steps again,
    using every slot of every step."""
    makespans = {}
    for name, options in {
        "uncapped": {}, "capped": {"cap": 1}, "borrowing": {"cap": 1, "borrow": True},
    }.items():  # fmt: skip
        e = Environment("org1", "proj1", f"{order}{name}")
        rq = await lender(make_queue, e, order, **options)
        trace = await drive(rq, e, hold=one_step, arrivals={0: [("a", 40)]})
        makespans[name] = trace.end
        if name == "borrowing":
            assert all(trace.started("a", s) == SLOTS for s in range(10)), trace.starts
    print(f"\n[{order}] makespan in steps: {makespans}")
    assert makespans == {"uncapped": 10, "capped": 40, "borrowing": 10}


@both_orders
async def test_a_contender_is_served_as_if_nobody_borrowed(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """Key ``a`` (cap 1, borrowing, 40 one-step runs) holds every slot when key ``b``
    (own cap 4) arrives at step 3 with 12 runs: from that step on ``a`` starts at most
    its cap (1) per step while ``b`` has work, ``b`` starts exactly what it starts
    without borrowing (same steps, same counts), and ``a`` borrows again once ``b`` is
    done."""
    traces = {}
    for borrow in (False, True):
        e = Environment("org1", "proj1", f"{order}{borrow}")
        rq = await lender(make_queue, e, order, cap=1, borrow=borrow)
        await rq.set_key_concurrency(e, Q, "b", SLOTS)
        traces[borrow] = await drive(
            rq, e, hold=one_step, arrivals={0: [("a", 40)], 3: [("b", 12)]}
        )
    lent, plain = traces[True], traces[False]
    b_steps = [s for s in lent.starts if lent.started("b", s)]
    assert [lent.started("b", s) for s in range(40)] == [plain.started("b", s) for s in range(40)]
    assert [plain.started("b", s) for s in range(3, 7)] == [3, 3, 3, 3]
    assert all(lent.started("a", s) == SLOTS for s in range(3))  # borrowing before b
    assert all(lent.started("a", s) <= 1 for s in b_steps)  # no borrowed slot while b runs
    after = max(b_steps) + 1
    assert lent.started("a", after) == SLOTS  # borrowing again
    assert lent.end < plain.end


@both_orders
async def test_a_borrower_gets_no_new_slot_once_a_contender_waits(
    make_queue: Any, env: Environment, order: Order
) -> None:
    """Three-step runs: ``a`` (cap 1, borrowing) holds all 4 slots when ``b`` (own cap
    4) arrives; from the next dequeue call on, in every call that leaves ``b`` runs
    queued, ``a`` starts only within its own cap (at most 1 - what it holds: never a
    borrowed slot), so the other slots ``a`` gives back go to ``b`` (lent slots drain
    by themselves: ``b`` waits at most one run time, never for a new borrow)."""
    e = Environment("org1", "proj1", f"{order}3")
    rq = await lender(make_queue, e, order, cap=1, borrow=True)
    await rq.set_key_concurrency(e, Q, "b", SLOTS)
    trace = await drive(
        rq, e, hold=lambda d: 3, arrivals={0: [("a", 40)], 4: [("b", 8)]}, steps=200
    )
    b_total = 0
    first_b = None
    for s in range(4, 200):
        if b_total >= 8:
            break
        room = max(0, 1 - trace.held[s]["a"])
        if trace.started("b", s) < 8 - b_total:  # b still has queued runs after the call
            assert trace.started("a", s) <= room, (s, trace.held[s], trace.starts[s])
        b_total += trace.started("b", s)
        if first_b is None and trace.started("b", s):
            first_b = s
    assert b_total == 8
    assert first_b is not None and first_b - 4 <= 3
    print(f"\n[{order}] contender first served {first_b - 4} steps after arriving (runs: 3)")


# --------------------------------------------------------------------------- charging


def long_and_short(d: Delivery) -> int:
    return 20 if d.concurrency_key == "long" else 1


async def _slot_shares(make_queue: Any, env: Environment, charge: str) -> dict[str, float]:
    """Keys ``long`` (20-step runs) and ``short`` (1-step runs), both backlogged for the
    whole 800 steps on 4 slots (fair order, charge_unit_ms = one step): each key's
    share of the slot-steps."""
    rq = await queue_for(make_queue, "fair", vtime={"charge_unit_ms": STEP_MS})
    await rq.set_env_limits(env, concurrency=SLOTS)
    await rq.set_queue_options(env, Q, charge=charge)
    await enqueue_runs(rq, env, Q, "L", 300, key="long")
    await enqueue_runs(rq, env, Q, "S", 2500, key="short")
    trace = await drive(rq, env, hold=long_and_short, steps=800, stop_when_empty=False)
    stats = await rq.queue_stats(env, Q, breakdown=True)
    assert {v.concurrency_key for v in stats.variants if v.queued} == {"long", "short"}
    total = sum(trace.slot_steps.values())
    assert total == SLOTS * 800  # work-conserving: no slot idle
    return {k: n / total for k, n in trace.slot_steps.items()}


async def test_charging_by_duration_equalises_slot_time(make_queue: Any, env: Environment) -> None:
    """charge="duration": the 20-step key and the 1-step key hold equal slot time (each
    within +-10% of half)."""
    shares = await _slot_shares(make_queue, env, "duration")
    print(f"\n[duration] slot-time shares: {shares}")
    assert shares["long"] == pytest.approx(0.5, rel=0.10)
    assert shares["short"] == pytest.approx(0.5, rel=0.10)


async def test_charging_by_count_gives_the_long_key_most_slot_time(
    make_queue: Any, env: Environment
) -> None:
    """charge="count" (the default): equal starts, so the 20-step key holds about 20/21
    (95%) of the slot time."""
    shares = await _slot_shares(make_queue, env, "count")
    print(f"\n[count] slot-time shares: {shares}")
    assert shares["long"] == pytest.approx(20 / 21, abs=0.02)
