"""Limits, scheduling options, caps, rate limits and weights, stored on the server.

Every setter validates everything first and then applies all of its changes in one
atomic script call (``configure.lua``), so a partly wrong command changes nothing, and
clearing one setting never resets another. Values are read by every process's scripts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from fairq import keys as K
from fairq.errors import InvalidLimitError, InvalidNameError
from fairq.keys import Environment
from fairq.store import validate
from fairq.store._core import StoreCore
from fairq.store.options import (
    BURST_OVERRIDE,
    CAP_OVERRIDE,
    ENV_OPTIONS,
    QUEUE_OPTIONS,
    WEIGHT_OVERRIDE,
    parse_rate,
)
from fairq.store.quotas import ENV_SCOPE, RATE_FIELDS, Ledger, is_quota_field

Target = Literal[
    "config", "key_caps", "tenant_caps", "key_rates", "tenant_rates", "key_weights",
    "tenant_weights", "env_weights",
]  # fmt: skip

#: Most changes one configure call applies.
MAX_CHANGES: Final = 10_000
#: Sentinel: leave the option as it is.
_KEEP: Final = object()


@dataclass(frozen=True, slots=True)
class Change:
    """One stored setting to write (``value`` = None removes it)."""

    target: Target
    queue: str | None
    field: str
    value: str | None


def env_option(name: str, value: object) -> Change:
    """A validated change of an environment option (None removes it).

    Raises:
        InvalidLimitError: unknown option or bad value.
    """
    option = ENV_OPTIONS.get(name)
    if option is None or option.internal:
        public = ", ".join(sorted(n for n, o in ENV_OPTIONS.items() if not o.internal))
        raise InvalidLimitError("environment option", name, f"must be one of {public}")
    return Change("config", None, name, None if value is None else option.encode(name, value))


def queue_option(queue: str, name: str, value: object) -> Change:
    """A validated change of a queue option (None removes it).

    Raises:
        InvalidLimitError: unknown option or bad value.
        InvalidNameError: bad queue name.
    """
    K.validate_name("queue", queue, allow_slash=True)
    option = QUEUE_OPTIONS.get(name)
    if option is None or option.internal:
        public = ", ".join(sorted(n for n, o in QUEUE_OPTIONS.items() if not o.internal))
        raise InvalidLimitError("queue option", name, f"must be one of {public}")
    return Change("config", queue, name, None if value is None else option.encode(name, value))


def is_quota_change(change: Change) -> bool:
    """Whether a change sets a limit a spread environment keeps as quotas of a
    cluster-wide cap (its concurrency, a queue's total): see store/quotas.py."""
    return change.target == "config" and is_quota_field(change.field, change.queue)


def rate_value(rate: str | float | int, burst: int) -> str:
    per_second = parse_rate(rate)
    return f"{per_second!r}:{BURST_OVERRIDE.encode('rate burst', burst)}"


def cap_value(name: str, cap: int) -> str:
    """A concurrency cap override as stored (an integer in the cap override's range)."""
    return str(validate.integer(name, cap, int(CAP_OVERRIDE.low), int(CAP_OVERRIDE.high)))


def weight_value(weight: float) -> str:
    """A fair-order weight as stored (a number in the weight override's range)."""
    return repr(validate.number("weight", weight, WEIGHT_OVERRIDE.low, WEIGHT_OVERRIDE.high))


class AdminOps(StoreCore):
    if TYPE_CHECKING:

        async def set_cap(
            self, env: Environment, scope: str, cap: int | None, *, now_ms: int | None = None
        ) -> None: ...

        async def set_rate(
            self, env: Environment, queue: str, rate: float | None, burst: int | None
        ) -> None: ...

        async def ledger(self, env: Environment) -> Ledger: ...

    async def purge(self) -> int:
        """Delete every key of this store's prefix (tests, the simulator, the demo).
        Returns how many keys it deleted. Uses SCAN (on every master of a cluster)."""
        patterns = ["{" + self.keys.prefix + ".*", self.keys.prefix + ":*"]
        deleted = 0

        async def sweep(client: Any) -> int:
            found = 0
            for pattern in patterns:
                batch: list[Any] = []
                async for key in client.scan_iter(match=pattern, count=1000):
                    batch.append(key)
                    if len(batch) >= 500:
                        found += await self._unlink(batch)
                        batch = []
                found += await self._unlink(batch)
            return found

        # a cluster client's scan_iter walks every master
        deleted += await self.read(sweep(self.client))
        return deleted

    async def _unlink(self, keys: list[Any]) -> int:
        if not keys:
            return 0

        def build(pipe: Any) -> None:
            for key in keys:
                pipe.execute_command("UNLINK", key)  # a cluster pipeline's unlink() is a coroutine

        return sum(int(n) for n in await self.pipeline(build))

    async def configure(
        self,
        env: Environment,
        changes: Sequence[Change],
        *,
        partitions: Sequence[int] | None = None,
    ) -> None:
        """Apply changes to one environment's settings atomically (all or nothing).

        An environment spread over several partitions keeps its settings in each: the
        changes are applied to every partition (or to ``partitions``), one script call
        each, partition 0 first. Every call checks the same changes, so they all apply or
        the first refuses; a connection lost between two calls leaves the later
        partitions unchanged until the same changes are applied again (applying them is
        idempotent).
        """
        if not isinstance(env, Environment):
            raise InvalidNameError("environment", env, "must be an Environment")
        if len(changes) > MAX_CHANGES:
            raise InvalidLimitError("changes", len(changes), f"at most {MAX_CHANGES} per call")
        args: list[str] = [env.id]
        for c in changes:
            args += [c.target, c.queue or "", c.field, "" if c.value is None else c.value]
        if not changes:
            return
        if partitions is None:
            served = (await self.placement(env)).served
            if served > 1 and any(is_quota_change(c) for c in changes):
                await self._configure_spread(env, changes, served)
                return
            partitions = range(served)
        for partition in partitions:
            tag = self.keys.tag_of(env, partition)
            self.decode("configure", await self.call("configure", "age", tag, args, None))

    async def _configure_spread(
        self, env: Environment, changes: Sequence[Change], served: int
    ) -> None:
        """Changes to a spread environment: its concurrency and queue totals become the
        ledger's caps (each partition holds a quota of them); the rest goes everywhere."""
        rest = [c for c in changes if not is_quota_change(c)]
        if rest:
            await self.configure(env, rest, partitions=range(served))
        rates: dict[str, dict[str, str | None]] = {}
        for c in changes:
            if not is_quota_change(c):
                continue
            if c.queue is not None and c.field in RATE_FIELDS:
                rates.setdefault(c.queue, {})[c.field] = c.value
                continue
            scope = ENV_SCOPE if c.queue is None else c.queue
            if c.value is not None:
                cap: int | None = int(c.value)
            else:  # no limit of its own: the default, cluster-wide; no total: none
                cap = self.config.default_env_concurrency if c.queue is None else None
            await self.set_cap(env, scope, cap)
        for queue, given in rates.items():
            await self._set_spread_rate(env, queue, given)

    async def _set_spread_rate(
        self, env: Environment, queue: str, given: dict[str, str | None]
    ) -> None:
        """A queue's rate-limit changes of a spread environment: its cluster-wide rate
        (a burst removed is 1 again; a burst alone keeps the rate)."""
        burst: int | None = None
        if "rate_burst" in given:
            raw_burst = given["rate_burst"]
            burst = 1 if raw_burst is None else int(raw_burst)
        if "rate" in given:
            raw_rate = given["rate"]
            rate = None if raw_rate is None else float(raw_rate)
        else:
            known = (await self.ledger(env)).rates.get(queue)
            rate = None if known is None else known[0]
        await self.set_rate(env, queue, rate, burst)

    # ------------------------------------------------------------------ environments

    async def set_env_limits(
        self,
        env: Environment,
        *,
        concurrency: int | None = None,
        burst_factor: float | None = None,
        queue_size_limit: int | None = None,
    ) -> None:
        """Set an environment's concurrency limit, burst factor and default queue size
        limit (an argument left at None is left as it is)."""
        changes = []
        if concurrency is not None:
            changes.append(
                env_option("concurrency", validate.limit("env concurrency limit", concurrency))
            )
        if burst_factor is not None:
            changes.append(env_option("burst_factor", burst_factor))
        if queue_size_limit is not None:
            changes.append(
                env_option("max_queue_size", validate.limit("queue size limit", queue_size_limit))
            )
        await self.configure(env, changes)

    async def clear_env_limits(self, env: Environment, *names: str) -> None:
        """Back to the defaults for the named env limits (concurrency, burst_factor,
        max_queue_size); all three when none is named."""
        chosen = names or ("concurrency", "burst_factor", "max_queue_size")
        await self.configure(env, [env_option(n, None) for n in chosen])

    async def remove_env_limits(self, env: Environment) -> None:
        """Back to the configured defaults (concurrency, burst factor, size limit)."""
        await self.clear_env_limits(env)

    async def set_env_options(self, env: Environment, **options: object) -> None:
        """Set (or with None remove) an environment's scheduling defaults for its queues:
        ``order`` ("age"/"fair"), ``max_per_key``, ``quantum``, ``window``, ``join``,
        ``arrival_cap``, ``charge``."""
        await self.configure(env, [env_option(n, v) for n, v in options.items()])

    async def set_env_weight(self, env: Environment, weight: float | None) -> None:
        """Weight an environment in the fair order across its shard's environments."""
        value = None if weight is None else weight_value(weight)
        await self.configure(env, [Change("env_weights", None, env.id, value)])

    # ------------------------------------------------------------------ queues

    async def set_queue_options(self, env: Environment, queue: str, **options: object) -> None:
        """Set (or with None remove) a queue's limits and options in one atomic step:
        ``concurrency``, ``max_size``, ``paused``, ``total``, ``rate``/``rate_burst``,
        ``key_rate``/``key_rate_burst``, ``tenant_rate``/``tenant_rate_burst``, ``borrow``,
        ``order``, ``max_per_key``, ``quantum``, ``window``, ``join``, ``arrival_cap``,
        ``charge``."""
        await self.configure(env, [queue_option(queue, n, v) for n, v in options.items()])

    async def set_queue_concurrency(self, env: Environment, queue: str, limit: int | None) -> None:
        """Set a queue's concurrency limit (per concurrency key; keyless runs share it);
        None removes it. 0 lets nothing start (prefer :meth:`pause_queue`)."""
        value = None if limit is None else validate.limit("queue concurrency limit", limit)
        await self.set_queue_options(env, queue, concurrency=value)

    async def pause_queue(self, env: Environment, queue: str) -> None:
        """No new run of the queue starts until it is resumed; its limits are kept."""
        await self.set_queue_options(env, queue, paused=True)

    async def resume_queue(self, env: Environment, queue: str) -> None:
        """Undo :meth:`pause_queue` (the queue keeps its concurrency limit)."""
        await self.set_queue_options(env, queue, paused=None)

    async def set_queue_size_limit(self, env: Environment, queue: str, limit: int | None) -> None:
        """Cap a queue's queued runs (keyless + all variants); None removes (0 = no cap)."""
        value = None if limit is None else validate.limit("queue size limit", limit)
        await self.set_queue_options(env, queue, max_size=value)

    async def set_queue_total_concurrency(
        self, env: Environment, queue: str, limit: int | None
    ) -> None:
        """Bound the runs in flight of a queue across all its keys and keyless runs
        together (None removes)."""
        value = None if limit is None else validate.limit("total concurrency limit", limit)
        await self.set_queue_options(env, queue, total=value)

    async def set_rate_limit(
        self,
        env: Environment,
        queue: str,
        rate: str | float | None,
        *,
        burst: int = 1,
        key: str | None = None,
        tenant: str | None = None,
        per: Literal["key", "tenant"] | None = None,
    ) -> None:
        """Limit how fast runs start (a token bucket on the server's clock).

        Args:
            rate: ``"100/s"``, ``"30/m"``, ``"5/h"`` or runs per second; None removes.
            burst: how many may start at once after a quiet period (1..1e6).
            key: the limit of one concurrency key (an override); or
            tenant: the limit of one tenant (an override); or
            per: ``"key"`` / ``"tenant"``: the default limit of every key / tenant of the
                queue; with none of these, the limit of the queue as a whole.
        """
        if per not in (None, "key", "tenant"):
            raise InvalidLimitError("rate limit per", per, "must be 'key', 'tenant' or None")
        if sum(x is not None for x in (key, tenant, per)) > 1:
            raise InvalidLimitError(
                "rate limit scope", (key, tenant, per), "give one of key, tenant, per"
            )
        value = None if rate is None else rate_value(rate, burst)
        if key is not None:
            change = Change("key_rates", queue, K.encode_concurrency_key(key), value)
            K.validate_name("queue", queue, allow_slash=True)
            await self.configure(env, [change])
            return
        if tenant is not None:
            K.validate_name("queue", queue, allow_slash=True)
            await self.configure(
                env, [Change("tenant_rates", queue, K.encode_tenant(tenant), value)]
            )
            return
        prefix = {"key": "key_", "tenant": "tenant_", None: ""}[per]
        if rate is None:
            await self.set_queue_options(
                env, queue, **{f"{prefix}rate": None, f"{prefix}rate_burst": None}
            )
        else:
            per_second = parse_rate(rate)
            await self.set_queue_options(
                env, queue, **{f"{prefix}rate": per_second, f"{prefix}rate_burst": burst}
            )

    async def set_key_concurrency(
        self, env: Environment, queue: str, concurrency_key: str, cap: int | None
    ) -> None:
        """A concurrency cap for one key of a queue (an override of the per-key limit;
        None restores the queue's limit)."""
        K.validate_name("queue", queue, allow_slash=True)
        ck = K.encode_concurrency_key(concurrency_key)
        value = None if cap is None else cap_value("key concurrency cap", cap)
        await self.configure(env, [Change("key_caps", queue, ck, value)])

    async def set_tenant_concurrency(
        self, env: Environment, queue: str, tenant: str, cap: int | None
    ) -> None:
        """A concurrency cap for one tenant in a queue, across its keys (a tenant without
        one has no cap of its own: its keys' caps and the environment's limit apply)."""
        K.validate_name("queue", queue, allow_slash=True)
        value = None if cap is None else cap_value("tenant concurrency cap", cap)
        await self.configure(env, [Change("tenant_caps", queue, K.encode_tenant(tenant), value)])

    async def set_concurrency_key_weight(
        self, env: Environment, queue: str, concurrency_key: str, weight: float | None
    ) -> None:
        """Weight a key in the fair order: inside its tenant, or, for a key that is its
        own tenant, as that tenant (advance = quantum / weight); None resets to 1."""
        K.validate_name("queue", queue, allow_slash=True)
        ck = K.encode_concurrency_key(concurrency_key)
        value = None if weight is None else weight_value(weight)
        await self.configure(env, [Change("key_weights", queue, ck, value)])

    async def set_tenant_weight(self, env: Environment, tenant: str, weight: float | None) -> None:
        """Weight a tenant in its environment's fair order (across all its queues)."""
        value = None if weight is None else weight_value(weight)
        await self.configure(env, [Change("tenant_weights", None, K.encode_tenant(tenant), value)])

    async def record_audit(
        self,
        env: Environment,
        *,
        who: str,
        action: str,
        target: str,
        detail: str = "",
        now_ms: int | None = None,
    ) -> None:
        """Record one admin action in the environment's audit list (the last 1,000 are
        kept, for 30 days after the last one), on the server's clock, in one round trip.

        Raises:
            InvalidLimitError: a field out of its bounds (UTF-8 bytes: who 1..200, action
                a word of 1..64, target 1..500, detail up to 2,000).
        """
        fields = {"who": who, "action": action, "target": target, "detail": detail}
        for name, (low, high) in validate.AUDIT_FIELD_BYTES.items():
            value = fields[name]
            size = len(validate.text(name, value, high).encode("utf-8"))
            if not low <= size <= high:
                raise InvalidLimitError(name, value, f"must be {low}..{high} bytes")
        if not all(c.isascii() and (c.isalnum() or c in "_-") for c in action):
            raise InvalidLimitError("action", action, "must be a word (letters, digits, _ -)")
        if now_ms is not None:
            validate.time_ms("now_ms", now_ms)
        reply = await self.call(
            "audit", "age", self.keys.tag_of(env), [env.id, who, action, target, detail], now_ms
        )
        self.decode("audit", reply[0])
