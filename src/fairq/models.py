"""Typed values the store takes and returns."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from fairq.keys import Environment
from fairq.outcomes import KeptOutcome


class EnqueueStatus(enum.Enum):
    """What happened to one run of an enqueue call."""

    ENQUEUED = "enqueued"
    #: The run id already exists (queued, running or dead-lettered): nothing changed.
    DUPLICATE = "duplicate"
    #: The queue is at its size limit: nothing was written.
    REJECTED = "rejected"


class AckStatus(enum.Enum):
    """What an ack (or a finish) did to one run."""

    ACKED = "acked"
    #: The run no longer exists (already finished, expired or cancelled).
    UNKNOWN = "unknown"
    #: The lease lapsed and the run was requeued (or delivered again): nothing changed.
    LEASE_LOST = "lease_lost"


class NackOutcome(enum.Enum):
    REQUEUED = "requeued"
    DEAD_LETTERED = "dead_lettered"
    #: Its cancellation was asked while it ran: it ended cancelled (no further attempt).
    CANCELLED = "cancelled"
    #: The run no longer exists.
    UNKNOWN = "unknown"
    #: The lease lapsed: nothing changed.
    LEASE_LOST = "lease_lost"


class HeartbeatStatus(enum.Enum):
    """What a heartbeat did to one run's lease."""

    EXTENDED = "extended"
    #: Extended, and someone asked to cancel the run: its worker should stop it.
    CANCEL_REQUESTED = "cancel_requested"
    UNKNOWN = "unknown"
    LEASE_LOST = "lease_lost"

    @property
    def alive(self) -> bool:
        """Whether the caller still holds the lease."""
        return self in (HeartbeatStatus.EXTENDED, HeartbeatStatus.CANCEL_REQUESTED)


class ReleaseStatus(enum.Enum):
    """What a release did to one run's slots."""

    RELEASED = "released"
    #: It held no slot (released before): nothing changed.
    NOT_HELD = "not_held"
    UNKNOWN = "unknown"
    LEASE_LOST = "lease_lost"


class CancelOutcome(enum.Enum):
    """What :meth:`fairq.store.RunQueue.cancel` did."""

    #: The run was queued; it is gone and will never be delivered.
    CANCELLED = "cancelled"
    #: The run was dead-lettered; it is gone from the dead-letter queue.
    REMOVED_FROM_DLQ = "removed_from_dlq"
    #: The run is running: its worker is asked to stop it (it ends ``cancelled``).
    CANCEL_REQUESTED = "cancel_requested"
    #: The run already ended (its outcome is kept).
    ALREADY_FINISHED = "already_finished"
    #: No such run (never enqueued, or its outcome's retention passed).
    UNKNOWN = "unknown"
    #: The run is not in the state the caller asked for (``only_if``): nothing changed.
    NOT_IN_STATE = "not_in_state"

    @property
    def cancelled(self) -> bool:
        """Whether the run will not run (again)."""
        return self in (CancelOutcome.CANCELLED, CancelOutcome.REMOVED_FROM_DLQ)


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """One run to enqueue (see :meth:`fairq.store.RunQueue.enqueue`)."""

    env: Environment
    queue: str
    run_id: str
    payload: Any = None
    concurrency_key: str | None = None
    delay_ms: int = 0
    available_at_ms: int | None = None
    #: A time credit: the run orders as if it were this much older (ms).
    head_start_ms: int = 0
    ttl_ms: int | None = None
    tenant: str | None = None
    #: Keep the outcome of a completed run even when it has no result.
    keep_outcome: bool = False
    #: The run's timeout (ms), for the worker; None = the task's.
    timeout_ms: int | None = None
    #: A trace context (W3C ``traceparent``, optionally ``;tracestate``) the run's
    #: deliveries carry, linking the run to where it was triggered.
    trace_context: str | None = None
    #: Its priority level (1 is the highest; None = the queue's default, its middle level).
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    run_id: str
    status: EnqueueStatus
    #: The size limit in force (0 = none).
    queue_size_limit: int = 0


@dataclass(frozen=True, slots=True)
class Delivery:
    """A leased run handed to a consumer. Finish it (ack / nack), heartbeat or release it.

    Attributes:
        lease_token: which delivery of the run this is (1, 2, …); every lease operation
            must present it, so a consumer whose lease lapsed cannot act on a later one.
        tenant: the tenant named at enqueue whose slots the run holds (None = the run's
            default tenant: its concurrency key, or its queue for keyless runs).
    """

    env: Environment
    queue: str
    run_id: str
    payload_json: str
    concurrency_key: str | None
    attempt: int
    lease_token: int
    score_ms: int
    enqueued_at_ms: int
    tenant: str | None = None
    #: The run's own timeout (ms), set at trigger; None = the task's.
    timeout_ms: int | None = None
    #: Keep the outcome of a completed run even without a result.
    keep_outcome: bool = False
    #: The trace context given at enqueue (None = none).
    trace_context: str | None = None
    #: The environment's partition the run lives in (0 unless it is spread over several).
    partition: int = 0
    #: ``org:project:env:run``: how lease operations name the run (made once).
    lease_member: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lease_member", f"{self.env.id}:{self.run_id}")

    @property
    def payload(self) -> Any:
        return json.loads(self.payload_json)


@dataclass(frozen=True, slots=True)
class DequeueBatch:
    """One dequeue call's leased runs and what to do when it brought none.

    Attributes:
        deliveries: the leased runs.
        wait_ms: how long until something held back becomes ready (a delayed run, a
            backoff, a rate limit's next token); None when nothing is known.
        gated: ready work was left behind a limit (a freed slot wakes consumers).
    """

    deliveries: list[Delivery]
    wait_ms: int | None = None
    gated: bool = False


@dataclass(frozen=True, slots=True)
class Finish:
    """How a run ended, for :meth:`fairq.store.RunQueue.finish`.

    Attributes:
        delivery: the run.
        status: ``completed``, ``failed``, ``cancelled`` or ``timed_out``.
        outcome: keep an outcome, with this result, error and traceback (None = keep
            nothing; the finishing script adds the rest, see fairq.outcomes).
    """

    delivery: Delivery
    status: str = "completed"
    outcome: KeptOutcome | None = None


@dataclass(frozen=True, slots=True)
class VariantStats:
    """One concurrency-key variant of a queue."""

    concurrency_key: str | None
    queued: int
    running: int
    oldest_score_ms: int | None
    virtual_tag: float | None = None
    weight: float = 1.0
    tenant: str | None = None
    cap: int | None = None


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts and settings a dashboard shows for one queue (CK-aware)."""

    env: Environment
    queue: str
    queued: int
    running: int
    concurrency_limit: int | None
    queue_size_limit: int | None
    oldest_score_ms: int | None
    variants: list[VariantStats] = field(default_factory=list)
    is_paused: bool = False
    total_concurrency_limit: int | None = None
    order: str = "age"
    max_per_key_per_call: int | None = None
    charge: str = "count"
    rate: float | None = None
    rate_burst: int | None = None
    borrow: bool = False
    #: Queued runs not yet due (delayed, backoff).
    delayed: int = 0
    #: The fair order's settings in force (the queue's, else the env's, else the default).
    quantum: float = 1.0
    window: int = 3
    join: str = "floor"
    arrival_cap: float = 1.0
    #: The options the queue sets itself, as stored (option name -> value).
    options: dict[str, str] = field(default_factory=dict)
    #: The environment's partitions the counts are summed over.
    partitions: int = 1
    #: Its priority levels (1 is the highest), and those other than the middle one that
    #: have held runs (their counts: :meth:`fairq.store.RunQueue.level_counts`).
    priority_levels: int = 5
    levels_used: tuple[int, ...] = ()

    @property
    def paused(self) -> bool:
        return self.is_paused or self.concurrency_limit == 0


@dataclass(frozen=True, slots=True)
class LevelCount:
    """A queue's runs at one priority level."""

    queued: int
    running: int


@dataclass(frozen=True, slots=True)
class EnvStats:
    env: Environment
    running: int
    concurrency_limit: int
    burst_factor: float
    queue_size_limit: int | None
    dead_lettered: int
    order: str = "age"
    weight: float = 1.0
    #: The environment's defaults for its queues' fair order (else the process's).
    quantum: float = 1.0
    window: int = 3
    join: str = "floor"
    arrival_cap: float = 1.0
    max_per_key_per_call: int | None = None
    charge: str = "count"
    #: The partitions the environment is spread over (its counts are their sums).
    partitions: int = 1


@dataclass(frozen=True, slots=True)
class DeadLetter:
    env: Environment
    queue: str
    run_id: str
    concurrency_key: str | None
    attempt: int
    dead_lettered_at_ms: int
    payload_json: str
    error: str | None = None
    tenant: str | None = None
    #: The last attempt's traceback (bounded), when the worker gave one.
    traceback: str | None = None


@dataclass(frozen=True, slots=True)
class TenantTag:
    """A tenant's place in an environment's fair order."""

    tenant: str | None
    virtual_tag: float
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One admin action recorded on the server (see :meth:`RunQueue.record_audit`)."""

    #: When it was recorded (ms, the server's clock).
    at_ms: int
    who: str
    action: str
    target: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class KeyShare:
    """What one key of a tenant received of a queue over a window, and was entitled to.

    Units as :attr:`TenantShares.unit`: runs, or slot-seconds with ``charge="duration"``.
    """

    #: The concurrency key (None: the tenant's runs without a key).
    key: str | None
    received: float
    entitled: float

    @property
    def ratio(self) -> float | None:
        """received / entitled (None: never seen backlogged, so entitled to nothing)."""
        return self.received / self.entitled if self.entitled > 0 else None


@dataclass(frozen=True, slots=True)
class TenantShare:
    """What one tenant received of a queue over a window, and was entitled to while it was
    backlogged (its weight over the summed weights of the tenants backlogged with it)."""

    #: The tenant (None: the queue's keyless runs of no named tenant; a key of no named
    #: tenant is its own tenant, named as the key).
    tenant: str | None
    received: float
    entitled: float
    #: Its mean entitled share while sampled (0..1; 0 = never seen backlogged).
    share: float
    #: Its keys, most received first.
    by_key: tuple[KeyShare, ...] = ()

    @property
    def ratio(self) -> float | None:
        """received / entitled (None: never seen backlogged, so entitled to nothing)."""
        return self.received / self.entitled if self.entitled > 0 else None


@dataclass(frozen=True, slots=True)
class TenantShares:
    """Shares received vs entitled of one queue's tenants over the last ``window_s``."""

    env: Environment
    queue: str
    window_s: int
    #: The window's end (ms, the server's clock unless a logical clock was given).
    now_ms: int
    #: ``"runs"``, or ``"slot-seconds"`` when the queue charges by run time.
    unit: str
    #: Everything the queue's tenants received in the window.
    received: float
    #: Received in buckets with no backlog sample (none within a minute before): nobody
    #: is entitled to it.
    unsampled: float
    #: Backlog samples taken in the window.
    samples: int
    #: Most received first.
    tenants: tuple[TenantShare, ...] = ()
    #: Received by flows a full bucket counted together (no tenant named).
    other: float = 0.0

    @property
    def entitled(self) -> float:
        return sum(t.entitled for t in self.tenants)
