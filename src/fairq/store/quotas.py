"""Cluster-wide caps of an environment spread over partitions: quotas from a budget.

A spread environment's concurrency limit and its queues' totals are *scopes* (``*`` and
the queue's name). For each, partition 0 keeps a ledger (``quota_ledger.lua``): the cap
and what each partition was granted. A partition's quota is its own limit in its own
config (``quota_partition.lua``): the dequeue script enforces it exactly, in one slot,
with nothing new to read.

Quota moves only one way at a time: a partition lowers its quota by what it does not use
before the ledger takes the amount back, and the ledger grants before a partition raises
its quota. So the quotas never sum above a cap, even between the two steps or after a
crash; in flight never exceeds ``cap x burst`` (the environment's burst factor applies to
each partition's quota). A crash between the two steps only leaves quota unused:
:meth:`QuotaOps.reconcile` heals it (a hold on the ledger, a fence on every partition,
then each grant becomes the quota its partition really holds), and a rebalance runs it
when the ledger has granted more than the partitions hold.

Rebalancing (:meth:`QuotaOps.rebalance`): every partition keeps what it uses; the rest
of a cap goes to the partitions with servable work, in proportion to the summed weight
of their servable tenants (the fair order: up to DEMAND_TENANTS a queue) or by a share
each (only age-order queues); with no work
anywhere, evenly. Partitions with no work give back what they do not use as soon as
another has work, so idle quota goes where work waits within one pass.
Consumers run a pass with their maintenance (once per interval across processes, under
a lock) and when a dequeue of a spread environment was held back by a limit.
The trade-off: a cap may go briefly under-used (quota sits in a partition whose work
just ended, until the next pass), never over.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from fairq import keys as K
from fairq.config import MAX_LIMIT
from fairq.keys import Environment
from fairq.store._core import StoreCore, text_of

#: The scope of the environment's own concurrency limit (no queue is named ``*``).
ENV_SCOPE: Final = "*"
#: How long a reconciliation holds the ledger (ms): grants wait meanwhile.
RECONCILE_HOLD_MS: Final = 5_000
#: How long one process holds an environment's quota lock (ms).
QUOTA_LOCK_MS: Final = 2_000
#: How long the ledger may show more granted than the partitions hold before a
#: rebalance reconciles (s): a move in flight shows the same for a moment.
RECONCILE_AFTER_S: Final = 10.0
#: Servable tenants per queue and partition whose weights a rebalance sums (demand).
DEMAND_TENANTS: Final = 100
#: A queue without a total, as a quota (the scripts' UNLIMITED).
NO_TOTAL: Final = MAX_LIMIT


def quota_field(scope: str) -> str:
    """The config field of a partition that holds its quota of ``scope``."""
    return "concurrency" if scope == ENV_SCOPE else K.config_field(scope, "total")


def is_quota_field(field_name: str, queue: str | None) -> bool:
    """Whether a config option is one a spread environment keeps as shares of a
    cluster-wide value: its concurrency, a queue's total (quotas), a queue's rate limit."""
    if queue is None:
        return field_name == "concurrency"
    return field_name in ("total", *RATE_FIELDS)


#: A queue's rate-limit options, split in equal shares over a spread environment.
RATE_FIELDS: Final = ("rate", "rate_burst")


def rate_share(rate: float, burst: int, partitions: int) -> tuple[float, int]:
    """One partition's share of a queue's rate limit: an equal part of the rate and of
    the burst (at least 1 run)."""
    return rate / partitions, max(1, burst // partitions)


@dataclass(frozen=True, slots=True)
class Ledger:
    """An environment's ledger as read: caps, grants, epoch."""

    caps: dict[str, int] = field(default_factory=dict)
    grants: dict[tuple[str, int], int] = field(default_factory=dict)
    epoch: int = 0
    #: queue -> its cluster-wide rate limit (runs/s, burst), shared equally
    rates: dict[str, tuple[float, int]] = field(default_factory=dict)

    def granted(self, scope: str) -> int:
        return sum(n for (s, _), n in self.grants.items() if s == scope)


def parse_ledger(raw: dict[Any, Any]) -> Ledger:
    caps: dict[str, int] = {}
    grants: dict[tuple[str, int], int] = {}
    rates: dict[str, tuple[float, int]] = {}
    epoch = 0
    for k, v in raw.items():
        name, text = text_of(k), text_of(v)
        kind, _, rest = name.partition(":")
        if kind == "rate":
            rate, _, burst = text.partition(":")
            rates[rest] = (float(rate), int(burst))
            continue
        value = int(text)
        if kind == "cap":
            caps[rest] = value
        elif kind == "grant":
            scope, _, partition = rest.rpartition(":")
            grants[(scope, int(partition))] = value
        elif kind == "epoch":
            epoch = value
    return Ledger(caps, grants, epoch, rates)


def quota_targets(
    cap: int,
    used: Sequence[int],
    demand: Sequence[float],
    credit: Sequence[float] | None = None,
) -> tuple[list[int], list[float]]:
    """Each partition's quota: what it uses, and the rest of the cap shared among the
    partitions with demand in proportion to it. Whole slots only: the fraction a
    partition is owed but not given this pass is its ``credit`` for the next (the slots
    left over go to the largest owed fractions, ties to the lower partition), so over
    passes every partition gets its share even when the cap is smaller than the number
    of partitions with work. With no demand anywhere the rest is shared evenly (so the
    first runs after a quiet time start without waiting for a rebalance). Returns the
    targets and the credits to pass next time."""
    owed = list(credit) if credit is not None else [0.0] * len(used)
    targets = list(used)
    rest = cap - sum(used)
    if rest <= 0 or not used:
        return targets, owed
    total = sum(demand)
    if total <= 0:
        demand, total = [1.0] * len(used), float(len(used))
    exact = [rest * d / total + (owed[p] if d > 0 else 0.0) for p, d in enumerate(demand)]
    whole = [max(0, min(rest, math.floor(x))) for x in exact]
    while sum(whole) > rest:  # (credits can ask for more than there is)
        whole[max(range(len(whole)), key=lambda p: (whole[p], -p))] -= 1
    left = rest - sum(whole)
    order = sorted(range(len(exact)), key=lambda p: (-(exact[p] - whole[p]), p))
    for p in [p for p in order if demand[p] > 0][:left]:
        whole[p] += 1
    new_credit = [max(-1.0, min(1.0, exact[p] - whole[p])) if demand[p] > 0 else 0.0
                  for p in range(len(used))]  # fmt: skip
    return [u + w for u, w in zip(used, whole, strict=True)], new_credit


@dataclass(frozen=True, slots=True)
class PartitionUse:
    """One partition's quota, use and demand of every scope, as read for a pass."""

    quota: dict[str, int]
    used: dict[str, int]
    demand: dict[str, float]


class QuotaOps(StoreCore):
    #: (env id, scope) -> since when the ledger has shown quota no partition holds.
    _leaks: dict[tuple[str, str], float]
    #: (env id, scope) -> each partition's owed fraction of a slot (quota_targets).
    _credits: dict[tuple[str, str], list[float]]

    if TYPE_CHECKING:

        async def queues(self, env: Environment) -> list[str]: ...

    async def ledger(self, env: Environment) -> Ledger:
        raw = await self.read(self.client.hgetall(self.keys.env(env).quota))
        return parse_ledger(raw)

    async def _ledger_call(self, env: Environment, args: list[str], now_ms: int | None) -> Any:
        reply = await self.call(
            "quota_ledger", "age", self.keys.tag_of(env), [env.id, *args], now_ms
        )
        self.decode("quota_ledger", reply[0])
        return reply

    async def _partition_call(
        self, env: Environment, partition: int, args: list[str], now_ms: int | None
    ) -> Any:
        tag = self.keys.tag_of(env, partition)
        reply = await self.call("quota_partition", "age", tag, [env.id, *args], now_ms)
        self.decode("quota_partition", reply[0])
        return reply

    async def set_cap(
        self, env: Environment, scope: str, cap: int | None, *, now_ms: int | None = None
    ) -> None:
        """Set (None: remove) a cluster-wide cap of a spread environment. A new cap first
        clamps every partition to what it uses (then the rebalance shares out the rest);
        a removed queue total leaves every partition without a total."""
        served = (await self.placement(env)).served
        if cap is None:
            await self._ledger_call(env, ["cap", scope, ""], now_ms)
            await self.configure_partitions(env, [("config", scope, "total", None)], range(served))
            return
        known = scope in (await self.ledger(env)).caps
        await self._ledger_call(env, ["cap", scope, str(cap)], now_ms)
        if not known:
            await self.clamp(env, scope, range(served), now_ms)
            await self.reconcile(env, now_ms=now_ms)
        await self.rebalance(env, now_ms=now_ms, locked=False)

    async def set_rate(
        self, env: Environment, queue: str, rate: float | None, burst: int | None
    ) -> None:
        """Set (rate None: remove) a queue's cluster-wide rate limit of a spread
        environment; a burst of None keeps the one in force (1 by default)."""
        if rate is None:
            await self._ledger_call(env, ["rate", queue, ""], None)
        else:
            known = (await self.ledger(env)).rates.get(queue)
            kept = burst if burst is not None else known[1] if known else 1
            await self._ledger_call(env, ["rate", queue, f"{rate!r}:{kept}"], None)
        await self.split_rates(env, [queue])

    async def split_rates(self, env: Environment, queues: Sequence[str] | None = None) -> None:
        """Give every partition its equal share of the queues' cluster-wide rate limits
        (all of them by default; a queue whose limit was removed: none)."""
        ledger = await self.ledger(env)
        served = (await self.placement(env)).served
        for queue in sorted(ledger.rates) if queues is None else queues:
            if queue in ledger.rates:
                rate, burst = rate_share(*ledger.rates[queue], served)
                values: list[str | None] = [repr(rate), str(burst)]
            else:
                values = [None, None]
            changes = [
                ("config", queue, name, v) for name, v in zip(RATE_FIELDS, values, strict=True)
            ]
            await self.configure_partitions(env, changes, range(served))

    async def clamp(
        self, env: Environment, scope: str, partitions: Sequence[int], now_ms: int | None
    ) -> None:
        """Lower each partition's quota of ``scope`` to what it uses (making it explicit)
        and give what it released back to the ledger."""
        epoch = (await self.ledger(env)).epoch
        for p in partitions:
            released = int(
                (await self._partition_call(env, p, ["release", scope, str(MAX_LIMIT)], now_ms))[1]
            )
            if released:
                await self._ledger_call(
                    env, ["return", scope, str(p), str(released), str(epoch)], now_ms
                )

    async def configure_partitions(
        self,
        env: Environment,
        changes: Sequence[tuple[str, str | None, str, str | None]],
        partitions: Sequence[int],
    ) -> None:
        """Write settings to some partitions (configure.lua), bypassing the quota routing."""
        args: list[str] = [env.id]
        for target, queue, name, value in changes:
            args += [target, queue or "", name, "" if value is None else value]
        for partition in partitions:
            tag = self.keys.tag_of(env, partition)
            self.decode("configure", await self.call("configure", "age", tag, args, None))

    async def start_quotas(
        self, env: Environment, new: Sequence[int], *, now_ms: int | None = None
    ) -> None:
        """Give the environment its ledgers (when it first spreads: each cap is what
        partition 0 holds, the environment's limit or the default, and partition 0 is
        granted it) and clamp the ``new`` partitions to what they use, so that they get
        their quota from the ledger (the next rebalance)."""
        ledger = await self.ledger(env)
        if not ledger.caps:
            raw = await self.read(self.client.hgetall(self.keys.env(env).config))
            config = {text_of(k): text_of(v) for k, v in raw.items()}
            default = str(self.config.default_env_concurrency)
            caps = {ENV_SCOPE: int(config.get("concurrency", default))}
            prefix = f"{K.QUEUE_PART}:"
            for name, value in config.items():
                queue, _, option = name[len(prefix) :].rpartition(":")
                if name.startswith(prefix) and option == "total" and queue:
                    caps[queue] = int(value)
            for scope, cap in caps.items():
                await self._ledger_call(env, ["cap", scope, str(cap)], now_ms)
                await self._ledger_call(env, ["grant", scope, "0", str(cap)], now_ms)
                await self.clamp_to(env, 0, scope, cap)
            for name, value in config.items():
                queue, _, option = name[len(prefix) :].rpartition(":")
                if name.startswith(prefix) and option == "rate" and queue:
                    burst = config.get(K.config_field(queue, "rate_burst"), "1")
                    await self._ledger_call(env, ["rate", queue, f"{value}:{burst}"], now_ms)
            ledger = await self.ledger(env)
        for scope in ledger.caps:
            await self.clamp(env, scope, new, now_ms)

    async def end_quotas(
        self, env: Environment, drained: Sequence[int], *, now_ms: int | None = None
    ) -> None:
        """Back to one partition: the drained partitions keep no quota, partition 0 gets
        every cap as its own limit, and the ledger is emptied."""
        ledger = await self.ledger(env)
        for scope, cap in sorted(ledger.caps.items()):
            await self.clamp(env, scope, drained, now_ms)
            await self.clamp_to(env, 0, scope, cap)
            await self._ledger_call(env, ["cap", scope, ""], now_ms)
        for queue, (rate, burst) in sorted(ledger.rates.items()):
            changes = [
                ("config", queue, "rate", repr(rate)),
                ("config", queue, "rate_burst", str(burst)),
            ]
            await self.configure_partitions(env, changes, [0])
            await self._ledger_call(env, ["rate", queue, ""], now_ms)

    async def clamp_to(self, env: Environment, partition: int, scope: str, quota: int) -> None:
        """Make a partition's quota of ``scope`` explicit (the value it holds already)."""
        queue = None if scope == ENV_SCOPE else scope
        name = "concurrency" if scope == ENV_SCOPE else "total"
        await self.configure_partitions(env, [("config", queue, name, str(quota))], [partition])

    # ------------------------------------------------------------------ rebalancing

    async def partition_use(
        self, env: Environment, scopes: Sequence[str], partitions: int, queues: Sequence[str]
    ) -> list[PartitionUse]:
        """Every partition's quota, use and demand of ``scopes``: one round trip, and one
        more for the weights of the servable tenants when there are any."""
        members = [K.heads_member(k, env, q) for q in queues for k in (K.KIND_QUEUE, K.KIND_CK)]
        totals = [s for s in scopes if s != ENV_SCOPE]
        shards = self.keys.partition_shards(env, partitions)

        def build(pipe: Any) -> None:
            for p, shard in enumerate(shards):
                e = self.keys.env(env, p)
                pipe.hmget(e.config, ["burst_factor", *(quota_field(s) for s in scopes)])
                pipe.scard(e.inflight)
                for q in totals:
                    qk = self.keys.queue(env, q, p)
                    pipe.scard(qk.inflight)
                    pipe.get(qk.ck_running_counter)
                if members:
                    pipe.zmscore(self.keys.shard(shard).heads, members)
                for q in queues:
                    tq = self.keys.queue(env, q, p).ready_tenants
                    pipe.zrange(tq, 0, DEMAND_TENANTS - 1)

        now, rows = await self.timed_pipeline(build)
        width = 2 + 2 * len(totals) + (1 + len(queues) if queues else 0)
        head = width - len(queues)  # before the servable tenants' lists
        parts = [rows[p * width : (p + 1) * width] for p in range(partitions)]
        servable = [
            {q: [text_of(m) for m in row[head + i]] for i, q in enumerate(queues)} for row in parts
        ]
        weights = await self._tenant_weights(env, servable)
        return [
            self._use(parts[p][:head], scopes, totals, queues, now, weights[p])
            for p in range(partitions)
        ]

    async def _tenant_weights(
        self, env: Environment, servable: list[dict[str, list[str]]]
    ) -> list[dict[str, float]]:
        """Per partition and queue, the summed weight of its servable tenants (a tenant's
        own weight, else for a key serving as its tenant the key's, else 1)."""
        if not any(names for by_queue in servable for names in by_queue.values()):
            return [dict.fromkeys(by_queue, 0.0) for by_queue in servable]

        def build(pipe: Any) -> None:
            for p, by_queue in enumerate(servable):
                for q, names in by_queue.items():
                    if names:
                        pipe.hmget(self.keys.env(env, p).tenant_weights, names)
                        pipe.hmget(self.keys.queue(env, q, p).key_weights, names)

        rows = iter(await self.pipeline(build))
        out = []
        for by_queue in servable:
            summed = {}
            for q, names in by_queue.items():
                own, keyed = (next(rows), next(rows)) if names else ([], [])
                summed[q] = sum(
                    float(t if t is not None else k if k is not None else 1.0)
                    for t, k in zip(own, keyed, strict=True)
                )
            out.append(summed)
        return out

    def _use(
        self,
        row: list[Any],
        scopes: Sequence[str],
        totals: Sequence[str],
        queues: Sequence[str],
        now: int,
        weights: dict[str, float],
    ) -> PartitionUse:
        config, inflight, *rest = row
        burst = float(config[0]) if config[0] is not None else self.config.default_burst_factor
        quota = {}
        for scope, raw in zip(scopes, config[1:], strict=True):
            fallback = self.config.default_env_concurrency if scope == ENV_SCOPE else NO_TOTAL
            quota[scope] = int(raw) if raw is not None else fallback
        used = {ENV_SCOPE: math.ceil(int(inflight) / burst - 1e-9)}
        for i, q in enumerate(totals):
            used[q] = int(rest[2 * i]) + int(rest[2 * i + 1] or 0)
        heads = rest[2 * len(totals)] if queues else []
        per_queue = {}
        for i, q in enumerate(queues):
            ready = any(h is not None and float(h) <= now for h in (heads or [])[2 * i : 2 * i + 2])
            # the weight of its servable tenants (fair order); ready runs count 1 at least
            per_queue[q] = max(weights.get(q, 0.0), 1.0 if ready else 0.0)
        demand = {ENV_SCOPE: sum(per_queue.values())}
        for q in totals:
            demand[q] = per_queue.get(q, 0.0)
        return PartitionUse(quota, used, demand)

    async def rebalance(
        self, env: Environment, *, now_ms: int | None = None, locked: bool = True
    ) -> int:
        """One rebalancing pass over the environment's capped scopes (see the module's
        docstring). With ``locked``, only one process at a time (a short lock; a pass that
        finds it taken does nothing). Returns how much quota partitions gained."""
        lock = self.keys.env(env).quota_lock
        if locked and not await self.read(self.client.set(lock, b"1", nx=True, px=QUOTA_LOCK_MS)):
            return 0
        try:
            return await self._rebalance(env, now_ms)
        finally:
            if locked:
                await self.read(self.client.delete(lock))

    async def _rebalance(self, env: Environment, now_ms: int | None) -> int:
        ledger = await self.ledger(env)
        if not ledger.caps:
            return 0
        served = (await self.placement(env)).served
        scopes = sorted(ledger.caps)
        queues = await self.queues(env)
        uses = await self.partition_use(env, scopes, served, queues)
        gained = 0
        for scope in scopes:
            quotas = [u.quota[scope] for u in uses]
            used = [u.used[scope] for u in uses]
            demand = [u.demand[scope] for u in uses]
            credit = self._credits.get((env.id, scope))
            if credit is not None and len(credit) != len(uses):
                credit = None
            targets, self._credits[(env.id, scope)] = quota_targets(
                ledger.caps[scope], used, demand, credit
            )
            after = await self._move(env, scope, quotas, targets, ledger.epoch, now_ms)
            gained += sum(max(0, a - q) for a, q in zip(after, quotas, strict=True))
            leaked = ledger.granted(scope) - sum(min(q, NO_TOTAL) for q in quotas)
            self._note_leak(env, scope, leaked > 0)
        if any(self._leaking(env, scope) for scope in scopes):
            await self.reconcile(env, now_ms=now_ms)
        return gained

    async def _move(
        self,
        env: Environment,
        scope: str,
        quotas: list[int],
        targets: list[int],
        epoch: int,
        now_ms: int | None,
    ) -> list[int]:
        """Release what partitions hold above their target (then return it to the ledger),
        then grant what others lack (then add it to their quota)."""
        after = list(quotas)

        async def release(p: int) -> None:
            want = quotas[p] - targets[p]
            reply = await self._partition_call(env, p, ["release", scope, str(want)], now_ms)
            released, after[p] = int(reply[1]), int(reply[2])
            if released:
                args = ["return", scope, str(p), str(released), str(epoch)]
                await self._ledger_call(env, args, now_ms)

        async def grant(p: int) -> None:
            args = ["grant", scope, str(p), str(targets[p] - quotas[p])]
            reply = await self._ledger_call(env, args, now_ms)
            granted, at = int(reply[1]), int(reply[2])
            if granted:
                added = await self._partition_call(
                    env, p, ["add", scope, str(granted), str(at)], now_ms
                )
                after[p] = int(added[2])

        await asyncio.gather(*(release(p) for p in range(len(quotas)) if quotas[p] > targets[p]))
        await asyncio.gather(*(grant(p) for p in range(len(quotas)) if quotas[p] < targets[p]))
        return after

    def _note_leak(self, env: Environment, scope: str, leaking: bool) -> None:
        key = (env.id, scope)
        if not leaking:
            self._leaks.pop(key, None)
        else:
            self._leaks.setdefault(key, time.monotonic())

    def _leaking(self, env: Environment, scope: str) -> bool:
        since = self._leaks.get((env.id, scope))
        return since is not None and time.monotonic() - since >= RECONCILE_AFTER_S

    async def reconcile(self, env: Environment, *, now_ms: int | None = None) -> bool:
        """Heal quota lost between the two steps of a move: hold the ledger, fence every
        partition (moves begun before are refused there) reading what it holds, then make
        each grant what its partition holds. Returns whether it completed (False: another
        reconciliation or a lost reply got in between; nothing is over-granted either way)."""
        ledger = await self.ledger(env)
        scopes = sorted(ledger.caps)
        if not scopes:
            return True
        served = (await self.placement(env)).served
        begun = await self._ledger_call(env, ["begin", str(RECONCILE_HOLD_MS)], now_ms)
        epoch = str(int(begun[1]))
        fences = await asyncio.gather(
            *(
                self._partition_call(env, p, ["fence", epoch, *scopes], now_ms)
                for p in range(served)
            )
        )
        quotas: list[str] = []
        for p, reply in enumerate(fences):
            for scope, quota in zip(scopes, reply[1:], strict=True):
                quotas += [scope, str(p), str(min(int(quota), NO_TOTAL))]
        done = await self._ledger_call(env, ["end", epoch, *quotas], now_ms)
        for scope in scopes:
            self._leaks.pop((env.id, scope), None)
        return bool(int(done[1]))

    async def rebalance_spread(self, *, now_ms: int | None = None) -> None:
        """A rebalancing pass over every spread environment (maintenance calls it)."""
        for env_id in sorted(await self.spread_placements()):
            await self.rebalance(Environment.parse(env_id), now_ms=now_ms)
