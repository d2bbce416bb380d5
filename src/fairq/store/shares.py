"""Shares received vs entitled: what each tenant of a queue got, and what it was owed.

Two writers fill a queue's shares record (:mod:`fairq.store.share_record`): every
finish (ack, nack, reclaim) notes the runs and run time a flow received, in the
10-second bucket of the run's lease start; and :meth:`SharesOps.sample_shares`, run by
maintenance about once a second, notes who is backlogged (has runs ready) and each
backlogged flow's entitled share at that moment. The reader turns them into, per
tenant and key, what it received over a window and what it was entitled to:

    entitled(flow) = sum over buckets b of received(b) x mean share(flow, b)

where received(b) is everything the queue's flows received in b (runs, or slot-seconds
with ``charge="duration"``) and the mean share is the flow's share averaged over b's
samples (0 in the samples where it was not backlogged, so a tenant backlogged part of
the bucket gets that part). A bucket without a sample takes the last one up to
:data:`~fairq.store.share_record.SHARES_HOLD_BUCKETS` buckets before it; received in a
bucket with neither is ``unsampled`` (nobody is entitled to it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from fairq import keys as K
from fairq.errors import InvalidLimitError
from fairq.keys import Environment, QueueKeys, ShardKeys
from fairq.models import KeyShare, TenantShare, TenantShares
from fairq.store import validate
from fairq.store._core import StoreCore, text_of
from fairq.store.share_record import (
    MAX_SAMPLE_FLOWS,
    MAX_SAMPLE_QUEUES,
    OVERFLOW_FLOW,
    RUN_MS_PREFIX,
    RUNS_PREFIX,
    SAMPLE_FLOWS,
    SAMPLE_QUEUES,
    SAMPLES_FIELD,
    SHARE_PREFIX,
    SHARES_BUCKET_MS,
    SHARES_HOLD_BUCKETS,
    SHARES_WINDOW_MS,
    SHARES_WINDOWS_S,
)

#: The unit of what a queue's tenants receive, by its charge setting.
UNITS: Final = {"count": "runs", "duration": "slot-seconds"}


@dataclass(slots=True)
class ShareBucket:
    """One bucket of a queue's shares record, parsed."""

    samples: int = 0
    #: flow -> its entitled share summed over the bucket's samples
    shares: dict[str, float] = field(default_factory=dict)
    #: flow -> runs received, and their run time (ms)
    runs: dict[str, float] = field(default_factory=dict)
    run_ms: dict[str, float] = field(default_factory=dict)


def parse_bucket(raw: dict[Any, Any]) -> ShareBucket:
    """A bucket's hash (field -> number) as a :class:`ShareBucket`."""
    out = ShareBucket()
    into = {SHARE_PREFIX: out.shares, RUNS_PREFIX: out.runs, RUN_MS_PREFIX: out.run_ms}
    for name, value in raw.items():
        text, number = text_of(name), float(text_of(value))
        if text == SAMPLES_FIELD:
            out.samples = int(number)
        elif text[:2] in into:
            into[text[:2]][text[2:]] = number
    return out


def mean_shares(buckets: list[ShareBucket]) -> list[dict[str, float] | None]:
    """Per bucket, each flow's mean share over its samples; a bucket without samples
    holds the last one of up to SHARES_HOLD_BUCKETS buckets before it (else None)."""
    out: list[dict[str, float] | None] = []
    held: dict[str, float] | None = None
    age = 0
    for b in buckets:
        if b.samples > 0:
            held, age = {f: s / b.samples for f, s in b.shares.items()}, 0
        else:
            age += 1
            if age > SHARES_HOLD_BUCKETS:
                held = None
        out.append(held)
    return out


@dataclass(slots=True)
class FlowTotals:
    """Per flow, what it received and was entitled to over a window (one unit)."""

    received: dict[str, float] = field(default_factory=dict)
    entitled: dict[str, float] = field(default_factory=dict)
    #: flow -> its share summed over the window's buckets that had one
    share: dict[str, float] = field(default_factory=dict)
    #: buckets of the window that had a share (sampled or held)
    shared_buckets: int = 0
    unsampled: float = 0.0
    samples: int = 0

    def add(self, other: FlowTotals) -> None:
        for mine, theirs in ((self.received, other.received), (self.entitled, other.entitled),
                             (self.share, other.share)):  # fmt: skip
            for flow, n in theirs.items():
                mine[flow] = mine.get(flow, 0.0) + n
        self.shared_buckets = max(self.shared_buckets, other.shared_buckets)
        self.unsampled += other.unsampled
        self.samples += other.samples


def flow_totals(buckets: list[ShareBucket], lookback: int, *, duration: bool) -> FlowTotals:
    """Received and entitled per flow over ``buckets[lookback:]`` (the ones before only
    lend their samples to the buckets that have none).

    Args:
        buckets: consecutive buckets, oldest first.
        lookback: how many leading buckets lie before the window.
        duration: count run time (slot-seconds) instead of runs.
    """
    out = FlowTotals()
    shares = mean_shares(buckets)
    for b, share in zip(buckets[lookback:], shares[lookback:], strict=True):
        got = {f: ms / 1000 for f, ms in b.run_ms.items()} if duration else b.runs
        total = sum(got.values())
        for flow, n in got.items():
            out.received[flow] = out.received.get(flow, 0.0) + n
        out.samples += b.samples
        if share is None:
            out.unsampled += total
            continue
        out.shared_buckets += 1
        for flow, s in share.items():
            out.entitled[flow] = out.entitled.get(flow, 0.0) + total * s
            out.share[flow] = out.share.get(flow, 0.0) + s
    return out


def _owner(flow: str) -> tuple[str | None, str | None]:
    """A flow's tenant and key as the user named them (None: none)."""
    tenant, key = K.split_flow(flow)
    if tenant is None:  # a key serving as its own tenant, or the keyless runs
        name = K.decode_concurrency_key(key) if key else None
        return name, name
    return K.decode_concurrency_key(tenant), K.decode_concurrency_key(key) if key else None


def tenant_rows(totals: FlowTotals) -> tuple[list[TenantShare], float]:
    """Flows grouped by tenant, most received first; and what the overflow flow got."""
    flows = set(totals.received) | set(totals.entitled)
    flows.discard(OVERFLOW_FLOW)
    by_tenant: dict[str | None, list[KeyShare]] = {}
    share: dict[str | None, float] = {}
    for flow in flows:
        tenant, key = _owner(flow)
        by_tenant.setdefault(tenant, []).append(
            KeyShare(key, totals.received.get(flow, 0.0), totals.entitled.get(flow, 0.0))
        )
        share[tenant] = share.get(tenant, 0.0) + totals.share.get(flow, 0.0)
    rows = []
    for tenant, keys in by_tenant.items():
        keys.sort(key=lambda k: (-k.received, -k.entitled, k.key or ""))
        rows.append(
            TenantShare(
                tenant=tenant,
                received=sum(k.received for k in keys),
                entitled=sum(k.entitled for k in keys),
                share=share[tenant] / totals.shared_buckets if totals.shared_buckets else 0.0,
                by_key=tuple(keys),
            )
        )
    rows.sort(key=lambda t: (-t.received, -t.entitled, t.tenant or ""))
    return rows, totals.received.get(OVERFLOW_FLOW, 0.0)


class SharesOps(StoreCore):
    if TYPE_CHECKING:

        def _shard_keys(self, shards: Iterable[int] | None) -> list[ShardKeys]: ...

        async def per_queue_partition(
            self, env: Environment, queue: str, command: Any
        ) -> list[Any]: ...

    async def sample_shares(
        self,
        *,
        now_ms: int | None = None,
        shards: Iterable[int] | None = None,
        queues: int = SAMPLE_QUEUES,
        flows: int = SAMPLE_FLOWS,
    ) -> int:
        """Take one backlog sample of every queue with ready work, on every shard (or
        ``shards``), on the server's clock (or ``now_ms``); returns the queues sampled.
        Maintenance calls it about once a second; see :meth:`tenant_shares`.

        Args:
            queues: most ready queues sampled per shard (oldest heads first).
            flows: most ready flows read per queue (oldest heads first).
        """
        validate.integer("queues", queues, 1, MAX_SAMPLE_QUEUES)
        validate.integer("flows", flows, 1, MAX_SAMPLE_FLOWS)
        if now_ms is not None:
            validate.time_ms("now_ms", now_ms)
        total = 0
        for s in self._shard_keys(shards):
            reply = await self.call(
                "sample_shares", "age", s.tag, [str(queues), str(flows)], now_ms
            )
            self.decode("sample_shares", reply[0])
            total += int(reply[1])
        return total

    async def tenant_shares(
        self, env: Environment, queue: str, *, window: int = 300, now_ms: int | None = None
    ) -> TenantShares:
        """What each tenant (and key) of a queue received over the last ``window``
        seconds, and what it was entitled to while backlogged (module docstring).

        Args:
            window: seconds, 10..3600 (a multiple of 10: whole 10-second buckets).
            now_ms: the window's end (a logical clock); default the server's clock.

        Raises:
            InvalidLimitError: a window out of range or not a multiple of 10 s.
        """
        (shares,) = await self.tenant_shares_windows(env, queue, windows=(window,), now_ms=now_ms)
        return shares

    async def tenant_shares_windows(
        self,
        env: Environment,
        queue: str,
        *,
        windows: Sequence[int] = SHARES_WINDOWS_S,
        now_ms: int | None = None,
    ) -> list[TenantShares]:
        """:meth:`tenant_shares` for several windows ending at the same moment, from one
        read (one round trip per partition, at once)."""
        for window in windows:
            validate.integer("window", window, 10, SHARES_WINDOW_MS // 1000)
            if window * 1000 % SHARES_BUCKET_MS:
                raise InvalidLimitError("window", window, "must be a multiple of 10 (seconds)")
        if not windows:
            raise InvalidLimitError("windows", windows, "name at least one window")
        K.validate_name("queue", queue, allow_slash=True)
        if now_ms is None:
            now_ms = await self.server_time_ms()
        else:
            validate.time_ms("now_ms", now_ms)
        last = now_ms // SHARES_BUCKET_MS
        span = max(windows) * 1000 // SHARES_BUCKET_MS + SHARES_HOLD_BUCKETS
        buckets = range(last - span + 1, last + 1)
        config = self.keys.env(env).config
        charge_fields = [K.config_field(queue, "charge"), "charge"]

        def build(pipe: Any, q: QueueKeys) -> None:
            pipe.hmget(config, charge_fields)
            for bucket in buckets:
                pipe.hgetall(q.shares(bucket))

        rows = await self.per_queue_partition(env, queue, build)
        width = len(buckets) + 1
        charge_raw = next((text_of(c) for c in rows[0] if c is not None), None)
        charge = charge_raw or self.config.vtime.charge
        parts = [
            [parse_bucket(raw) for raw in rows[p * width + 1 : (p + 1) * width]]
            for p in range(len(rows) // width)
        ]
        out = []
        for window in windows:
            lead = span - window * 1000 // SHARES_BUCKET_MS  # buckets before the window
            totals = FlowTotals()
            for part in parts:
                totals.add(flow_totals(part, lead, duration=charge == "duration"))
            tenants, other = tenant_rows(totals)
            out.append(
                TenantShares(
                    env=env,
                    queue=queue,
                    window_s=window,
                    now_ms=now_ms,
                    unit=UNITS.get(charge, "runs"),
                    received=sum(totals.received.values()),
                    unsampled=totals.unsampled,
                    samples=totals.samples,
                    tenants=tuple(tenants),
                    other=other,
                )
            )
        return out
