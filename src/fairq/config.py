"""Configuration: option objects, their validation, and the ``FAIRQ_*`` environment variables."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from fairq.errors import ConfigurationError, InvalidNameError
from fairq.keys import validate_prefix

JoinPolicy = Literal["floor", "behind_leader"]

#: Upper bound for a concurrency-key weight (and 1/bound is the lower bound).
MAX_WEIGHT = 1000.0
#: Largest accepted concurrency or size limit.
MAX_LIMIT = 1_000_000_000
#: Unlimited, as the scripts see it.
UNLIMITED = 1_000_000_000


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigurationError(message)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter for nacked runs.

    The n-th failed attempt (1-based) waits ``min(max_delay_ms, r * min_delay_ms * factor**(n-1))``
    with ``r`` uniform in [1, 2) when ``randomize``; the run is dead-lettered once the
    attempt count reaches ``max_attempts``.
    """

    max_attempts: int = 12
    factor: float = 2.0
    min_delay_ms: int = 1_000
    max_delay_ms: int = 3_600_000
    randomize: bool = True

    def __post_init__(self) -> None:
        _check(
            1 <= self.max_attempts <= 1000,
            f"max_attempts must be in 1..1000, got {self.max_attempts}",
        )
        _check(1.0 <= self.factor <= 100.0, f"factor must be in 1..100, got {self.factor}")
        _check(
            0 <= self.min_delay_ms <= self.max_delay_ms, "need 0 <= min_delay_ms <= max_delay_ms"
        )

    def delay_ms(self, attempt: int, rng: random.Random | None = None) -> int:
        """Backoff before retrying after failed attempt number ``attempt`` (1-based)."""
        r = (rng or random).uniform(1.0, 2.0) if self.randomize else 1.0
        raw = r * self.min_delay_ms * self.factor ** max(0, attempt - 1)
        return round(min(float(self.max_delay_ms), raw))


@dataclass(frozen=True, slots=True)
class VirtualTimeOptions:
    """Fair (start-time fair queueing) order across concurrency-key variants.

    Attributes:
        enabled: off = the age order, with exactly the same scripts and no new keys.
        quantum: virtual time a variant's clock advances per serve (divided by its weight).
        scan_window_multiplier: pass 1 considers ``max_count * this`` servable variants.
        state_ttl_seconds: EXPIRE of the virtual-time keys, refreshed on writes.
        join_policy: where a brand-new variant's clock starts: ``floor`` (SFQ) or
            ``behind_leader`` (one quantum behind the highest tag, capped by ``arrival_cap``).
        arrival_cap: with ``behind_leader``, how far above the floor a newcomer may start.
        idle_max_entries: cap on parked tags kept for drained variants.
    """

    enabled: bool = False
    quantum: float = 1.0
    scan_window_multiplier: int = 3
    state_ttl_seconds: int = 86_400
    join_policy: JoinPolicy = "floor"
    arrival_cap: float = 2.0**32
    idle_max_entries: int = 10_000

    def __post_init__(self) -> None:
        _check(0 < self.quantum <= 1e6, f"quantum must be in (0, 1e6], got {self.quantum}")
        _check(
            1 <= self.scan_window_multiplier <= 100,
            f"scan_window_multiplier must be in 1..100, got {self.scan_window_multiplier}",
        )
        _check(
            1 <= self.state_ttl_seconds <= 365 * 86_400,
            f"state_ttl_seconds must be in 1..31536000, got {self.state_ttl_seconds}",
        )
        _check(
            self.join_policy in ("floor", "behind_leader"),
            f"join_policy must be 'floor' or 'behind_leader', got {self.join_policy!r}",
        )
        _check(self.arrival_cap >= 0, f"arrival_cap must be >= 0, got {self.arrival_cap}")
        _check(1 <= self.idle_max_entries <= 10_000_000, "idle_max_entries must be in 1..1e7")


@dataclass(frozen=True, slots=True)
class RunQueueConfig:
    """Everything a :class:`fairq.store.RunQueue` needs besides its connection.

    Attributes:
        prefix: key prefix; two prefixes on one server never share a key.
        shard_count: master-queue shards (hash tags). On a cluster choose at least
            ``8 x masters`` (and 16) so every node serves shards (see docs/cluster.md).
        default_env_concurrency: env concurrency limit when none is set.
        default_burst_factor: env burst factor when none is set.
        default_queue_size_limit: per-queue size cap when neither queue nor env sets one (0 = none).
        counter_ttl_seconds: TTL of the CK Queued/Running counters (bounds drift).
        lease_ms: how long a dequeued run stays leased without a heartbeat.
        max_per_key_per_call: how many runs one dequeue call may take from one variant.
        max_payload_bytes: largest accepted JSON payload.
        retry: backoff and dead-letter policy.
        vtime: fair-order options.
    """

    prefix: str = "fairq"
    shard_count: int = 4
    default_env_concurrency: int = 100
    default_burst_factor: float = 1.0
    default_queue_size_limit: int = 0
    counter_ttl_seconds: int = 86_400
    lease_ms: int = 30_000
    max_per_key_per_call: int = 1
    max_payload_bytes: int = 1_048_576
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    vtime: VirtualTimeOptions = field(default_factory=VirtualTimeOptions)

    def __post_init__(self) -> None:
        try:
            validate_prefix(self.prefix)
        except InvalidNameError as exc:
            raise ConfigurationError(str(exc)) from None
        _check(
            1 <= self.shard_count <= 16384,
            f"shard_count must be in 1..16384, got {self.shard_count}",
        )
        _check(
            1 <= self.default_env_concurrency <= MAX_LIMIT,
            f"default_env_concurrency must be in 1..{MAX_LIMIT}",
        )
        _check(1.0 <= self.default_burst_factor <= 100.0, "default_burst_factor must be in 1..100")
        _check(
            0 <= self.default_queue_size_limit <= MAX_LIMIT, "default_queue_size_limit out of range"
        )
        _check(1 <= self.counter_ttl_seconds <= 365 * 86_400, "counter_ttl_seconds out of range")
        _check(100 <= self.lease_ms <= 86_400_000, "lease_ms must be in 100..86400000")
        _check(1 <= self.max_per_key_per_call <= 1000, "max_per_key_per_call must be in 1..1000")
        _check(16 <= self.max_payload_bytes <= 512 * 1024 * 1024, "max_payload_bytes out of range")

    def with_vtime(self, **changes: object) -> RunQueueConfig:
        """A copy with some virtual-time options changed."""
        return replace(self, vtime=replace(self.vtime, **changes))  # type: ignore[arg-type]

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: object
    ) -> RunQueueConfig:
        """Read ``FAIRQ_*`` variables (bad values raise :class:`ConfigurationError` naming them)."""
        env = os.environ if environ is None else environ
        vt: dict[str, object] = {}
        top: dict[str, object] = {}
        sources: dict[str, str] = {}

        def read(name: str, conv: type, target: dict[str, object], attr: str) -> None:
            raw = env.get(name)
            if raw is None or raw == "":
                return
            try:
                if conv is bool:
                    low = raw.strip().lower()
                    if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                        raise ValueError(raw)
                    target[attr] = low in ("1", "true", "yes", "on")
                else:
                    target[attr] = conv(raw)
            except ValueError:
                raise ConfigurationError(f"{name}={raw!r} is not a valid {conv.__name__}") from None
            # check the value alone, so the error names the variable that carried it
            try:
                if target is vt:
                    VirtualTimeOptions(**{attr: target[attr]})  # type: ignore[arg-type]
                else:
                    cls(**{attr: target[attr]})  # type: ignore[arg-type]
            except ConfigurationError as exc:
                raise ConfigurationError(f"{name}={raw!r}: {exc}") from None
            sources[attr] = name

        read("FAIRQ_CK_VTIME_ENABLED", bool, vt, "enabled")
        read("FAIRQ_CK_VTIME_QUANTUM", float, vt, "quantum")
        read("FAIRQ_CK_VTIME_WINDOW_MULTIPLIER", int, vt, "scan_window_multiplier")
        read("FAIRQ_CK_VTIME_STATE_TTL_SECONDS", int, vt, "state_ttl_seconds")
        read("FAIRQ_CK_VTIME_JOIN_POLICY", str, vt, "join_policy")
        read("FAIRQ_PREFIX", str, top, "prefix")
        read("FAIRQ_SHARD_COUNT", int, top, "shard_count")
        read("FAIRQ_MAX_PER_KEY_PER_CALL", int, top, "max_per_key_per_call")
        read("FAIRQ_COUNTER_TTL_SECONDS", int, top, "counter_ttl_seconds")
        top.update(overrides)
        top.setdefault("vtime", VirtualTimeOptions(**vt))  # type: ignore[arg-type]
        return cls(**top)  # type: ignore[arg-type]
