"""The deterministic step harness: drives fairq's real scripts on a logical clock.

One run = one scenario x one discipline x one seed, on a fresh key prefix. Step ``k``
has the clock ``now_ms = BASE_MS + k x STEP_MS`` (one step is one second of logical
time, so a rate of R runs per step is a server rate limit of R runs per second); on each
step, in this order:

1. runs whose hold has ended are acked (``RunQueue.ack``, logical clock);
2. the messages arriving at this step are enqueued (``RunQueue.enqueue_many``), each to
   its own environment and base queue, with its key and (when it is not the key's
   default) its tenant;
3. one batched dequeue: with one environment ``dequeue(n, env=..., queues=...)`` over
   all of its base queues, with several ``dequeue(n)`` across them (the store's
   selection strategy picks the environments); ``age`` is the age order, ``sfq`` the
   fair order (the scripts decide the order, the harness never does). The reference
   models (``drr``, ``stride``, ``tsfq``) and CoDel's hoist instead choose one key and
   serve it with a ``max_count`` 1 ``RunQueue.dequeue_variant`` (the chosen flow's oldest
   run of the base priority level; the fair order's state does not move), so a model's
   runs are enqueued without a level and its queues do not age them (the record's label
   names ``priority`` and ``aging`` as not applied);
4. every delivered message is recorded with its step.

Every limit of the scenario is a real gate on the server, set before the first step:
the environment limit and burst factor, ``per_key_cap`` / ``key_cap``
(``set_queue_concurrency`` / ``set_key_concurrency``; grain ``queue``: the queue's own
limit), ``tenant_cap`` (``set_tenant_concurrency``), ``total_cap``
(``set_queue_total_concurrency``), ``rate`` (``set_rate_limit(..., key=...)``; grain
``queue``: the queue's rate), ``borrow`` and ``charge`` (``set_queue_options``), the
tenant and key weights, a group's ``priority`` (every message's level at enqueue; the
queues get 9 levels when a group asks for one above 5) and ``aging`` (the queues'
``max_wait_promote``, ``aging`` steps). The server's caps, totals and rates are per base
queue: where a scenario's unit spans several queues (a capped tenant on several queues, a
total cap over several queues, a rate-limited owner of several queues at grain ``queue``)
each queue gets the limit, and :func:`per_queue_fields` names the field in the record's
label.

Steps on which nothing can change are skipped (the previous call served nothing and no
ack, arrival or time-gated run is due); nothing sleeps. The messages themselves (arrival
steps, timestamps, holds, tenants, queues, environments) come from
:mod:`fairq.sim.workload`.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from fairq.config import MAX_LIMIT, RunQueueConfig, VirtualTimeOptions
from fairq.keys import DEFAULT_PRIORITY_LEVELS, MAX_LEVELS, Environment, default_level
from fairq.models import Delivery, DequeueBatch, EnqueueRequest
from fairq.server import AnyRedis
from fairq.sim.admission import TwoLevelModel
from fairq.sim.disciplines import MODELS, CoDelState, Discipline, DisciplineError, Model, make_model
from fairq.sim.scenario import Pool, Scenario
from fairq.sim.workload import STEP_MS, SimMessage, Workload, ck_queue, generate, now_of
from fairq.store import RunQueue

#: Lease long enough that no simulated hold ever loses it.
SIM_LEASE_MS = 86_400_000
#: Scenario fields the driver does not apply (see :func:`unapplied_fields`): none.
NOT_APPLIED: tuple[str, ...] = ()
#: Fields the reference models do not apply: they serve a flow with ``dequeue_variant``,
#: which reads the base level's runs only, so their runs are enqueued without a level and
#: their queues do not promote (a run at another level would never be served).
LEVEL_FIELDS: Final = ("priority", "aging")
#: Queues one dequeue call may name (the script's bound).
MAX_QUEUES_PER_CALL: Final = 1000
#: Commands that are the harness's own bookkeeping, not the queue's work.
_UNCOUNTED = (
    "info", "config", "client", "hello", "ping", "script", "function", "select", "auth", "command",
)  # fmt: skip


def fields_in_use(scenario: Scenario, discipline: Discipline) -> list[str]:
    """The tenant, spread, limit, charging and pool fields the scenario (or, for
    ``charge``, ``admit`` and ``state``, the discipline) uses, in schema order. ``charge``
    counts only with the fair order (sfq) and only when it is ``duration``; ``admit`` and
    ``state`` only when not the default (``floor``, ``env``)."""
    groups = scenario.groups
    used = {
        "tenant": any(g.tenant is not None for g in groups),
        "tenant_weight": any(g.tenant_weight is not None for g in groups),
        "queues": any(g.queues > 1 for g in groups),
        "envs": any(g.envs > 1 for g in groups),
        "key_cap": any(g.key_cap is not None for g in groups),
        "tenant_cap": any(g.tenant_cap is not None for g in groups),
        "rate": any(g.rate is not None for g in groups),
        "borrow": discipline.borrow(scenario.borrow),
        "charge": discipline.name == "sfq" and discipline.charge(scenario.charge) == "duration",
        "queue": any(g.queue is not None for g in groups),
        "priority": any(g.priority is not None for g in groups),
        "pools": bool(scenario.pools),
        "aging": scenario.aging is not None,
        # the model's admission rule and fair state per pool (options, like charge)
        "admit": discipline.options.get("admit", "floor") != "floor",
        "state": discipline.options.get("state", "env") != "env",
    }
    return [name for name, on in used.items() if on]


def unapplied_fields(scenario: Scenario, discipline: Discipline) -> list[str]:
    """The fields in use that this driver does not apply (the run ignores them): those
    of :data:`NOT_APPLIED`, and for a reference model (not ``discipline.real``) the
    priority levels (:data:`LEVEL_FIELDS`)."""
    return [
        name
        for name in fields_in_use(scenario, discipline)
        if name in NOT_APPLIED or (name in LEVEL_FIELDS and not levels_apply(discipline))
    ]


def levels_apply(discipline: Discipline) -> bool:
    """Whether a run enqueues at the groups' priority levels and ages them: only the real
    scripts (age, sfq, and CoDel around them) serve every level."""
    return discipline.real


def queue_levels(scenario: Scenario) -> int | None:
    """The ``priority_levels`` the queues need: None (the default, 5) unless a group asks
    for a level above 5, then :data:`~fairq.keys.MAX_LEVELS` (whose middle level is 5)."""
    highest = max((g.priority or 0 for g in scenario.groups), default=0)
    return MAX_LEVELS if highest > DEFAULT_PRIORITY_LEVELS else None


def group_levels(scenario: Scenario, discipline: Discipline) -> dict[str, int]:
    """Each group's priority level when the run applies levels (the group's own, else the
    queues' middle level), else nothing: the record reports these."""
    if not levels_apply(discipline) or not (
        scenario.aging is not None or any(g.priority is not None for g in scenario.groups)
    ):
        return {}
    middle = default_level(queue_levels(scenario) or DEFAULT_PRIORITY_LEVELS)
    return {g.name: g.priority or middle for g in scenario.groups}


def _places(w: Workload, keys: Sequence[str]) -> set[tuple[Environment, str]]:
    return {(w.key_env[k], q) for k in keys for q in w.key_queues[k]}


def per_queue_fields(scenario: Scenario, discipline: Discipline, workload: Workload) -> list[str]:
    """Limits the scenario puts on a unit that spans several base queues, which the
    server applies per base queue instead (each queue gets the whole limit): a
    ``tenant_cap`` of a tenant with work on several queues, a ``total_cap`` over several
    queues, a ``rate`` of a key owning several queues (grain ``queue``)."""
    w = workload
    out = []
    capped = [t for t, cap in w.tenant_cap.items() if cap > 0]
    if any(len(_places(w, [k for k in w.keys if w.key_tenant[k] == t])) > 1 for t in capped):
        out.append("tenant_cap")
    if discipline.cap("total_cap", scenario.total_cap) and len(_places(w, w.keys)) > 1:
        out.append("total_cap")
    if any(len(_places(w, [k])) > 1 for k in w.key_rate):
        out.append("rate")
    return out


@dataclass
class Trace:
    """What one run did: the raw material of every metric and plot.

    ``serve_step``: the step of each message's first delivery; ``release_step``: the
    step that delivery's slot is released (acked), ``serve_step + hold``: the message
    occupies a slot on the steps ``serve_step .. release_step - 1``; ``served_from``: the
    environment id and base queue that first delivery came from.
    """

    workload: Workload
    #: Each group's priority level, when the run enqueued at levels (else empty).
    group_level: dict[str, int] = field(default_factory=dict)
    serve_step: dict[str, int] = field(default_factory=dict)
    release_step: dict[str, int] = field(default_factory=dict)
    served_from: dict[str, tuple[str, str]] = field(default_factory=dict)
    deliveries: int = 0
    duplicates: int = 0
    dequeue_calls: int = 0
    last_step: int = 0
    commands: int = 0
    truncated: bool = False


async def command_calls(rq: RunQueue) -> int:
    """Successful server commands so far (the store's INFO commandstats, summed over
    every master), minus the harness's own bookkeeping."""
    stats = await rq.command_stats()
    return sum(n for name, n in stats.items() if name.split("|", 1)[0] not in _UNCOUNTED)


def _store_config(scenario: Scenario, discipline: Discipline, prefix: str) -> RunQueueConfig:
    """The store's configuration for one run: the scenario's shards, environment limit
    and the simulator's lease, and the discipline's fair-order options (``quantum``,
    ``window``, ``join``, ``arrival_cap``, ``admit``, ``max_per_key_per_call``); every
    option the discipline does not set keeps the store's default."""
    fair = discipline.name == "sfq"
    opts = discipline.options
    per_key = opts.get("max_per_key_per_call")
    default = VirtualTimeOptions()
    vtime = VirtualTimeOptions(
        enabled=fair,
        quantum=float(opts.get("quantum", default.quantum)) if fair else 1.0,  # type: ignore[arg-type]
        scan_window_multiplier=int(opts.get("window", default.scan_window_multiplier)),  # type: ignore[call-overload]
        join_policy=str(opts.get("join", default.join_policy)),  # type: ignore[arg-type]
        arrival_cap=float(opts.get("arrival_cap", default.arrival_cap)),  # type: ignore[arg-type]
        admission=str(opts.get("admit", default.admission)) if fair else "floor",  # type: ignore[arg-type]
        charge_unit_ms=STEP_MS,
    )
    return RunQueueConfig(
        prefix=prefix,
        shard_count=scenario.shards,
        default_env_concurrency=scenario.env_concurrency,
        lease_ms=SIM_LEASE_MS,
        # the store's default unless the discipline sets it: age 1, fair the whole call
        max_per_key_per_call=per_key if isinstance(per_key, int) else None,
        vtime=vtime,
    )


@dataclass
class _RunState:
    """What the step loop of :meth:`Simulation.run` carries from one step to the next:
    the arrivals by step (and which is next), the deliveries awaiting their ack
    (a heap of ``(release step, sequence, delivery)``) and the runs still queued."""

    arrivals: dict[int, list[SimMessage]]
    arrival_steps: list[int]
    next_arrival: int = 0
    releases: list[tuple[int, int, Delivery]] = field(default_factory=list)
    seq: int = 0
    queued: int = 0

    @classmethod
    def of(cls, messages: Sequence[SimMessage]) -> _RunState:
        """The state before the first step: every message pending arrival."""
        arrivals: dict[int, list[SimMessage]] = {}
        for m in messages:
            arrivals.setdefault(m.arrival_step, []).append(m)
        return cls(arrivals, sorted(arrivals))

    @property
    def more_arrivals(self) -> bool:
        """Whether some arrival step is still ahead."""
        return self.next_arrival < len(self.arrival_steps)

    @property
    def done(self) -> bool:
        """Whether everything has arrived, been served and been acked."""
        return not self.more_arrivals and self.queued == 0 and not self.releases


class Simulation:
    """One run of a scenario under a discipline and a seed on a fresh key prefix.

    ``client`` is the runner's connection (the store's; the harness reads the server's
    command counts through the store).
    """

    def __init__(
        self,
        client: AnyRedis,
        scenario: Scenario,
        discipline: Discipline,
        seed: int,
        *,
        prefix: str,
    ) -> None:
        self.scenario = scenario
        self.discipline = discipline
        self.seed = seed
        self.prefix = prefix
        self.per_key_cap = discipline.cap("per_key_cap", scenario.per_key_cap)
        self.total_cap = discipline.cap("total_cap", scenario.total_cap)
        self.fair = discipline.name == "sfq"
        self.charge = discipline.charge(scenario.charge) if self.fair else "count"
        self.borrow = discipline.borrow(scenario.borrow)
        config = _store_config(scenario, discipline, prefix)
        self.rq = RunQueue(client, config, rng=random.Random(f"select/{scenario.name}/{seed}"))
        self.workload = generate(scenario, seed)
        self.trace = Trace(self.workload, group_levels(scenario, discipline))
        #: The level each group's messages are enqueued at (None: none named).
        self.level_of = {
            g.name: g.priority if levels_apply(discipline) else None for g in scenario.groups
        }
        w = self.workload
        self.model: Model | TwoLevelModel | None = (
            make_model(discipline, w.key_weight, w.keys, w.key_tenant, w.tenant_weight)
            if discipline.name in MODELS
            else None
        )
        if discipline.codel is not None and scenario.pools:
            raise DisciplineError("codel: not with consumer pools (one hoist per step)")
        #: per pool: its queues, the slots it holds, and which pool served each run
        self.pool_queues = {p.name: [ck_queue(i) for i in p.queues] for p in scenario.pools}
        self.busy_pool: Counter[str] = Counter()
        self.pool_of: dict[str, str] = {}
        self.codel: CoDelState | None = None
        if discipline.codel is not None:
            self.codel = CoDelState(
                target=discipline.codel.get("target", 5),
                interval=discipline.codel.get("interval", 10),
            )
        self.by_id = {m.run_id: m for m in w.messages}
        #: Every environment in use and its base queues.
        self.env_queues = w.env_queues()
        # driver-side bookkeeping (never consulted by age/sfq, which the scripts order)
        self.waiting: dict[str, deque[SimMessage]] = {}
        for key in w.keys:
            for q in w.key_queues[key]:
                self.waiting.setdefault(self._slot(key, q), deque())
        self.busy: Counter[str] = Counter()  # per slot (key cap)
        self.busy_tenant: Counter[tuple[Environment, str, str]] = Counter()  # tenant cap
        self.busy_queue: Counter[tuple[Environment, str]] = Counter()  # total cap
        self.busy_env: Counter[Environment] = Counter()  # env limit
        self.taken: set[str] = set()
        #: Keys whose dequeue_variant served nothing this step (a gate the driver does
        #: not model, such as a rate limit): the models pass them over until the next.
        self.refused: set[str] = set()

    def _slot(self, key: str, queue: str) -> str:
        """The unit a per-key cap gates: the variant (grain ck) or the base queue."""
        return key if self.scenario.grain == "ck" else queue

    def _named_tenant(self, m: SimMessage) -> str | None:
        """The tenant to name at enqueue: None when it is the run's default (a key that is
        its own tenant). At grain ``queue`` a key owns queues of keyless runs, whose
        default tenant is the queue, so the key's tenant is always named."""
        if self.scenario.grain == "ck" and m.tenant == m.key:
            return None
        return m.tenant

    def key_cap_of(self, key: str) -> int:
        """The key's cap (0 = none): its group's ``key_cap``, else ``per_key_cap``."""
        if key in self.workload.key_cap:
            return self.workload.key_cap[key]
        return self.per_key_cap

    # ------------------------------------------------------------------ setup

    async def setup(self) -> None:
        s, w, rq = self.scenario, self.workload, self.rq
        for env, queues in self.env_queues.items():
            if s.shards > 1:  # spread first: the limits below are then cluster-wide caps
                await rq.set_partitions(env, s.shards)
            await rq.set_env_limits(env, concurrency=s.env_concurrency, burst_factor=s.burst_factor)
            options: dict[str, object] = {}
            if self.per_key_cap:
                options["concurrency"] = self.per_key_cap
            if self.total_cap:
                options["total"] = self.total_cap
            if self.borrow:
                options["borrow"] = True
            if self.charge == "duration":
                options["charge"] = "duration"
            if levels_apply(self.discipline):
                levels = queue_levels(s)
                if levels is not None:
                    options["priority_levels"] = levels
                if s.aging is not None:
                    options["max_wait_promote"] = s.aging * STEP_MS / 1000
            if options:
                for q in queues:
                    await rq.set_queue_options(env, q, **options)
        for key in w.keys:
            env = w.key_env[key]
            queues = w.key_queues[key]
            cap = w.key_cap.get(key)
            if s.grain == "queue":
                if cap is not None:
                    for q in queues:
                        await rq.set_queue_concurrency(env, q, cap or None)
                rate = w.key_rate.get(key)
                if rate is not None:
                    for q in queues:
                        await rq.set_queue_options(
                            env, q, rate=rate.per_step, rate_burst=rate.burst
                        )
                continue
            (q,) = queues
            if cap is not None and (cap or self.per_key_cap):
                # key_cap 0 = no cap for this key: above anything the env allows
                await rq.set_key_concurrency(env, q, key, cap or MAX_LIMIT)
            rate = w.key_rate.get(key)
            if rate is not None:
                await rq.set_rate_limit(env, q, rate.per_step, burst=rate.burst, key=key)
            if w.key_tenant[key] != key and w.key_weight[key] != 1.0:
                await rq.set_concurrency_key_weight(env, q, key, w.key_weight[key])
        placed: dict[str, set[tuple[Environment, str]]] = defaultdict(set)
        for key in w.keys:
            placed[w.key_tenant[key]] |= _places(w, [key])
        for tenant, places in placed.items():
            weight = w.tenant_weight[tenant]
            if weight != 1.0:
                for env in sorted({env for env, _ in places}):
                    await rq.set_tenant_weight(env, tenant, weight)
            cap = w.tenant_cap.get(tenant)
            if cap:
                for env, q in sorted(places):
                    await rq.set_tenant_concurrency(env, q, tenant, cap)

    async def cleanup(self) -> None:
        """Delete every key of this run's prefix."""
        await self.rq.purge()

    # ------------------------------------------------------------------ the loop

    async def run(self) -> Trace:
        """Run to completion (or ``steps_limit``) and return the trace."""
        await self.setup()
        before = await command_calls(self.rq)
        state = _RunState.of(self.workload.messages)
        step = state.arrival_steps[0] if state.arrival_steps else 0
        limit = self.scenario.steps_limit
        while step <= limit:
            now = now_of(step)
            self.refused.clear()
            await self._ack_due(state, step, now)
            await self._enqueue_arrivals(state, step, now)
            served = 0
            wait_ms: int | None = None
            if state.queued:
                served, wait_ms = await self._serve_step(state, step, now)
            if state.done:
                break
            if served and state.queued:
                step += 1
                continue
            next_step = self._next_step(state, step, wait_ms)
            if next_step is None:
                break  # queued work that nothing can ever serve: reported as lost
            step = next_step
        else:
            self.trace.truncated = True
        self.trace.commands = await command_calls(self.rq) - before
        return self.trace

    async def _ack_due(self, state: _RunState, step: int, now: int) -> None:
        """Ack every delivery whose hold has ended by ``step`` (one call) and free its
        slots."""
        due: list[Delivery] = []
        while state.releases and state.releases[0][0] <= step:
            due.append(heapq.heappop(state.releases)[2])
        if due:
            await self.rq.ack(due, now_ms=now)
            for d in due:
                self._released(self.by_id[d.run_id])

    async def _enqueue_arrivals(self, state: _RunState, step: int, now: int) -> None:
        """Enqueue the messages arriving at ``step`` (one call), each with its key (grain
        ``ck``), timestamp, named tenant and level, and put them on the driver's waiting
        lists in timestamp order."""
        if not (state.more_arrivals and state.arrival_steps[state.next_arrival] == step):
            return
        batch = state.arrivals[step]
        state.next_arrival += 1
        grain_ck = self.scenario.grain == "ck"
        await self.rq.enqueue_many(
            [
                EnqueueRequest(
                    m.env,
                    m.queue,
                    m.run_id,
                    None,
                    m.key if grain_ck else None,
                    available_at_ms=m.score_ms,
                    tenant=self._named_tenant(m),
                    priority=self.level_of[m.group],
                )
                for m in batch
            ],
            now_ms=now,
        )
        for m in sorted(batch, key=lambda m: (m.score_ms, m.run_id)):
            self.waiting[self._slot(m.key, m.queue)].append(m)
        state.queued += len(batch)

    async def _serve_step(self, state: _RunState, step: int, now: int) -> tuple[int, int | None]:
        """This step's dequeue, recorded: how many messages were served for the first
        time, and the store's hint of how long until something held back is ready."""
        delivered, wait_ms = await self.dequeue(step, now)
        sojourns = self._record(state, step, delivered)
        if self.codel is not None:
            self.codel.observe(step, sojourns)
        if sojourns:
            self.trace.last_step = step
        return len(sojourns), wait_ms

    def _record(self, state: _RunState, step: int, delivered: list[Delivery]) -> list[int]:
        """Record each delivery in the trace (a message's first as its serve, any later
        one as a duplicate) and schedule its ack; the sojourns (steps waited) of the
        first serves."""
        sojourns: list[int] = []
        for d in delivered:
            m = self.by_id[d.run_id]
            self.trace.deliveries += 1
            if d.run_id in self.trace.serve_step:
                self.trace.duplicates += 1
            else:
                self.trace.serve_step[d.run_id] = step
                self.trace.release_step[d.run_id] = step + m.hold
                self.trace.served_from[d.run_id] = (d.env.id, d.queue)
                state.queued -= 1
                sojourns.append(step - m.arrival_step)
            state.seq += 1
            heapq.heappush(state.releases, (step + m.hold, state.seq, d))
        return sojourns

    def _next_step(self, state: _RunState, step: int, wait_ms: int | None) -> int | None:
        """The next step on which something can change (an arrival, an ack, a held-back
        run or a rate limit's token coming due), or None when nothing ever will."""
        candidates = []
        if state.more_arrivals:
            candidates.append(state.arrival_steps[state.next_arrival])
        if state.releases:
            candidates.append(state.releases[0][0])
        if state.queued and wait_ms is not None:
            # something held back (a delayed head, a rate limit's next token) is due
            candidates.append(step + max(1, math.ceil(wait_ms / STEP_MS)))
        elif state.queued and self.workload.key_rate and self._rate_limited_waiting():
            # a rate-limited key with work gets its next token within 1/rate steps
            candidates.append(step + 1)
        if not candidates:
            return None
        return max(step + 1, min(candidates))

    def _rate_limited_waiting(self) -> bool:
        w = self.workload
        return any(self._has_work(k) for k in w.key_rate)

    # ------------------------------------------------------------------ one step's dequeue

    async def dequeue(self, step: int, now: int) -> tuple[list[Delivery], int | None]:
        """This step's deliveries, and (when none) the store's hint of how long until
        something held back is ready (ms). With consumer pools, each pool's call in turn
        (for what its free slots allow, over its own queues)."""
        if not self.scenario.pools:
            return await self._dequeue_for(None, self.scenario.max_count, now)
        out: list[Delivery] = []
        wait: int | None = None
        for pool in self.scenario.pools:
            n = min(self.scenario.max_count, pool.slots - self.busy_pool[pool.name])
            if n <= 0:
                continue
            got, hint = await self._dequeue_for(pool, n, now)
            for d in got:
                self.pool_of[d.run_id] = pool.name
                self.busy_pool[pool.name] += 1
            out += got
            if hint is not None:
                wait = hint if wait is None else min(wait, hint)
        return out, None if out else wait

    def _in_pool(self, key: str, pool: Pool | None) -> bool:
        return pool is None or any(
            q in self.pool_queues[pool.name] for q in self.workload.key_queues[key]
        )

    async def _dequeue_for(
        self, pool: Pool | None, budget: int, now: int
    ) -> tuple[list[Delivery], int | None]:
        """One consumer's deliveries (``pool`` None: the one consumer of every queue)."""
        out: list[Delivery] = []
        if self.codel is not None and self.codel.dropping:
            stalest = self._stalest()
            if stalest is not None:
                out += self._took(await self._serve_one(stalest, now))
        remaining = budget - len(out)
        if remaining <= 0:
            return out, None
        if self.model is None:
            queues = None if pool is None else self.pool_queues[pool.name]
            batch = await self._dequeue_scripts(remaining, now, queues)
            return out + self._took(batch.deliveries), batch.wait_ms
        name = "*" if pool is None else pool.name
        # the pool's own view with fair state per pool, else the environment's
        scoped = isinstance(self.model, TwoLevelModel) and self.model.per_pool
        for _ in range(remaining):
            while True:
                ready = [
                    k
                    for k in self._ready_keys()
                    if k not in self.refused and self._in_pool(k, pool)
                ]
                backlogged = {
                    k
                    for k in self.workload.keys
                    if self._has_work(k) and (not scoped or self._in_pool(k, pool))
                }
                key = self.model.pick(ready, backlogged, name)
                if key is None:
                    return out, None
                got = self._took(await self._serve_one(key, now))
                if got:
                    break
                # held back by a gate the driver does not model: not this step
                self.refused.add(key)
            for d in got:
                self.model.served(self.by_id[d.run_id].key, name)
            out += got
        return out, None

    async def _dequeue_scripts(
        self, max_count: int, now: int, only: list[str] | None = None
    ) -> DequeueBatch:
        """One dequeue through the scripts (age / sfq): one environment's queues (``only``:
        a pool's), or across the environments (the store's selection strategy)."""
        self.trace.dequeue_calls += 1
        if len(self.env_queues) > 1:
            return await self.rq.dequeue_batch(max_count, now_ms=now)
        ((env, queues),) = self.env_queues.items()
        if only is not None:
            queues = [q for q in queues if q in only]
        if len(queues) <= MAX_QUEUES_PER_CALL:
            return await self.rq.dequeue_batch(max_count, env=env, queues=queues, now_ms=now)
        got: list[Delivery] = []
        wait: int | None = None
        for start in range(0, len(queues), MAX_QUEUES_PER_CALL):
            if len(got) >= max_count:
                break
            part = queues[start : start + MAX_QUEUES_PER_CALL]
            batch = await self.rq.dequeue_batch(
                max_count - len(got), env=env, queues=part, now_ms=now
            )
            got += batch.deliveries
            if batch.wait_ms is not None:
                wait = batch.wait_ms if wait is None else min(wait, batch.wait_ms)
        return DequeueBatch(got, None if got else wait)

    def _took(self, delivered: list[Delivery]) -> list[Delivery]:
        """Driver bookkeeping for delivered runs: off the waiting lists, into the slots."""
        for d in delivered:
            m = self.by_id[d.run_id]
            slot = self._slot(m.key, m.queue)
            if d.run_id not in self.taken:
                self.taken.add(d.run_id)
                q = self.waiting[slot]
                if q and q[0] is m:
                    q.popleft()
                else:
                    q.remove(m)
            self.busy[slot] += 1
            self.busy_tenant[(m.env, m.queue, m.tenant)] += 1
            self.busy_queue[(m.env, m.queue)] += 1
            self.busy_env[m.env] += 1
        return delivered

    def _released(self, m: SimMessage) -> None:
        pool = self.pool_of.pop(m.run_id, None)
        if pool is not None:
            self.busy_pool[pool] -= 1
        self.busy[self._slot(m.key, m.queue)] -= 1
        self.busy_tenant[(m.env, m.queue, m.tenant)] -= 1
        self.busy_queue[(m.env, m.queue)] -= 1
        self.busy_env[m.env] -= 1

    def _has_work(self, key: str) -> bool:
        return any(self.waiting[self._slot(key, q)] for q in self.workload.key_queues[key])

    def _open_slots(self, key: str) -> list[str]:
        """The key's slots (variant or queues) with waiting work and room under the caps
        the driver knows (key, tenant and total caps; the env limit is checked by
        :meth:`_ready_keys`)."""
        w = self.workload
        env = w.key_env[key]
        tenant = w.key_tenant[key]
        cap = self.key_cap_of(key)
        tenant_cap = w.tenant_cap.get(tenant, 0)
        out = []
        for q in dict.fromkeys(w.key_queues[key]):
            s = self._slot(key, q)
            if not self.waiting[s]:
                continue
            if cap and self.busy[s] >= cap:
                continue
            if tenant_cap and self.busy_tenant[(env, q, tenant)] >= tenant_cap:
                continue
            if self.total_cap and self.busy_queue[(env, q)] >= self.total_cap:
                continue
            out.append(s)
        return out

    def _ready_keys(self) -> list[str]:
        limit = math.floor(self.scenario.env_concurrency * self.scenario.burst_factor)
        w = self.workload
        return [k for k in w.keys if self.busy_env[w.key_env[k]] < limit and self._open_slots(k)]

    def _stalest(self) -> str | None:
        best: tuple[int, int, int] | None = None
        choice = None
        for rank, key in enumerate(self.workload.keys):
            for s in self._open_slots(key):
                head = self.waiting[s][0]
                cand = (head.arrival_step, head.score_ms, rank)
                if best is None or cand < best:
                    best, choice = cand, key
        return choice

    async def _serve_one(self, key: str, now: int) -> list[Delivery]:
        """Serve the oldest run of ``key`` (``max_count`` 1) with ``dequeue_variant``: at
        grain ``ck`` its variant, at grain ``queue`` its queue with the oldest head."""
        self.trace.dequeue_calls += 1
        env = self.workload.key_env[key]
        # a run's key is scoped by the tenant it names: serve that tenant's flow of the key
        tenant = self.workload.key_tenant[key]
        if self.scenario.grain == "queue":
            slots = self._open_slots(key)
            if not slots:
                return []
            queue = min(slots, key=lambda s: (self.waiting[s][0].score_ms, s))
            return await self.rq.dequeue_variant(
                env, queue, None, tenant=tenant, max_count=1, now_ms=now
            )
        (queue,) = self.workload.key_queues[key]
        named = None if tenant == key else tenant
        return await self.rq.dequeue_variant(env, queue, key, tenant=named, max_count=1, now_ms=now)
