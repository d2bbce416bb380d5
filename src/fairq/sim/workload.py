"""Workload generation: every message of a scenario for one seed, before any run.

A workload is identical for every discipline: the same messages, arrival steps,
timestamps and holds for a given seed. Arrival shapes: a backlog arrives at step 0 with
one shared old timestamp; later messages carry their own later timestamps (with a seeded
sub-step offset, so no tie is ever broken by key name).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from fairq.keys import Environment
from fairq.sim.scenario import Hold, Scenario

#: Logical epoch of step 0 (ms).
BASE_MS = 1_700_000_000_000
#: Logical length of one step (ms).
STEP_MS = 1_000
#: How old the shared timestamp of a step-0 backlog is (ms).
BACKLOG_AGE_MS = 3_600_000
#: The environment every simulation runs in.
SIM_ENV = Environment("sim", "fairness", "run")
#: The base queue of grain ``ck`` scenarios.
CK_QUEUE = "work"


def now_of(step: int) -> int:
    """The logical clock of a step (ms)."""
    return BASE_MS + step * STEP_MS


@dataclass(slots=True)
class SimMessage:
    """One generated message."""

    run_id: str
    key: str
    group: str
    queue: str
    arrival_step: int
    score_ms: int
    hold: int


@dataclass
class Workload:
    """Every message of a scenario for one seed, and the keys in declaration order."""

    messages: list[SimMessage]
    keys: list[str]
    key_group: dict[str, str]
    key_weight: dict[str, float]
    key_queues: dict[str, list[str]]


def _hold(h: Hold, rng: random.Random) -> int:
    if h.kind == "fixed":
        return h.steps
    if h.kind == "uniform":
        return rng.randint(h.low, h.high)
    return max(1, round(rng.expovariate(1.0 / h.mean)))


def generate(scenario: Scenario, seed: int) -> Workload:
    """The scenario's messages for ``seed``: identical for every discipline."""
    rng = random.Random(f"{scenario.name}/{seed}")
    messages: list[SimMessage] = []
    keys: list[str] = []
    key_group: dict[str, str] = {}
    key_weight: dict[str, float] = {}
    key_queues: dict[str, list[str]] = {}
    for g in scenario.groups:
        hold = g.hold or scenario.hold
        a = g.arrival
        for i in range(g.keys):
            key = f"{g.name}-{i}"
            keys.append(key)
            key_group[key] = g.name
            key_weight[key] = g.weight
            if scenario.grain == "ck":
                queues = [CK_QUEUE]
            elif g.queues_per_key == 1:
                queues = [key]
            else:
                queues = [f"{key}.q{j}" for j in range(g.queues_per_key)]
            key_queues[key] = queues
            offset = a.stagger * i
            shared_step = math.floor(a.start + offset)
            shared_score = now_of(shared_step) - rng.randrange(STEP_MS)
            t = a.start + offset
            for j in range(g.messages_per_key):
                if a.kind == "backlog":
                    step = math.floor(offset)
                    score = now_of(0) - BACKLOG_AGE_MS if step == 0 else shared_score
                elif a.kind == "burst":
                    step, score = shared_step, shared_score
                else:
                    if a.kind == "interval":
                        step = math.floor(a.start + offset) + j * a.every
                    else:
                        t += rng.expovariate(a.rate)
                        step = math.floor(t)
                    score = now_of(step) - rng.randrange(STEP_MS)
                messages.append(
                    SimMessage(
                        run_id=f"{key}.{j}",
                        key=key,
                        group=g.name,
                        queue=queues[j % len(queues)],
                        arrival_step=step,
                        score_ms=score,
                        hold=_hold(hold, rng),
                    )
                )
    return Workload(messages, keys, key_group, key_weight, key_queues)
