"""The reference model's admission rule for new tenants (``SfqModel(admit="budget")``).

Three workloads, step-driven on a logical clock through the model alone (each step:
acks of the runs whose hold ended, the step's arrivals, one dequeue call for what the
free slots allow); keys name no tenant, so each key is a tenant of its own:

* a flood: a fresh key per message, two per step (the capacity: 4 slots, 2-step holds),
  beside a steady key with one run per step;
* a late honest newcomer behind 30 backlogged keys (which arrived at once after a first
  serve, so the rule throttled them);
* a tenant split into 40 backlogged keys, and a light key arriving meanwhile.

Given / When / Then: the steady key's mean wait under the flood is at most 1.5 x its
age-order wait with the rule (and far above it with the floor join, the scripts'
rule today); the newcomer is served within one round of the 30; the light key waits
no longer than with the floor join (the split gains nothing).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest
from tests.sfq_model import SfqModel

Q = "jobs"
T0 = 1_000_000
STEP_MS = 1_000
BACKLOG = T0 - 3_600_000


@dataclass(frozen=True)
class Arrival:
    step: int
    run: str
    key: str
    score: int


@dataclass
class Drain:
    started: dict[str, int] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # runs in serve order


def drain(
    arrivals: Iterable[Arrival], *, order: str, slots: int, hold: int, admit: str = "floor"
) -> Drain:
    model = SfqModel(env_limit=slots, admit=admit)
    by_step: dict[int, list[Arrival]] = {}
    for a in arrivals:
        by_step.setdefault(a.step, []).append(a)
    total = sum(len(v) for v in by_step.values())
    out = Drain()
    running: list[tuple[int, str]] = []
    step = 0
    while len(out.started) < total:
        now = T0 + step * STEP_MS
        for _end, run in [r for r in running if r[0] <= step]:
            model.ack(run, now)
        running = [r for r in running if r[0] > step]
        for a in by_step.get(step, []):
            model.enqueue(Q, a.run, a.key, None, a.score, now)
        got = model.dequeue_age(Q, slots, now) if order == "age" else model.dequeue([Q], slots, now)
        for run, _queue, _flow in got:
            out.started[run] = step
            out.order.append(run)
            running.append((step + hold, run))
        step += 1
        assert step < 10_000, "the drain never ended"
    return out


def mean_wait(d: Drain, arrivals: list[Arrival], prefix: str) -> float:
    waits = [d.started[a.run] - a.step for a in arrivals if a.key.startswith(prefix)]
    return sum(waits) / len(waits)


def flood() -> list[Arrival]:
    out = [Arrival(s, f"s.{s}", "steady", T0 + s * STEP_MS + 1) for s in range(150)]
    for i in range(300):
        step = i // 2
        out.append(Arrival(step, f"f{i}.0", f"fresh{i}", T0 + step * STEP_MS + 2 + i % 2))
    return out


def late_newcomer() -> list[Arrival]:
    """A first key served at step 0, 30 backlogged keys arriving at once at step 1 (so the
    rule acts on them), a newcomer from step 20."""
    out = [Arrival(10 * j, f"e.{j}", "early", T0 + 10 * j * STEP_MS) for j in range(4)]
    out += [
        Arrival(1, f"b{k}.{j}", f"backlog{k}", T0 + STEP_MS + j)
        for k in range(30)
        for j in range(8)
    ]
    out += [
        Arrival(20 + 3 * j, f"n.{j}", "newcomer", T0 + (20 + 3 * j) * STEP_MS) for j in range(4)
    ]
    return out


def sybil(start: int = 0) -> list[Arrival]:
    """40 backlogged keys arriving at ``start`` (0: before the light key; later: while
    the light key and a steady key already have tags)."""
    score = BACKLOG if start == 0 else T0 + start * STEP_MS
    out = [Arrival(start, f"y{k}.{j}", f"sybil{k}", score + j) for k in range(40) for j in range(6)]
    out += [Arrival(3 + 5 * j, f"l.{j}", "light", T0 + (3 + 5 * j) * STEP_MS) for j in range(10)]
    if start:
        out += [Arrival(s, f"s.{s}", "steady", T0 + s * STEP_MS + 1) for s in range(0, 60, 2)]
    return out


def test_a_flood_of_fresh_tenants_costs_the_steady_key_little_with_the_budget() -> None:
    arrivals = flood()
    age = mean_wait(drain(arrivals, order="age", slots=4, hold=2), arrivals, "steady")
    floor = mean_wait(drain(arrivals, order="fair", slots=4, hold=2), arrivals, "steady")
    budget = mean_wait(
        drain(arrivals, order="fair", slots=4, hold=2, admit="budget"), arrivals, "steady"
    )
    print(f"\n[flood] steady wait: age {age:.1f}, floor {floor:.1f}, budget {budget:.1f}")
    assert floor > 2 * age  # the floor join: every fresh tenant goes first
    assert budget <= 1.5 * age


@pytest.mark.parametrize("admit", ["floor", "budget"])
def test_a_late_newcomer_behind_30_keys_is_served_within_one_round(admit: str) -> None:
    arrivals = late_newcomer()
    d = drain(arrivals, order="fair", slots=4, hold=3, admit=admit)
    arrived = [r for r in d.order if d.started[r] >= 20]
    before = arrived.index("n.0")  # serves of others between its arrival and its first
    print(f"\n[late newcomer, {admit}] first served after {before} other serves")
    assert before <= 30


@pytest.mark.parametrize("start", [0, 5])
def test_a_tenant_split_into_40_keys_gains_nothing_from_the_budget(start: int) -> None:
    arrivals = sybil(start)
    waits = {
        admit: mean_wait(
            drain(arrivals, order="fair", slots=4, hold=3, admit=admit), arrivals, "light"
        )
        for admit in ("floor", "budget")
    }
    print(f"\n[sybil from step {start}] light wait {waits}")
    assert waits["budget"] <= waits["floor"]


def test_the_rule_is_on_by_default() -> None:
    """The model's default is the scripts' (VirtualTimeOptions.admission = 'budget'),
    and on a flood it orders otherwise than the floor join."""
    assert SfqModel().admit == "budget"
    arrivals = flood()
    budget = drain(arrivals, order="fair", slots=4, hold=2, admit="budget")
    floor = drain(arrivals, order="fair", slots=4, hold=2, admit="floor")
    assert budget.order != floor.order
