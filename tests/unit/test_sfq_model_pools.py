"""The reference model's fair state per pool (``SfqModel(pools=True)``).

Two consumer pools in one environment, one slot each: p1 serves only queue q1, p2 only
q2. Tenant busy has a backlog on q2 (p2 serves nothing else) and a light stream on q1;
tenant local has a backlog on q1. Step-driven on a logical clock (each step: acks, the
step's arrivals, then p1's and p2's dequeue calls, each for its own free slot).

Given / When / Then: with one fair state per environment, p2's serves of busy are
charged against busy's turn in p1, so busy's light stream waits behind local's whole
backlog; with fair state per pool, p1 serves busy's light runs on arrival (mean wait
below 1 step) and the two tenants' serves in p1 never differ by more than 1 while both
wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.sfq_model import SfqModel

T0 = 1_000_000
STEP_MS = 1_000
BACKLOG = T0 - 3_600_000
POOLS = {"p1": ["q1"], "p2": ["q2"]}


@dataclass
class Split:
    light_waits: list[int] = field(default_factory=list)
    lag: int = 0  # local's largest lead over busy's light runs in p1, while both wait


def drain(pools: bool) -> Split:
    model = SfqModel(env_limit=4, pools=pools)
    arrivals: dict[int, list[tuple[str, str, str, str, int]]] = {}
    for j in range(300):
        arrivals.setdefault(0, []).append(("q1", f"loc.{j}", "l", "local", BACKLOG + j))
    for j in range(400):
        arrivals.setdefault(0, []).append(("q2", f"far.{j}", "far", "busy", BACKLOG + j))
    light_at = {f"light.{j}": 1 + 4 * j for j in range(60)}
    for run, step in light_at.items():
        arrivals.setdefault(step, []).append(("q1", run, "light", "busy", T0 + step * STEP_MS))
    out = Split()
    busy: dict[str, list[str]] = {"p1": [], "p2": []}
    waiting_light: set[str] = set()
    local_left = 300
    lead = 0
    for step in range(800):
        now = T0 + step * STEP_MS
        for pool in busy:
            for run in busy[pool]:
                model.ack(run, now)
            busy[pool] = []
        for queue, run, key, tenant, score in arrivals.get(step, []):
            model.enqueue(queue, run, key, tenant, score, now)
            if run in light_at:
                waiting_light.add(run)
        contended = bool(waiting_light) and local_left > 0
        for pool, queues in POOLS.items():
            for run, _queue, _flow in model.dequeue(queues, 1, now):
                busy[pool].append(run)
                if run in light_at:
                    out.light_waits.append(step - light_at[run])
                    waiting_light.discard(run)
                    lead -= 1 if contended else 0
                elif run.startswith("loc."):
                    local_left -= 1
                    lead += 1 if contended else 0
        out.lag = max(out.lag, lead)
    assert len(out.light_waits) == 60
    return out


def test_one_state_per_environment_makes_the_light_stream_wait() -> None:
    d = drain(pools=False)
    mean = sum(d.light_waits) / 60
    print(f"\n[env state] light wait {mean:.1f}, pair lag {d.lag}")
    assert mean > 100 and d.lag > 50


def test_fair_state_per_pool_serves_each_pools_tenants_in_turn() -> None:
    d = drain(pools=True)
    mean = sum(d.light_waits) / 60
    print(f"\n[pool state] light wait {mean:.1f}, pair lag {d.lag}")
    assert mean < 1.0 and d.lag <= 1


def test_pools_are_on_by_default_and_a_consumer_of_every_queue_is_pool_star() -> None:
    """As in the scripts: a pool per set of queues, and a consumer that serves every
    queue that ever had a run is the pool of them all."""
    model = SfqModel()
    assert model.pools and model.pool_of(["q2", "q1", "q2"]) == "*"  # no queue had a run
    model.enqueue("q1", "r1", "k", None, 0)
    model.enqueue("q3", "r3", "k", None, 0)
    assert model.pool_of(["q2", "q1", "q2"]) == "q1,q2"
    assert model.pool_of(["q3", "q1"]) == "*"
    assert SfqModel(pools=False).pool_of(["q1"]) == "*"
