"""The deterministic step harness: drives fairq's real scripts on a logical clock.

One run = one scenario x one discipline x one seed, on a fresh key prefix. Step ``k``
has the clock ``now_ms = BASE_MS + k x STEP_MS``; on each step, in this order:

1. runs whose hold has ended are acked (``RunQueue.ack``, logical clock);
2. the messages arriving at this step are enqueued (``RunQueue.enqueue_many``);
3. one batched dequeue: grain ``ck`` calls ``dequeue_from_queue(..., keyed=True)``,
   grain ``queue`` calls ``dequeue(...)`` over the environment's queues (``age`` = the
   flag off, ``sfq`` = the flag on; the scripts decide the order, the harness never does).
   The reference models (``drr``, ``stride``) and CoDel's hoist instead choose one key
   and serve it with a ``max_count`` 1 call of the age-order script (at grain ``ck`` by
   re-scoring that variant's ``ckindex`` entry first, exactly as the seed's spike did);
4. every delivered message is recorded with its step.

Steps on which nothing can change are skipped (the previous call served nothing and no
ack or arrival is due); nothing sleeps. The messages themselves (arrival steps,
timestamps, holds, tenants, queues, environments) come from :mod:`fairq.sim.workload`.

Scenario fields this driver does not apply to the server yet are listed by
:func:`unapplied_fields`; a run behaves as if they were absent (every message in
:data:`SIM_ENV`, at grain ``ck`` on :data:`CK_QUEUE`) and its record's label says so.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from dataclasses import dataclass, field

from fairq.config import RunQueueConfig, VirtualTimeOptions
from fairq.models import Delivery, EnqueueRequest
from fairq.server import AnyRedis, info_per_node
from fairq.sim.disciplines import CoDelState, Discipline, Model, make_model
from fairq.sim.scenario import Scenario
from fairq.sim.workload import CK_QUEUE, SIM_ENV, SimMessage, Workload, generate, now_of
from fairq.store import RunQueue

#: Lease long enough that no simulated hold ever loses it.
SIM_LEASE_MS = 86_400_000
#: Scenario fields the driver does not apply yet (see :func:`unapplied_fields`).
NOT_APPLIED = (
    "tenant", "tenant_weight", "queues", "envs", "key_cap", "tenant_cap", "rate", "borrow",
    "charge",
)  # fmt: skip
#: Commands that are the harness's own bookkeeping, not the queue's work.
_UNCOUNTED = ("info", "config", "client", "hello", "ping", "script", "select", "auth", "command")


def fields_in_use(scenario: Scenario, discipline: Discipline) -> list[str]:
    """The tenant, spread, limit and charging fields the scenario (or, for ``charge``, the
    discipline) uses, in schema order. ``charge`` counts only with the fair order (sfq)
    and only when it is ``duration``."""
    groups = scenario.groups
    used = {
        "tenant": any(g.tenant is not None for g in groups),
        "tenant_weight": any(g.tenant_weight is not None for g in groups),
        "queues": any(g.queues > 1 for g in groups),
        "envs": any(g.envs > 1 for g in groups),
        "key_cap": any(g.key_cap is not None for g in groups),
        "tenant_cap": any(g.tenant_cap is not None for g in groups),
        "rate": any(g.rate is not None for g in groups),
        "borrow": scenario.borrow,
        "charge": discipline.name == "sfq" and discipline.charge(scenario.charge) == "duration",
    }
    return [name for name, on in used.items() if on]


def unapplied_fields(scenario: Scenario, discipline: Discipline) -> list[str]:
    """The fields in use that this driver does not apply (the run ignores them)."""
    return [name for name in fields_in_use(scenario, discipline) if name in NOT_APPLIED]


@dataclass
class Trace:
    """What one run did: the raw material of every metric and plot.

    ``serve_step``: the step of each message's first delivery; ``release_step``: the
    step that delivery's slot is released (acked), ``serve_step + hold``: the message
    occupies a slot on the steps ``serve_step .. release_step - 1``.
    """

    workload: Workload
    serve_step: dict[str, int] = field(default_factory=dict)
    release_step: dict[str, int] = field(default_factory=dict)
    deliveries: int = 0
    duplicates: int = 0
    dequeue_calls: int = 0
    last_step: int = 0
    commands: int = 0
    truncated: bool = False


async def command_calls(client: AnyRedis) -> int:
    """Successful calls in INFO commandstats, summed over every master
    (``calls - failed_calls``, so a first EVALSHA that meets NOSCRIPT is not counted),
    minus the harness's own bookkeeping."""
    total = 0
    for stats in (await info_per_node(client, "commandstats")).values():
        for name, row in stats.items():
            command = str(name).removeprefix("cmdstat_")
            if command.split("|", 1)[0] in _UNCOUNTED:
                continue
            if isinstance(row, dict):
                total += int(row.get("calls", 0)) - int(row.get("failed_calls", 0))
    return total


class Simulation:
    """One run of a scenario under a discipline and a seed on a fresh key prefix."""

    def __init__(
        self,
        client: AnyRedis,
        scenario: Scenario,
        discipline: Discipline,
        seed: int,
        *,
        prefix: str,
    ) -> None:
        self.client = client
        self.scenario = scenario
        self.discipline = discipline
        self.seed = seed
        self.prefix = prefix
        self.per_key_cap = discipline.cap("per_key_cap", scenario.per_key_cap)
        self.total_cap = discipline.cap("total_cap", scenario.total_cap)
        opts = discipline.options
        vtime = VirtualTimeOptions(
            enabled=discipline.name == "sfq",
            quantum=float(opts.get("quantum", 1.0)) if discipline.name == "sfq" else 1.0,  # type: ignore[arg-type]
            scan_window_multiplier=int(opts.get("window", 3)),  # type: ignore[call-overload]
            join_policy=str(opts.get("join", "floor")),  # type: ignore[arg-type]
            arrival_cap=float(opts.get("arrival_cap", 2.0**32)),  # type: ignore[arg-type]
        )
        config = RunQueueConfig(
            prefix=prefix,
            shard_count=1,
            default_env_concurrency=scenario.env_concurrency,
            lease_ms=SIM_LEASE_MS,
            max_per_key_per_call=int(opts.get("max_per_key_per_call", 1)),  # type: ignore[call-overload]
            vtime=vtime,
        )
        self.rq = RunQueue(client, config, rng=random.Random(f"select/{scenario.name}/{seed}"))
        # the age-order script, for the reference models' and CoDel's one-key serves
        self.aged = RunQueue(
            client,
            RunQueueConfig(
                prefix=prefix, shard_count=1, default_env_concurrency=scenario.env_concurrency,
                lease_ms=SIM_LEASE_MS,
            ),
            rng=random.Random(0),
        )  # fmt: skip
        self.workload = generate(scenario, seed)
        self.trace = Trace(self.workload)
        w = self.workload
        self.model: Model | None = (
            make_model(discipline, w.key_weight, w.keys)
            if discipline.name in ("drr", "stride")
            else None
        )
        self.codel: CoDelState | None = None
        if discipline.codel is not None:
            self.codel = CoDelState(
                target=discipline.codel.get("target", 5),
                interval=discipline.codel.get("interval", 10),
            )
        self.by_id = {m.run_id: m for m in w.messages}
        # grain ck: every variant on CK_QUEUE (the ``queues`` spread is not applied)
        self.queue_of_key = (
            w.key_queues if scenario.grain == "queue" else {k: [CK_QUEUE] for k in w.keys}
        )
        # driver-side bookkeeping (never consulted by age/sfq, which the scripts order)
        self.waiting: dict[str, deque[SimMessage]] = {}
        for key in w.keys:
            for q in w.key_queues[key]:
                self.waiting.setdefault(self._slot(key, q), deque())
        self.busy: Counter[str] = Counter()
        self.inflight_total = 0
        self.taken: set[str] = set()

    def _slot(self, key: str, queue: str) -> str:
        """The unit a per-key cap gates: the variant (grain ck) or the base queue."""
        return key if self.scenario.grain == "ck" else queue

    # ------------------------------------------------------------------ setup

    async def setup(self) -> None:
        s = self.scenario
        await self.rq.set_env_limits(
            SIM_ENV, concurrency=s.env_concurrency, burst_factor=s.burst_factor
        )
        queues = sorted({q for qs in self.queue_of_key.values() for q in qs})
        if self.per_key_cap:
            for q in queues:
                await self.rq.set_queue_concurrency(SIM_ENV, q, self.per_key_cap)
        if s.grain == "ck":
            for key, weight in self.workload.key_weight.items():
                if weight != 1.0:
                    await self.rq.set_concurrency_key_weight(SIM_ENV, CK_QUEUE, key, weight)

    async def cleanup(self) -> None:
        """Delete every key of this run's prefix (single-key commands, cluster-safe)."""
        batch: list[bytes] = []
        async for key in self.client.scan_iter(match="{" + self.prefix + ".*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                await self._delete(batch)
                batch = []
        await self._delete(batch)

    async def _delete(self, batch: list[bytes]) -> None:
        if batch:
            pipe = self.client.pipeline(transaction=False)
            for key in batch:
                pipe.unlink(key)
            await pipe.execute()

    # ------------------------------------------------------------------ the loop

    async def run(self) -> Trace:
        """Run to completion (or ``steps_limit``) and return the trace."""
        await self.setup()
        before = await command_calls(self.client)
        arrivals: dict[int, list[SimMessage]] = {}
        for m in self.workload.messages:
            arrivals.setdefault(m.arrival_step, []).append(m)
        arrival_steps = sorted(arrivals)
        next_arrival = 0
        releases: list[tuple[int, int, Delivery]] = []
        seq = 0
        queued = 0
        step = arrival_steps[0] if arrival_steps else 0
        limit = self.scenario.steps_limit
        while step <= limit:
            now = now_of(step)
            due: list[Delivery] = []
            while releases and releases[0][0] <= step:
                due.append(heapq.heappop(releases)[2])
            if due:
                await self.rq.ack(due, now_ms=now)
                for d in due:
                    m = self.by_id[d.run_id]
                    self.busy[self._slot(m.key, m.queue)] -= 1
                    self.inflight_total -= 1
            if next_arrival < len(arrival_steps) and arrival_steps[next_arrival] == step:
                batch = arrivals[step]
                next_arrival += 1
                await self.rq.enqueue_many(
                    [
                        EnqueueRequest(
                            SIM_ENV,
                            m.queue if self.scenario.grain == "queue" else CK_QUEUE,
                            m.run_id,
                            None,
                            m.key if self.scenario.grain == "ck" else None,
                            available_at_ms=m.score_ms,
                        )
                        for m in batch
                    ],
                    now_ms=now,
                )
                for m in sorted(batch, key=lambda m: (m.score_ms, m.run_id)):
                    self.waiting[self._slot(m.key, m.queue)].append(m)
                queued += len(batch)
            served = 0
            if queued:
                delivered = await self.dequeue(step, now)
                sojourns: list[int] = []
                for d in delivered:
                    m = self.by_id[d.run_id]
                    self.trace.deliveries += 1
                    if d.run_id in self.trace.serve_step:
                        self.trace.duplicates += 1
                    else:
                        self.trace.serve_step[d.run_id] = step
                        self.trace.release_step[d.run_id] = step + m.hold
                        queued -= 1
                        served += 1
                        sojourns.append(step - m.arrival_step)
                    seq += 1
                    heapq.heappush(releases, (step + m.hold, seq, d))
                if self.codel is not None:
                    self.codel.observe(step, sojourns)
                if served:
                    self.trace.last_step = step
            done = next_arrival >= len(arrival_steps) and queued == 0 and not releases
            if done:
                break
            if served and queued:
                step += 1
                continue
            candidates = []
            if next_arrival < len(arrival_steps):
                candidates.append(arrival_steps[next_arrival])
            if releases:
                candidates.append(releases[0][0])
            if not candidates:
                break  # queued work that nothing can ever serve: reported as lost
            step = max(step + 1, min(candidates))
        else:
            self.trace.truncated = True
        self.trace.commands = await command_calls(self.client) - before
        return self.trace

    # ------------------------------------------------------------------ one step's dequeue

    async def dequeue(self, step: int, now: int) -> list[Delivery]:
        budget = self.scenario.max_count
        if self.total_cap:
            budget = min(budget, self.total_cap - self.inflight_total)
        if budget <= 0:
            return []
        out: list[Delivery] = []
        if self.codel is not None and self.codel.dropping:
            stalest = self._stalest()
            if stalest is not None:
                out += self._took(await self._serve_one(stalest, now))
        remaining = budget - len(out)
        if remaining <= 0:
            return out
        if self.model is None:
            self.trace.dequeue_calls += 1
            if self.scenario.grain == "ck":
                got = await self.rq.dequeue_from_queue(
                    SIM_ENV, CK_QUEUE, keyed=True, max_count=remaining, now_ms=now
                )
            else:
                got = await self.rq.dequeue(remaining, now_ms=now)
            return out + self._took(got)
        for _ in range(remaining):
            ready = self._ready_keys()
            backlogged = {k for k in self.workload.keys if self._has_work(k)}
            key = self.model.pick(ready, backlogged)
            if key is None:
                break
            got = self._took(await self._serve_one(key, now))
            if not got:
                break
            for d in got:
                self.model.served(self.by_id[d.run_id].key)
            out += got
        return out

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
            self.inflight_total += 1
        return delivered

    def _has_work(self, key: str) -> bool:
        return any(self.waiting[self._slot(key, q)] for q in self.queue_of_key[key])

    def _open_slots(self, key: str) -> list[str]:
        """The key's slots (variant or queues) with waiting work and room under the cap."""
        slots = [self._slot(key, q) for q in self.queue_of_key[key]]
        return [
            s for s in dict.fromkeys(slots)
            if self.waiting[s] and (not self.per_key_cap or self.busy[s] < self.per_key_cap)
        ]  # fmt: skip

    def _ready_keys(self) -> list[str]:
        limit = math.floor(self.scenario.env_concurrency * self.scenario.burst_factor)
        if self.inflight_total >= limit:
            return []
        return [k for k in self.workload.keys if self._open_slots(k)]

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
        """Serve one message of ``key`` through the age-order script (``max_count`` 1)."""
        self.trace.dequeue_calls += 1
        if self.scenario.grain == "queue":
            slots = self._open_slots(key)
            if not slots:
                return []
            queue = min(slots, key=lambda s: (self.waiting[s][0].score_ms, s))
            return await self.aged.dequeue_from_queue(
                SIM_ENV, queue, keyed=False, max_count=1, now_ms=now
            )
        # the reference models choose the key; the store serves that key's oldest run
        return await self.aged.dequeue_variant(SIM_ENV, CK_QUEUE, key, max_count=1, now_ms=now)
