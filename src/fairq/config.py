"""Configuration: option objects, their validation, and the ``FAIRQ_*`` environment variables."""

from __future__ import annotations

import math
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from fairq.errors import ConfigurationError, InvalidNameError, short
from fairq.keys import validate_prefix

JoinPolicy = Literal["floor", "behind_leader"]
Admission = Literal["floor", "budget"]
ChargeMode = Literal["count", "duration"]
Order = Literal["age", "fair"]

#: Upper bound for a weight (and 1/bound is the lower bound).
MAX_WEIGHT = 1000.0
#: Largest accepted concurrency or size limit.
MAX_LIMIT = 1_000_000_000
#: Largest batch one dequeue call may ask for (the scripts serve this many in one call).
MAX_DEQUEUE_COUNT = 1000
#: Most attempts a retry policy (or a nack) allows a run.
MAX_ATTEMPTS = 1000


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigurationError(message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def as_float(value: int | float) -> float:
    """``float(value)``; an int beyond the float range gives inf (then refused as such)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _is_number(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(as_float(value))
    )


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
            _is_int(self.max_attempts) and 1 <= self.max_attempts <= MAX_ATTEMPTS,
            f"max_attempts must be an integer in 1..{MAX_ATTEMPTS}, got {short(self.max_attempts)}",
        )
        _check(
            _is_number(self.factor) and 1.0 <= self.factor <= 100.0,
            f"factor must be a number in 1..100, got {short(self.factor)}",
        )
        _check(
            _is_int(self.min_delay_ms)
            and _is_int(self.max_delay_ms)
            and 0 <= self.min_delay_ms <= self.max_delay_ms <= 365 * 86_400_000,
            "need integers 0 <= min_delay_ms <= max_delay_ms <= one year",
        )
        _check(isinstance(self.randomize, bool), "randomize must be True or False")

    def delay_ms(self, attempt: int, rng: random.Random | None = None) -> int:
        """Backoff before retrying after failed attempt number ``attempt`` (1-based)."""
        r = (rng or random).uniform(1.0, 2.0) if self.randomize else 1.0
        raw = r * self.min_delay_ms * self.factor ** max(0, attempt - 1)
        return round(min(float(self.max_delay_ms), raw))


@dataclass(frozen=True, slots=True)
class VirtualTimeOptions:
    """The fair order (start-time fair queueing over tenants, then their keys), as the
    *process default* for queues and environments that have no order set on the server.

    Attributes:
        enabled: the default order: fair when True, else the age order (which runs
            exactly the age-order scripts and creates no fair-order keys).
        quantum: virtual time a tenant's (and a key's) clock advances per run served,
            divided by its weight.
        scan_window_multiplier: a call considers ``max_count * this`` tenants per queue.
        state_ttl_seconds: EXPIRE of the fair-order keys, refreshed on writes.
        join_policy: where a key that is new to its tenant starts: ``floor`` (SFQ: the
            tenant's virtual time) or ``behind_leader`` (one quantum behind its tenant's
            highest key, at most ``arrival_cap`` above the floor). Tenants always join
            at the environment's virtual time.
        arrival_cap: with ``behind_leader``, how far above the floor a newcomer may start
            (finite: a newcomer waits at most this many quanta of extra service).
        admission: where a tenant new to the fair order (no tag yet) starts: ``budget``
            (the first new tenant of each quantum of virtual time starts at the floor, the
            others share one newcomers' clock, so a flood of fresh tenants takes about one
            tenant's share) or ``floor`` (plain SFQ: every new tenant at the floor).
        charge: ``count`` charges one quantum per run; ``duration`` charges its run time
            (``charge_unit_ms`` = one quantum), corrected when the run ends.
        charge_unit_ms: the run time charged as one quantum with ``charge = "duration"``.
    """

    enabled: bool = False
    quantum: float = 1.0
    scan_window_multiplier: int = 3
    state_ttl_seconds: int = 86_400
    join_policy: JoinPolicy = "floor"
    arrival_cap: float = 1.0
    admission: Admission = "budget"
    charge: ChargeMode = "count"
    charge_unit_ms: int = 1_000

    def __post_init__(self) -> None:
        _check(
            isinstance(self.enabled, bool),
            f"enabled must be True or False, got {short(self.enabled)}",
        )
        _check(
            _is_number(self.quantum) and 0 < self.quantum <= 1e6,
            f"quantum must be a number in (0, 1e6], got {short(self.quantum)}",
        )
        _check(
            _is_int(self.scan_window_multiplier) and 1 <= self.scan_window_multiplier <= 100,
            f"scan_window_multiplier must be an integer in 1..100, got "
            f"{short(self.scan_window_multiplier)}",
        )
        _check(
            _is_int(self.state_ttl_seconds) and 1 <= self.state_ttl_seconds <= 365 * 86_400,
            "state_ttl_seconds must be an integer in 1..31536000, got "
            f"{short(self.state_ttl_seconds)}",
        )
        _check(
            self.join_policy in ("floor", "behind_leader"),
            f"join_policy must be 'floor' or 'behind_leader', got {short(self.join_policy)}",
        )
        _check(
            self.admission in ("floor", "budget"),
            f"admission must be 'floor' or 'budget', got {short(self.admission)}",
        )
        _check(
            _is_number(self.arrival_cap) and 0 <= self.arrival_cap <= 1e10,
            f"arrival_cap must be a number in 0..1e10, got {short(self.arrival_cap)}",
        )
        _check(
            self.charge in ("count", "duration"),
            f"charge must be 'count' or 'duration', got {short(self.charge)}",
        )
        _check(
            _is_int(self.charge_unit_ms) and 1 <= self.charge_unit_ms <= 86_400_000,
            f"charge_unit_ms must be an integer in 1..86400000, got {short(self.charge_unit_ms)}",
        )


@dataclass(frozen=True, slots=True)
class RunQueueConfig:
    """Everything a :class:`fairq.store.RunQueue` needs besides its connection.

    Scheduling options set on the server (``fairq limits``, the task decorator, the
    store's setters) win over these; these are the defaults for queues and environments
    that have none.

    Attributes:
        prefix: key prefix; two prefixes on one server never share a key.
        shard_count: hash-tag shards. Every process sharing a prefix must use the same
            value (the first process records it on the server; a different one is refused).
            On a cluster choose at least ``8 x masters`` (and 16): see docs/cluster.md.
        default_env_concurrency: env concurrency limit when none is set.
        default_burst_factor: env burst factor when none is set.
        default_queue_size_limit: per-queue size cap when neither queue nor env sets one (0 = none).
        counter_ttl_seconds: TTL of the lazy Queued/Running counters (bounds drift).
        lease_ms: how long a dequeued run stays leased without a heartbeat (server clock).
        max_per_key_per_call: how many runs one dequeue call may take from one key; None =
            the order's default (age order: 1; fair order: the whole call, since the fair
            order itself interleaves keys).
        max_payload_bytes: largest accepted JSON payload.
        outcome_ttl_seconds: how long finished runs' outcomes are kept.
        recent_runs: finished runs listed per queue (the newest; 0 = none kept).
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
    max_per_key_per_call: int | None = None
    max_payload_bytes: int = 1_048_576
    outcome_ttl_seconds: int = 86_400
    recent_runs: int = 1_000
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    vtime: VirtualTimeOptions = field(default_factory=VirtualTimeOptions)

    def __post_init__(self) -> None:
        try:
            validate_prefix(self.prefix)
        except InvalidNameError as exc:
            raise ConfigurationError(str(exc)) from None
        _check(
            _is_int(self.shard_count) and 1 <= self.shard_count <= 16384,
            f"shard_count must be an integer in 1..16384, got {short(self.shard_count)}",
        )
        _check(
            _is_int(self.default_env_concurrency)
            and 1 <= self.default_env_concurrency <= MAX_LIMIT,
            f"default_env_concurrency must be an integer in 1..{MAX_LIMIT}",
        )
        _check(
            _is_number(self.default_burst_factor) and 1.0 <= self.default_burst_factor <= 100.0,
            "default_burst_factor must be a number in 1..100",
        )
        _check(
            _is_int(self.default_queue_size_limit)
            and 0 <= self.default_queue_size_limit <= MAX_LIMIT,
            "default_queue_size_limit must be an integer in 0..1e9",
        )
        _check(
            _is_int(self.counter_ttl_seconds) and 1 <= self.counter_ttl_seconds <= 365 * 86_400,
            "counter_ttl_seconds must be an integer in 1..31536000",
        )
        _check(
            _is_int(self.lease_ms) and 100 <= self.lease_ms <= 86_400_000,
            "lease_ms must be an integer in 100..86400000",
        )
        _check(
            self.max_per_key_per_call is None
            or (_is_int(self.max_per_key_per_call) and 1 <= self.max_per_key_per_call <= 1000),
            "max_per_key_per_call must be None or an integer in 1..1000",
        )
        _check(
            _is_int(self.max_payload_bytes) and 16 <= self.max_payload_bytes <= 512 * 1024 * 1024,
            "max_payload_bytes must be an integer in 16..536870912",
        )
        _check(
            _is_int(self.outcome_ttl_seconds) and 1 <= self.outcome_ttl_seconds <= 365 * 86_400,
            "outcome_ttl_seconds must be an integer in 1..31536000",
        )
        _check(
            _is_int(self.recent_runs) and 0 <= self.recent_runs <= 100_000,
            "recent_runs must be an integer in 0..100000",
        )
        _check(isinstance(self.retry, RetryPolicy), "retry must be a RetryPolicy")
        _check(isinstance(self.vtime, VirtualTimeOptions), "vtime must be VirtualTimeOptions")

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
                raise ConfigurationError(
                    f"{name}={short(raw)} is not a valid {conv.__name__}"
                ) from None
            # check the value alone, so the error names the variable that carried it
            try:
                if target is vt:
                    VirtualTimeOptions(**{attr: target[attr]})  # type: ignore[arg-type]
                else:
                    cls(**{attr: target[attr]})  # type: ignore[arg-type]
            except ConfigurationError as exc:
                raise ConfigurationError(f"{name}={short(raw)}: {exc}") from None
            sources[attr] = name

        read("FAIRQ_CK_VTIME_ENABLED", bool, vt, "enabled")
        read("FAIRQ_CK_VTIME_QUANTUM", float, vt, "quantum")
        read("FAIRQ_CK_VTIME_WINDOW_MULTIPLIER", int, vt, "scan_window_multiplier")
        read("FAIRQ_CK_VTIME_STATE_TTL_SECONDS", int, vt, "state_ttl_seconds")
        read("FAIRQ_CK_VTIME_JOIN_POLICY", str, vt, "join_policy")
        read("FAIRQ_CK_VTIME_ARRIVAL_CAP", float, vt, "arrival_cap")
        read("FAIRQ_CK_VTIME_ADMISSION", str, vt, "admission")
        read("FAIRQ_CK_VTIME_CHARGE", str, vt, "charge")
        read("FAIRQ_PREFIX", str, top, "prefix")
        read("FAIRQ_SHARD_COUNT", int, top, "shard_count")
        read("FAIRQ_MAX_PER_KEY_PER_CALL", int, top, "max_per_key_per_call")
        read("FAIRQ_COUNTER_TTL_SECONDS", int, top, "counter_ttl_seconds")
        read("FAIRQ_LEASE_MS", int, top, "lease_ms")
        read("FAIRQ_OUTCOME_TTL_SECONDS", int, top, "outcome_ttl_seconds")
        top.update(overrides)
        top.setdefault("vtime", VirtualTimeOptions(**vt))  # type: ignore[arg-type]
        return cls(**top)  # type: ignore[arg-type]
