"""Workload generation: every message of a scenario for one seed, before any run.

A workload is identical for every discipline: the same messages, arrival steps,
timestamps and holds for a given seed. Arrival shapes: a backlog arrives at step 0 with
one shared old timestamp; later messages carry their own later timestamps (with a seeded
sub-step offset, so no tie is ever broken by key name).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from fairq.keys import Environment
from fairq.sim.scenario import Group, Hold, Rate, Scenario

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


def sim_env(index: int) -> Environment:
    """The ``index``-th environment of the simulation's organisation (0 = :data:`SIM_ENV`)."""
    return SIM_ENV if index == 0 else Environment(SIM_ENV.org, SIM_ENV.project, f"run{index}")


def ck_queue(index: int) -> str:
    """The ``index``-th base queue of a grain ``ck`` environment (0 = :data:`CK_QUEUE`)."""
    return CK_QUEUE if index == 0 else f"{CK_QUEUE}.q{index}"


@dataclass(slots=True)
class SimMessage:
    """One generated message.

    Attributes:
        run_id: unique, ``<key>.<j>`` for the key's ``j``-th message.
        key: the concurrency key (grain ``ck``) or queue owner (grain ``queue``).
        group: the scenario group the key belongs to.
        queue: the base queue the message is enqueued on (in ``env``).
        arrival_step: the step the message is enqueued.
        score_ms: its timestamp (``available_at_ms``).
        hold: steps a serve keeps its slot before it is acked.
        tenant: the fairness group above the key: the group's tenant, else the key.
        env: the environment the message is enqueued in.
    """

    run_id: str
    key: str
    group: str
    queue: str
    arrival_step: int
    score_ms: int
    hold: int
    tenant: str
    env: Environment


@dataclass(kw_only=True)
class Workload:
    """Every message of a scenario for one seed, and the keys in declaration order.

    Per key: its group, weight, environment, base queues (round-robin per message at
    grain ``queue``) and tenant. Per tenant (declaration order): its weight. The limits
    hold only the keys or tenants that have one: ``key_cap`` (a cap override for the
    key), ``tenant_cap``, ``key_rate`` (a token bucket for the key).
    """

    messages: list[SimMessage]
    keys: list[str]
    key_group: dict[str, str]
    key_weight: dict[str, float]
    key_queues: dict[str, list[str]]
    key_tenant: dict[str, str]
    key_env: dict[str, Environment]
    tenant_weight: dict[str, float]
    key_cap: dict[str, int] = field(default_factory=dict)
    tenant_cap: dict[str, int] = field(default_factory=dict)
    key_rate: dict[str, Rate] = field(default_factory=dict)

    @property
    def tenants(self) -> list[str]:
        """Every tenant, in declaration order (of its first key)."""
        return list(self.tenant_weight)

    def env_queues(self) -> dict[Environment, list[str]]:
        """Every environment in use (in order) and its base queues (sorted)."""
        out: dict[Environment, set[str]] = {}
        for key in self.keys:
            out.setdefault(self.key_env[key], set()).update(self.key_queues[key])
        return {env: sorted(queues) for env, queues in sorted(out.items())}


def _hold(h: Hold, rng: random.Random) -> int:
    if h.kind == "fixed":
        return h.steps
    if h.kind == "uniform":
        return rng.randint(h.low, h.high)
    return max(1, round(rng.expovariate(1.0 / h.mean)))


def generate(scenario: Scenario, seed: int) -> Workload:
    """The scenario's messages for ``seed``: identical for every discipline.

    Key ``i`` of a group is in environment ``i mod envs`` and (grain ``ck``) on base
    queue ``(i div envs) mod queues``; its tenant is the group's, else the key itself.
    None of this draws from the seeded generator, so a scenario that sets none of these
    fields generates what it always did.
    """
    rng = random.Random(f"{scenario.name}/{seed}")
    w = Workload(
        messages=[],
        keys=[],
        key_group={},
        key_weight={},
        key_queues={},
        key_tenant={},
        key_env={},
        tenant_weight={},
    )
    for g in scenario.groups:
        hold = g.hold or scenario.hold
        weight_of_tenant = scenario.tenant_weight_of(g)
        cap_of_tenant = scenario.tenant_cap_of(g)
        for i in range(g.keys):
            key = g.key_name(i)
            _place_key(w, scenario, g, i, key, weight_of_tenant, cap_of_tenant)
            w.messages += _key_messages(w, g, i, key, hold, rng)
    return w


def _key_queues(scenario: Scenario, g: Group, i: int, key: str) -> list[str]:
    """The base queues of the group's key ``i``: at grain ``ck`` its one shared queue
    (the group's ``queue``, else spread over ``queues``), at grain ``queue`` the key's
    own (``queues_per_key`` of them)."""
    if scenario.grain == "ck":
        index = g.queue if g.queue is not None else (i // g.envs) % g.queues
        return [ck_queue(index)]
    if g.queues_per_key == 1:
        return [key]
    return [f"{key}.q{j}" for j in range(g.queues_per_key)]


def _place_key(
    w: Workload,
    scenario: Scenario,
    g: Group,
    i: int,
    key: str,
    weight_of_tenant: float,
    cap_of_tenant: int | None,
) -> None:
    """Record the group's key ``i`` in ``w``: its group, weight, environment, queues,
    tenant (whose weight and cap its first key sets) and its own limits. Draws nothing
    from the seeded generator."""
    w.keys.append(key)
    w.key_group[key] = g.name
    w.key_weight[key] = g.weight
    w.key_env[key] = sim_env(i % g.envs)
    w.key_queues[key] = _key_queues(scenario, g, i, key)
    tenant = g.tenant if g.tenant is not None else key
    w.key_tenant[key] = tenant
    w.tenant_weight.setdefault(tenant, weight_of_tenant)
    if cap_of_tenant is not None:
        w.tenant_cap.setdefault(tenant, cap_of_tenant)
    if g.key_cap is not None:
        w.key_cap[key] = g.key_cap
    if g.rate is not None:
        w.key_rate[key] = g.rate


def _key_messages(
    w: Workload, g: Group, i: int, key: str, hold: Hold, rng: random.Random
) -> list[SimMessage]:
    """The messages of the group's key ``i`` (already placed in ``w``): arrival steps and
    timestamps by the group's arrival shape, queues round-robin, each with its hold.

    The draws from ``rng``, in order: the key's shared sub-step offset, then per message
    its arrival gap (poisson), its own offset (interval, poisson) and its hold.
    """
    a = g.arrival
    queues = w.key_queues[key]
    tenant = w.key_tenant[key]
    env = w.key_env[key]
    offset = a.stagger * i
    shared_step = math.floor(a.start + offset)
    shared_score = now_of(shared_step) - rng.randrange(STEP_MS)
    t = a.start + offset
    out: list[SimMessage] = []
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
        out.append(
            SimMessage(
                run_id=f"{key}.{j}",
                key=key,
                group=g.name,
                queue=queues[j % len(queues)],
                arrival_step=step,
                score_ms=score,
                hold=_hold(hold, rng),
                tenant=tenant,
                env=env,
            )
        )
    return out
