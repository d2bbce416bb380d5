"""Metrics of one simulated run, and the JSON record they make.

Record shape (one per scenario x discipline x seed)::

    {"scenario": str, "discipline": str, "seed": int,
     "groups": {NAME: {"mean_wait": float, "p50_wait": int, "p99_wait": int,
                       "max_wait": int, "first_serve_step": int | null,
                       "served": int, "contention_share": float | null}},
     "makespan": int, "contention_worst_share": float,
     "enqueued": int, "served": int, "duplicates": int, "commands_per_serve": float}

* wait: steps from a message's arrival to its (first) serve; p50/p99 are nearest-rank.
* first_serve_step: the step of the group's first serve (absolute).
* makespan: the step of the last serve.
* contention share: at every step on which at least two keys have arrived, unserved
  work (queued or gated, but arrived: a key counts only once its runs have arrived),
  each contending key is *entitled* to ``weight / sum of the contending keys' weights``
  of what that step served. A group's ``contention_share`` is what its keys were served
  at those steps divided by what they were entitled to (1.0 = exactly fair; null when
  the group never contended). ``contention_worst_share`` is the lowest such ratio of a
  single key (1.0 when no step had two contenders).
* served: distinct messages served; ``duplicates``: deliveries beyond the first of a
  message (must be 0); ``enqueued - served`` is the loss (must be 0).
* commands_per_serve: server commands (INFO commandstats, including the ones each
  script issues) for enqueues, dequeues and acks, divided by ``served``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

from fairq.sim.driver import Trace

Record = dict[str, Any]


def percentile(sorted_values: list[int], p: float) -> int:
    """Nearest-rank percentile of an ascending list (0 for an empty list)."""
    if not sorted_values:
        return 0
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def contention(trace: Trace) -> tuple[dict[str, float], dict[str, float]]:
    """Per key: (served at contended steps, entitled at contended steps)."""
    w = trace.workload
    arrivals: dict[int, Counter[str]] = defaultdict(Counter)
    for m in w.messages:
        arrivals[m.arrival_step][m.key] += 1
    serves: dict[int, Counter[str]] = defaultdict(Counter)
    for m in w.messages:
        step = trace.serve_step.get(m.run_id)
        if step is not None:
            serves[step][m.key] += 1
    got: dict[str, float] = defaultdict(float)
    owed: dict[str, float] = defaultdict(float)
    backlog: Counter[str] = Counter()
    active: set[str] = set()
    for step in sorted(set(arrivals) | set(serves)):
        for key, n in arrivals.get(step, Counter()).items():
            backlog[key] += n
            active.add(key)
        served = serves.get(step)
        if not served:
            continue
        if len(active) >= 2:
            total = sum(served.values())
            weight_sum = sum(w.key_weight[k] for k in active)
            for key in active:
                owed[key] += w.key_weight[key] / weight_sum * total
            for key, n in served.items():
                got[key] += n
        for key, n in served.items():
            backlog[key] -= n
            if backlog[key] <= 0:
                active.discard(key)
    return dict(got), dict(owed)


def record(trace: Trace, *, scenario: str, discipline: str, seed: int) -> Record:
    """The JSON record of one run (see the module docstring)."""
    w = trace.workload
    waits: dict[str, list[int]] = defaultdict(list)
    first: dict[str, int] = {}
    for m in w.messages:
        step = trace.serve_step.get(m.run_id)
        if step is None:
            continue
        waits[m.group].append(step - m.arrival_step)
        first[m.group] = min(first.get(m.group, step), step)
    got, owed = contention(trace)
    groups: dict[str, Any] = {}
    for group in dict.fromkeys(w.key_group.values()):
        values = sorted(waits.get(group, []))
        keys = [k for k, g in w.key_group.items() if g == group]
        g_owed = sum(owed.get(k, 0.0) for k in keys)
        g_got = sum(got.get(k, 0.0) for k in keys)
        groups[group] = {
            "mean_wait": round(sum(values) / len(values), 3) if values else 0.0,
            "p50_wait": percentile(values, 50),
            "p99_wait": percentile(values, 99),
            "max_wait": values[-1] if values else 0,
            "first_serve_step": first.get(group),
            "served": len(values),
            "contention_share": round(g_got / g_owed, 4) if g_owed > 1e-9 else None,
        }
    shares = [got.get(k, 0.0) / owed[k] for k in owed if owed[k] > 1e-9]
    served = len(trace.serve_step)
    return {
        "scenario": scenario,
        "discipline": discipline,
        "seed": seed,
        "groups": groups,
        "makespan": trace.last_step,
        "contention_worst_share": round(min(shares), 4) if shares else 1.0,
        "enqueued": len(w.messages),
        "served": served,
        "duplicates": trace.duplicates,
        "commands_per_serve": round(trace.commands / served, 2) if served else 0.0,
    }
