"""Changing how many partitions an environment has (the migration from one partition).

Growing from ``S`` to ``S' > S`` partitions: the settings of partition 0 (limits,
options, caps, rates, weights) are copied to the new partitions first, then the
placement record says ``S'``. New runs go to their tenant's partition in the new layout
from then on (each process within PLACEMENT_REFRESH_S); the first ``S`` partitions are
part of the new layout, so the runs already queued there are served as before. A tenant
that moved keeps its runs queued in its old partition until they are served: for that
while it is served from two partitions.

Shrinking from ``S`` to ``S' < S``: new runs go to the ``S'`` partitions at once, and the
record keeps ``S`` as *draining*, so consumers and readers still cover the old ones.
Once they hold nothing (no run queued, running or dead-lettered), calling
:meth:`LayoutOps.set_partitions` again with the same count stops serving them; it
refuses while they hold runs, or sooner than two refresh periods after the shrink (a
process with an old copy of the record may still place a run there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from fairq import keys as K
from fairq.errors import ConfigurationError
from fairq.keys import Environment
from fairq.models import QueueStats
from fairq.store import validate
from fairq.store._core import text_of
from fairq.store.admin import Change, Target, is_quota_change
from fairq.store.options import ENV_OPTIONS, QUEUE_OPTIONS
from fairq.store.placement import PLACEMENT_REFRESH_S, SINGLE, Placement, parse_placement
from fairq.store.quotas import QuotaOps

#: The per-queue override hashes copied to a new partition: target -> QueueKeys attribute.
QUEUE_OVERRIDES: Final[dict[Target, str]] = {
    "key_caps": "key_caps",
    "tenant_caps": "tenant_caps",
    "key_rates": "key_rates",
    "tenant_rates": "tenant_rates",
    "key_weights": "key_weights",
}
#: Most changes one copying configure call carries.
COPY_CHUNK: Final = 1000


def config_changes(config: dict[str, str]) -> list[Change]:
    """The changes that set a config hash's options again (fairq's internal flags are
    left out: the scripts keep them)."""
    out = []
    for field, value in sorted(config.items()):
        if field.startswith(f"{K.QUEUE_PART}:"):
            queue, _, name = field[len(K.QUEUE_PART) + 1 :].rpartition(":")
            option = QUEUE_OPTIONS.get(name)
            if queue and option is not None and not option.internal:
                out.append(Change("config", queue, name, value))
        else:
            option = ENV_OPTIONS.get(field)
            if option is not None and not option.internal:
                out.append(Change("config", None, field, value))
    return out


def config_queues(config: dict[str, str]) -> set[str]:
    """The queues a config hash has settings for."""
    prefix = f"{K.QUEUE_PART}:"
    return {f[len(prefix) :].rpartition(":")[0] for f in config if f.startswith(prefix)} - {""}


class LayoutOps(QuotaOps):
    if TYPE_CHECKING:

        async def _queues_stats_at(
            self, env: Environment, queues: Sequence[str], breakdown: bool, partition: int
        ) -> list[QueueStats]: ...

        async def configure(
            self,
            env: Environment,
            changes: Sequence[Change],
            *,
            partitions: Sequence[int] | None = None,
        ) -> None: ...

    async def stored_placement(self, env: Environment) -> tuple[Placement, int | None]:
        """The environment's placement as the server records it now, and when it last
        shrank (server ms; None: never)."""
        raw = await self.read(self.client.hget(self.keys.placement, env.id))
        if raw is None:
            return SINGLE, None
        text = text_of(raw)
        since = text.partition("@")[2]
        return parse_placement(text), int(since) if since.isdigit() else None

    async def set_partitions(
        self, env: Environment, partitions: int, *, now_ms: int | None = None
    ) -> Placement:
        """Spread the environment over ``partitions`` partitions (1: its shard alone).

        Growing copies the settings to the new partitions before any run can go there;
        shrinking keeps the old partitions served (draining) until a later call with the
        same count finds them empty. Returns the placement now recorded. ``now_ms``: a
        logical clock for the shrink's time (tests); default: the server's.

        Raises:
            InvalidLimitError: ``partitions`` not in 1..min(shard_count, 256).
            ConfigurationError: the draining partitions still hold runs, or the shrink
                was too recent to stop serving them.
        """
        K.check_partitions(partitions, self.keys.shard_count)
        if now_ms is not None:
            validate.time_ms("now_ms", now_ms)
        current, shrunk_at = await self.stored_placement(env)
        if partitions >= current.served:
            added = range(current.served, partitions)
            await self.copy_settings(env, added)
            if partitions > 1:
                await self.start_quotas(env, added, now_ms=now_ms)
            new = Placement(partitions)
        elif partitions != current.partitions:
            new = Placement(partitions, current.served)
        else:
            new = await self._after_drain(env, current, shrunk_at, now_ms)
            if new.served == 1 and current.served > 1:
                await self.end_quotas(env, range(1, current.served), now_ms=now_ms)
        await self._record(env, new, shrinking=new.draining > 0, now_ms=now_ms)
        if new.served > 1:
            await self.rebalance(env, now_ms=now_ms, locked=False)
            await self.split_rates(env)  # equal shares over the partitions now served
        return new

    async def _after_drain(
        self, env: Environment, current: Placement, shrunk_at: int | None, now_ms: int | None
    ) -> Placement:
        """The same count again: stop serving drained partitions (or change nothing)."""
        if current.draining == 0:
            return current
        now = await self.now_or_server(now_ms)
        if shrunk_at is not None and now - shrunk_at < 2_000 * PLACEMENT_REFRESH_S:
            raise ConfigurationError(
                f"{env}: the partitions {current.partitions}..{current.draining - 1} shrank "
                f"away less than {2 * PLACEMENT_REFRESH_S:g} s ago; try again later"
            )
        busy = await self.partition_counts(env, range(current.partitions, current.draining))
        if any(busy.values()):
            raise ConfigurationError(
                f"{env}: the draining partitions still hold runs ({busy}): let them drain"
            )
        return Placement(current.partitions)

    async def _record(
        self, env: Environment, placement: Placement, *, shrinking: bool, now_ms: int | None
    ) -> None:
        value = placement.encode()
        if shrinking:
            value += f"@{await self.now_or_server(now_ms)}"
        if placement == SINGLE:
            await self.read(self.client.hdel(self.keys.placement, env.id))
        else:
            await self.read(self.client.hset(self.keys.placement, env.id, value))
        self.placements.remember(env.id, placement)

    async def partition_counts(self, env: Environment, partitions: Sequence[int]) -> dict[int, int]:
        """Runs each partition holds: queued, running and dead-lettered."""
        queues = await self._all_queues(env, partitions)
        out = {}
        for p in partitions:
            dlq = int(await self.read(self.client.zcard(self.keys.env(env, p).dlq)))
            stats = await self._queues_stats_at(env, queues, False, p) if queues else []
            out[p] = dlq + sum(s.queued + s.running for s in stats)
        return out

    async def _all_queues(self, env: Environment, partitions: Sequence[int]) -> list[str]:
        def build(pipe: Any) -> None:
            for p in partitions:
                pipe.smembers(self.keys.env(env, p).queues)

        return sorted({text_of(m) for row in await self.pipeline(build) for m in row})

    async def copy_settings(self, env: Environment, partitions: Sequence[int]) -> None:
        """Give ``partitions`` the settings of partition 0 (limits, options, caps, rates,
        key, tenant and environment weights), removing any they kept from an earlier
        layout that partition 0 no longer has."""
        # (a partition's limits that are quotas of a cluster-wide cap are its own)
        source = [c for c in await self.settings_of(env, 0) if not is_quota_change(c)]
        kept = {(c.target, c.queue, c.field) for c in source}
        for partition in partitions:
            stale = [
                Change(c.target, c.queue, c.field, None)
                for c in await self.settings_of(env, partition)
                if (c.target, c.queue, c.field) not in kept and not is_quota_change(c)
            ]
            changes = stale + source
            for start in range(0, len(changes), COPY_CHUNK):
                part = changes[start : start + COPY_CHUNK]
                await self.configure(env, part, partitions=[partition])

    async def settings_of(self, env: Environment, partition: int) -> list[Change]:
        """Every setting a partition stores, as the changes that would set it."""
        e = self.keys.env(env, partition)
        shard = self.keys.shard(self.keys.partition_shard(env, partition))

        def first(pipe: Any) -> None:
            pipe.hgetall(e.config)
            pipe.smembers(e.queues)
            pipe.hgetall(e.tenant_weights)
            pipe.hget(shard.env_weights, env.id)

        raw_config, raw_queues, raw_weights, env_weight = await self.pipeline(first)
        config = {text_of(k): text_of(v) for k, v in raw_config.items()}
        changes = config_changes(config)
        changes += [
            Change("tenant_weights", None, text_of(k), text_of(v)) for k, v in raw_weights.items()
        ]
        if env_weight is not None:
            changes.append(Change("env_weights", None, env.id, text_of(env_weight)))
        queues = sorted(config_queues(config) | {text_of(q) for q in raw_queues})
        return changes + await self._override_changes(env, partition, queues)

    async def _override_changes(
        self, env: Environment, partition: int, queues: list[str]
    ) -> list[Change]:
        def build(pipe: Any) -> None:
            for q in queues:
                qk = self.keys.queue(env, q, partition)
                for attr in QUEUE_OVERRIDES.values():
                    pipe.hgetall(getattr(qk, attr))

        rows = iter(await self.pipeline(build))
        out = []
        for q in queues:
            for target in QUEUE_OVERRIDES:
                for k, v in next(rows).items():
                    out.append(Change(target, q, text_of(k), text_of(v)))
        return out
