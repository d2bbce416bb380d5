"""A tenant trying to get more than its share, through the real RunQueue API.

Each workload is one way a run's tenant, a key name or a default could be used against
the order: tenants sharing a concurrency key, a tenant enqueueing on another's key name,
a named tenant under a per-key limit, and runs ending by a lapsed lease under duration
charging. Step-driven on a logical clock (no sleeps): each step acks (or, for lapsing
runs, reclaims) what is due, enqueues nothing new, then makes ONE dequeue call.

Given / When / Then: given the backlogs below, when the queue drains step by step, then
each tenant gets its share, no cap is exceeded at any step, and a delivery names the
run's own tenant.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from fairq.keys import Environment
from fairq.models import Delivery, EnqueueRequest
from fairq.store import RunQueue

Q = "jobs"
T0 = 5_000_000
STEP_MS = 100
HOLD = 3


@dataclass(frozen=True)
class Backlog:
    """``count`` runs of ``tenant`` on ``key``, scored from ``at`` on (older = smaller)."""

    tenant: str | None
    key: str | None
    count: int
    at: int
    name: str


@dataclass
class Drain:
    """What a step-driven drain saw."""

    #: run id -> the step it started
    started: dict[str, int] = field(default_factory=dict)
    #: run id -> the tenant its delivery named (None = its default tenant)
    delivered_tenant: dict[str, str | None] = field(default_factory=dict)
    #: (step, tenant) in serve order
    log: list[tuple[int, str]] = field(default_factory=list)
    #: step -> tenant -> runs in flight after that step's dequeue
    in_flight: dict[int, Counter[str]] = field(default_factory=dict)
    #: tenant -> slot-steps held
    slot_steps: Counter[str] = field(default_factory=Counter)
    #: the step after the last serve
    steps: int = 0


def requests(env: Environment, backlogs: list[Backlog]) -> tuple[list[EnqueueRequest], dict]:
    out, owner = [], {}
    for b in backlogs:
        for i in range(b.count):
            run = f"{b.name}-{i}"
            owner[run] = b.name
            out.append(
                EnqueueRequest(
                    env, Q, run, None, concurrency_key=b.key, tenant=b.tenant,
                    available_at_ms=b.at + i,
                )
            )  # fmt: skip
    return out, owner


async def drain(
    rq: RunQueue,
    env: Environment,
    backlogs: list[Backlog],
    *,
    hold: Callable[[str], int] | None = None,
    steps: int = 2000,
    slots: int = 4,
    lapse: Callable[[str], bool] | None = None,
    lease_ms: int = 60_000,
    stop_when_empty: bool = True,
) -> Drain:
    """Enqueue every backlog at once, then one dequeue call per step for what the free
    slots allow. Runs ``lapse`` picks are never acked: their lease lapses and
    ``reclaim`` requeues them (each step runs the reclaim sweep)."""
    await rq.set_env_limits(env, concurrency=slots)
    reqs, owner = requests(env, backlogs)
    await rq.enqueue_many(reqs, now_ms=T0 + 1_000)
    out = Drain()
    running: list[tuple[int, Delivery]] = []
    for step in range(steps):
        now = T0 + 10_000 + step * STEP_MS
        await rq.reclaim_lapsed_leases(now_ms=now)
        done = [d for end, d in running if end <= step]
        running = [(end, d) for end, d in running if end > step]
        acked = [d for d in done if not (lapse and lapse(owner[d.run_id]))]
        if acked:
            await rq.ack(acked, now_ms=now)
        got = await rq.dequeue(slots, env=env, queues=[Q], lease_ms=lease_ms, now_ms=now)
        for d in got:
            name = owner[d.run_id]
            out.started.setdefault(d.run_id, step)
            out.delivered_tenant[d.run_id] = d.tenant
            out.log.append((step, name))
            length = hold(name) if hold else HOLD
            if lapse and lapse(name):
                length = lease_ms // STEP_MS + 1  # held until the lease has lapsed
            running.append((step + length, d))
        out.in_flight[step] = Counter(owner[d.run_id] for _, d in running)
        for _, d in running:
            out.slot_steps[owner[d.run_id]] += 1
        if got:
            out.steps = step + 1
        if stop_when_empty and not running and len(out.started) == len(owner):
            break
    return out


def shares_while_all_backlogged(d: Drain, names: list[str], sizes: dict[str, int]) -> dict:
    """Each name's share of the serves made while every listed name still had queued runs."""
    served: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for _, name in d.log:
        if any(served[n] >= sizes[n] for n in names):
            break
        served[name] += 1
        counts[name] += 1
    total = sum(counts[n] for n in names)
    assert total >= 30, f"too short a window to judge shares: {total} serves"
    return {n: counts[n] / total for n in names}


async def fair_queue(make_queue: Any, **config: Any) -> RunQueue:
    rq: RunQueue = await make_queue(vtime={"enabled": True}, **config)
    return rq


# ---------------------------------------------------------------- a shared concurrency key


SHARED = [
    Backlog("tenant-a", "k", 60, T0, "a"),
    Backlog("tenant-b", "k", 60, T0 + 100, "b"),
    Backlog("tenant-c", "c", 60, T0 + 200, "c"),
]


async def test_tenants_sharing_a_key_each_get_a_third(make_queue: Any, env: Environment) -> None:
    """A and B both use key ``k``, C its own key: each tenant gets a third of the serves
    (before: A 0.25, B 0.25, C 0.50: the shared key was served as one tenant's)."""
    rq = await fair_queue(make_queue)
    d = await drain(rq, env, SHARED)
    shares = shares_while_all_backlogged(d, ["a", "b", "c"], {"a": 60, "b": 60, "c": 60})
    print(f"\n[shared key] shares {shares}")
    for name in ("a", "b", "c"):
        assert shares[name] == pytest.approx(1 / 3, abs=0.05), shares


@pytest.mark.parametrize("order", ["age", "fair"])
async def test_a_delivery_names_the_runs_own_tenant_on_a_shared_key(
    make_queue: Any, env: Environment, order: str
) -> None:
    """Every delivery names the tenant its run was enqueued with, whoever else uses the
    key (before: B's runs were delivered as tenant A's)."""
    rq: RunQueue = await make_queue(vtime={"enabled": order == "fair"})
    d = await drain(rq, env, SHARED)
    wrong = {run: t for run, t in d.delivered_tenant.items() if t != f"tenant-{run.split('-')[0]}"}
    assert not wrong, f"deliveries naming another tenant: {sorted(wrong.items())[:5]}"


@pytest.mark.parametrize("order", ["age", "fair"])
async def test_a_tenant_cap_holds_on_a_shared_key(
    make_queue: Any, env: Environment, order: str
) -> None:
    """B's tenant cap of 1 holds at every step although A uses the same key (before: 4 of
    B's runs in flight in the fair order, 2 in the age order)."""
    rq: RunQueue = await make_queue(vtime={"enabled": order == "fair"})
    await rq.set_tenant_concurrency(env, Q, "tenant-b", 1)
    d = await drain(rq, env, SHARED)
    worst = max(counts["b"] for counts in d.in_flight.values())
    assert worst == 1, f"tenant-b had {worst} runs in flight at once (cap 1)"
    assert len(d.started) == 180  # and everything drained


async def test_a_key_name_cannot_take_another_tenants_service(
    make_queue: Any, env: Environment
) -> None:
    """Key theft: M enqueues on V's key name with older heads; V still gets its third
    (before: V 0.000, M 0.499)."""
    rq = await fair_queue(make_queue)
    backlogs = [
        Backlog("victim", "v", 60, T0 + 500, "v"),
        Backlog("thief", "v", 60, T0, "m"),
        Backlog("other", "o", 60, T0 + 300, "o"),
    ]
    d = await drain(rq, env, backlogs)
    shares = shares_while_all_backlogged(d, ["v", "m", "o"], {"v": 60, "m": 60, "o": 60})
    print(f"\n[key theft] shares {shares}")
    assert shares["v"] == pytest.approx(1 / 3, abs=0.05), shares
    assert shares["m"] == pytest.approx(1 / 3, abs=0.05), shares


# ---------------------------------------------------------------- naming never slows a tenant


@pytest.mark.parametrize("order", ["age", "fair"])
async def test_naming_a_tenant_never_slows_it_under_a_per_key_limit(
    make_queue: Any, env: Environment, order: str
) -> None:
    """One tenant's 10 keys under a per-key limit of 2 (environment limit 20) drain in the
    same steps named as unnamed (before: 198 steps named, 18 unnamed: a named tenant's
    default cap was the per-key limit)."""
    makespans = {}
    for named in (False, True):
        rq: RunQueue = await make_queue(vtime={"enabled": order == "fair"})
        e = Environment(env.org, env.project, f"{env.name}{'n' if named else 'u'}")
        await rq.set_queue_concurrency(e, Q, 2)
        backlogs = [
            Backlog("acme" if named else None, f"key{i}", 6, T0 + i * 10, f"k{i}")
            for i in range(10)
        ]
        d = await drain(rq, e, backlogs, slots=20)
        assert len(d.started) == 60
        makespans[named] = d.steps
    print(f"\n[{order}] makespan unnamed {makespans[False]}, named {makespans[True]}")
    assert makespans[True] == makespans[False]
    if order == "fair":  # 60 runs on 20 slots: three waves, the last starting at step 6
        assert makespans[True] == 3 * HOLD - (HOLD - 1)


# ---------------------------------------------------------------- duration charging


async def test_a_lapsed_lease_is_charged_its_lease_time(make_queue: Any, env: Environment) -> None:
    """charge="duration": tenant L's runs never finish (each ends by a lapsed lease after
    20 steps and is reclaimed), tenant S's take one step; each holds half the slot time
    (before: L 0.663: a lapsed lease was charged one quantum only)."""
    rq: RunQueue = await make_queue(vtime={"enabled": True, "charge_unit_ms": STEP_MS})
    await rq.set_queue_options(env, Q, charge="duration")
    backlogs = [Backlog("lapsing", "l", 200, T0, "l"), Backlog("steady", "s", 3000, T0 + 1, "s")]
    d = await drain(
        rq, env, backlogs, steps=800, lapse=lambda name: name == "l",
        lease_ms=20 * STEP_MS, hold=lambda name: 1, stop_when_empty=False,
    )  # fmt: skip
    total = sum(d.slot_steps.values())
    shares = {n: d.slot_steps[n] / total for n in ("l", "s")}
    print(f"\n[lapsed leases, duration] slot-time shares {shares}")
    assert shares["l"] == pytest.approx(0.5, abs=0.06), shares
