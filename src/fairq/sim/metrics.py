"""Metrics of one simulated run, and the JSON record they make.

Record shape (one per scenario x discipline x seed)::

    {"scenario": str, "discipline": str, "seed": int,
     "groups": {NAME: {"mean_wait": float, "p50_wait": int, "p99_wait": int,
                       "max_wait": int, "first_serve_step": int | null,
                       "served": int, "contention_share": float | null,
                       "slot_share": float | null, "priority": int}},
     "tenants": {NAME: {"weight": float, "keys": int, "mean_wait": float,
                        "p95_wait": int, "max_wait": int,
                        "first_serve_step": int | null, "served": int,
                        "contention_share": float | null, "slot_share": float | null}},
     "makespan": int, "contention_worst_share": float, "worst_key_mean_wait": float,
     "enqueued": int, "served": int, "duplicates": int, "commands_per_serve": float}

* priority: the group's priority level, only when the run enqueued at levels (the
  scenario sets a group's ``priority`` or ``aging``, and the discipline applies them).
* wait: steps from a message's arrival to its (first) serve; percentiles are nearest-rank.
* first_serve_step: the step of the group's (tenant's) first serve (absolute).
* makespan: the step of the last serve.
* worst_key_mean_wait: the largest mean wait of a single key (over the keys with a
  served message), so a group mean never hides one badly served key.
* A unit (key, group or tenant) *contends* at step ``t`` while it has arrived, unserved
  work: a message with ``arrival_step <= t <= serve_step`` (queued or gated; a message
  served at ``t`` still contends at ``t``; one never served contends to the end).
* contention share (a group's): at every step on which at least two keys contend, each
  contending key is *entitled* to ``weight / sum of the contending keys' weights`` of
  what that step served. A group's ``contention_share`` is what its keys were served at
  those steps divided by what they were entitled to (1.0 = exactly fair; null when the
  group never contended). ``contention_worst_share`` is the lowest such ratio of a
  single key (1.0 when no step had two contenders).
* a tenant's ``contention_share``: the same with tenants as the units (steps on which at
  least two tenants contend, each entitled to ``tenant weight / sum of the contending
  tenants' weights`` of what the step served).
* slot share: a served message occupies a slot on the steps
  ``serve_step .. release_step - 1`` (its hold). On every step on which at least two
  groups (tenants) contend, the step's occupied slots ``O(t)`` (held by anyone) are
  shared out: a group is entitled to ``O(t) x W_g(t) / sum of W(t)`` over the
  contending groups, ``W_g(t)`` being the sum of the weights of its contending keys
  (for a tenant: its tenant weight while it contends). ``slot_share`` = the slot-steps
  the group (tenant) occupied on those steps / the slot-steps it was entitled to
  (1.0 = fair; null when it never contended). Slots held by a unit that no longer
  contends count as its occupancy but earn it no entitlement.
* served: distinct messages served; ``duplicates``: deliveries beyond the first of a
  message (must be 0); ``enqueued - served`` is the loss (must be 0).
* commands_per_serve: server commands (INFO commandstats, including the ones each
  script issues) for enqueues, dequeues and acks, divided by ``served``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

from fairq.sim.driver import Trace

Record = dict[str, Any]


def percentile(sorted_values: list[int], p: float) -> int:
    """Nearest-rank percentile of an ascending list (0 for an empty list)."""
    if not sorted_values:
        return 0
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def contention(
    trace: Trace,
    unit: Mapping[str, str] | None = None,
    weight: Mapping[str, float] | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """Per unit: (served at contended steps, entitled at contended steps).

    The units are the keys by default; ``unit`` maps each key to its unit (e.g. its
    tenant) and ``weight`` gives each unit's weight (default: the keys' weights).
    """
    w = trace.workload
    unit_of: Mapping[str, str] = unit if unit is not None else {k: k for k in w.keys}
    weight_of: Mapping[str, float] = weight if weight is not None else w.key_weight
    arrivals: dict[int, Counter[str]] = defaultdict(Counter)
    for m in w.messages:
        arrivals[m.arrival_step][unit_of[m.key]] += 1
    serves: dict[int, Counter[str]] = defaultdict(Counter)
    for m in w.messages:
        step = trace.serve_step.get(m.run_id)
        if step is not None:
            serves[step][unit_of[m.key]] += 1
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
            weight_sum = sum(weight_of[k] for k in active)
            for key in active:
                owed[key] += weight_of[key] / weight_sum * total
            for key, n in served.items():
                got[key] += n
        for key, n in served.items():
            backlog[key] -= n
            if backlog[key] <= 0:
                active.discard(key)
    return dict(got), dict(owed)


def slot_steps(
    trace: Trace,
    member: Mapping[str, str],
    unit: Mapping[str, str],
    weight: Mapping[str, float],
) -> tuple[dict[str, float], dict[str, float]]:
    """Per unit: (slot-steps occupied, slot-steps entitled) on the steps on which at
    least two units contend (see the module docstring).

    ``member`` maps each key to a member (the key itself for groups, its tenant for
    tenants), ``unit`` each member to its unit, ``weight`` each member to its weight; a
    unit's weight on a step is the sum of its contending members' weights.

    One sweep over the steps where something changes (an arrival, the step after a
    serve, a serve, a release); between two such steps nothing does. ``level`` is the
    running sum of ``O(t) / sum of W(t)`` over the contended steps, so a member that
    contends from ``a`` to ``b`` is entitled to ``weight x (level(b) - level(a))``.
    """
    contend, hold = _slot_changes(trace, member, unit)
    sweep = _SlotSweep(unit, weight)
    times = sorted(set(contend) | set(hold))
    for i, t in enumerate(times):
        for u, change in hold.get(t, Counter()).items():
            if change:
                sweep.hold(u, change)
        for who, change in contend.get(t, Counter()).items():
            sweep.contend(who, change)
        if sweep.units >= 2 and i + 1 < len(times):
            sweep.advance(times[i + 1] - t)
    return sweep.totals()


def _slot_changes(
    trace: Trace, member: Mapping[str, str], unit: Mapping[str, str]
) -> tuple[dict[int, Counter[str]], dict[int, Counter[str]]]:
    """Per step: the change in each member's contending messages (+1 at arrival, -1 the
    step after its serve) and in each unit's slots held (+1 at a serve, -1 at its
    release, for a serve that holds a slot at all)."""
    contend: dict[int, Counter[str]] = defaultdict(Counter)  # member -> change in messages
    hold: dict[int, Counter[str]] = defaultdict(Counter)  # unit -> change in slots held
    for m in trace.workload.messages:
        who = member[m.key]
        contend[m.arrival_step][who] += 1
        served = trace.serve_step.get(m.run_id)
        if served is None:
            continue
        contend[served + 1][who] -= 1
        released = trace.release_step.get(m.run_id, served)
        if released > served:
            hold[served][unit[who]] += 1
            hold[released][unit[who]] -= 1
    return contend, hold


class _SlotSweep:
    """The running state of :func:`slot_steps`' sweep: who contends, the slots held, the
    entitlement ``level`` and, per unit, the slot-steps occupied (``got``) and entitled
    (``owed``) so far. A unit's occupancy is settled lazily: ``held x`` the contended
    steps since its holding last changed."""

    def __init__(self, unit: Mapping[str, str], weight: Mapping[str, float]) -> None:
        self.unit = unit
        self.weight = weight
        self.messages: Counter[str] = Counter()  # member -> contending messages
        self.members_of: Counter[str] = Counter()  # unit -> contending members
        self.weights: Counter[float] = Counter()  # weight -> contending members of that weight
        self.units = 0  # units contending
        self.held: Counter[str] = Counter()  # unit -> slots held
        self.held_total = 0
        self.level = 0.0
        self.contended = 0  # contended steps so far
        self.level_at: dict[str, float] = {}
        self.contended_at: dict[str, int] = {}
        self.got: dict[str, float] = defaultdict(float)
        self.owed: dict[str, float] = defaultdict(float)

    def hold(self, u: str, change: int) -> None:
        """Unit ``u`` holds ``change`` more slots (after settling what it held)."""
        self.got[u] += self.held[u] * (self.contended - self.contended_at.get(u, 0))
        self.contended_at[u] = self.contended
        self.held[u] += change
        self.held_total += change

    def contend(self, who: str, change: int) -> None:
        """Member ``who`` has ``change`` more contending messages: when that starts or
        ends its contention, it joins (from the current level) or leaves (owed the
        level gained since it joined, at its weight)."""
        before = self.messages[who] > 0
        self.messages[who] += change
        after = self.messages[who] > 0
        if before == after:
            return
        u = self.unit[who]
        if after:
            self.level_at[who] = self.level
            self.weights[self.weight[who]] += 1
            self.members_of[u] += 1
            if self.members_of[u] == 1:
                self.units += 1
        else:
            self.owed[u] += self.weight[who] * (self.level - self.level_at.pop(who))
            self.weights[self.weight[who]] -= 1
            self.members_of[u] -= 1
            if self.members_of[u] == 0:
                self.units -= 1

    def advance(self, steps: int) -> None:
        """``steps`` contended steps pass with what is held and who contends now."""
        self.contended += steps
        weight_sum = sum(x * n for x, n in sorted(self.weights.items()))
        self.level += self.held_total * steps / weight_sum

    def totals(self) -> tuple[dict[str, float], dict[str, float]]:
        """Per unit: (occupied, entitled), settling the members still contending (never
        served) and the slots still held."""
        for who, start in self.level_at.items():
            self.owed[self.unit[who]] += self.weight[who] * (self.level - start)
        for u, n in self.held.items():
            self.got[u] += n * (self.contended - self.contended_at.get(u, 0))
        return dict(self.got), dict(self.owed)


def _share(got: float, owed: float) -> float | None:
    return round(got / owed, 4) if owed > 1e-9 else None


def record(trace: Trace, *, scenario: str, discipline: str, seed: int) -> Record:
    """The JSON record of one run (see the module docstring)."""
    w = trace.workload
    waits: dict[str, list[int]] = defaultdict(list)
    first: dict[str, int] = {}
    tenant_waits: dict[str, list[int]] = defaultdict(list)
    tenant_first: dict[str, int] = {}
    key_wait: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for m in w.messages:
        step = trace.serve_step.get(m.run_id)
        if step is None:
            continue
        acc = key_wait[m.key]
        acc[0] += step - m.arrival_step
        acc[1] += 1
        waits[m.group].append(step - m.arrival_step)
        first[m.group] = min(first.get(m.group, step), step)
        tenant_waits[m.tenant].append(step - m.arrival_step)
        tenant_first[m.tenant] = min(tenant_first.get(m.tenant, step), step)
    got, owed = contention(trace)
    slot_got, slot_owed = slot_steps(trace, {k: k for k in w.keys}, w.key_group, w.key_weight)
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
            "slot_share": _share(slot_got.get(group, 0.0), slot_owed.get(group, 0.0)),
        }
        if group in trace.group_level:
            groups[group]["priority"] = trace.group_level[group]
    identity = {t: t for t in w.tenants}
    t_got, t_owed = contention(trace, w.key_tenant, w.tenant_weight)
    t_slot_got, t_slot_owed = slot_steps(trace, w.key_tenant, identity, w.tenant_weight)
    key_count = Counter(w.key_tenant.values())
    tenants: dict[str, Any] = {}
    for tenant in w.tenants:
        values = sorted(tenant_waits.get(tenant, []))
        tenants[tenant] = {
            "weight": w.tenant_weight[tenant],
            "keys": key_count[tenant],
            "mean_wait": round(sum(values) / len(values), 3) if values else 0.0,
            "p95_wait": percentile(values, 95),
            "max_wait": values[-1] if values else 0,
            "first_serve_step": tenant_first.get(tenant),
            "served": len(values),
            "contention_share": _share(t_got.get(tenant, 0.0), t_owed.get(tenant, 0.0)),
            "slot_share": _share(t_slot_got.get(tenant, 0.0), t_slot_owed.get(tenant, 0.0)),
        }
    shares = [got.get(k, 0.0) / owed[k] for k in owed if owed[k] > 1e-9]
    served = len(trace.serve_step)
    return {
        "scenario": scenario,
        "discipline": discipline,
        "seed": seed,
        "groups": groups,
        "tenants": tenants,
        "makespan": trace.last_step,
        "contention_worst_share": round(min(shares), 4) if shares else 1.0,
        "worst_key_mean_wait": (
            round(max(total / n for total, n in key_wait.values()), 3) if key_wait else 0.0
        ),
        "enqueued": len(w.messages),
        "served": served,
        "duplicates": trace.duplicates,
        "commands_per_serve": round(trace.commands / served, 2) if served else 0.0,
    }
