"""Typed values the store returns."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from fairq.keys import Environment


class EnqueueStatus(enum.Enum):
    """What happened to one run of an enqueue call."""

    ENQUEUED = "enqueued"
    #: The run id already exists (queued, running or dead-lettered): nothing changed.
    DUPLICATE = "duplicate"
    #: The queue is at its size limit: nothing was written.
    REJECTED = "rejected"


class AckStatus(enum.Enum):
    ACKED = "acked"
    #: The run no longer exists (already acked, or expired).
    UNKNOWN = "unknown"
    #: The lease lapsed and the run was requeued (or delivered again).
    LEASE_LOST = "lease_lost"


class CancelOutcome(enum.Enum):
    """What :meth:`fairq.store.RunQueue.cancel` did."""

    #: The run was queued; it is gone and will never be delivered.
    CANCELLED = "cancelled"
    #: The run was dead-lettered; it is gone from the dead-letter queue.
    REMOVED_FROM_DLQ = "removed_from_dlq"
    #: The run is running; nothing changed (its worker acks or nacks it).
    RUNNING = "running"
    #: No such run (never enqueued, finished, or expired).
    UNKNOWN = "unknown"


class NackOutcome(enum.Enum):
    REQUEUED = "requeued"
    DEAD_LETTERED = "dead_lettered"
    LEASE_LOST = "lease_lost"


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
    priority_ms: int = 0
    ttl_ms: int | None = None


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    run_id: str
    status: EnqueueStatus
    #: The size limit in force when rejected (0 = none).
    queue_size_limit: int = 0


@dataclass(frozen=True, slots=True)
class Delivery:
    """A leased run handed to a consumer. Ack, nack, heartbeat or release it."""

    env: Environment
    queue: str
    run_id: str
    payload_json: str
    concurrency_key: str | None
    attempt: int
    delivery: int
    score_ms: int
    enqueued_at_ms: int

    @property
    def payload(self) -> Any:
        return json.loads(self.payload_json)

    @property
    def lease_member(self) -> str:
        return f"{self.env.id}:{self.run_id}"


@dataclass(frozen=True, slots=True)
class VariantStats:
    """One concurrency-key variant of a queue."""

    concurrency_key: str
    queued: int
    running: int
    oldest_score_ms: int | None
    virtual_tag: float | None = None
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts a dashboard shows for one queue (CK-aware)."""

    env: Environment
    queue: str
    queued: int
    running: int
    concurrency_limit: int | None
    queue_size_limit: int | None
    oldest_score_ms: int | None
    variants: list[VariantStats] = field(default_factory=list)

    @property
    def paused(self) -> bool:
        return self.concurrency_limit == 0


@dataclass(frozen=True, slots=True)
class EnvStats:
    env: Environment
    running: int
    concurrency_limit: int
    burst_factor: float
    queue_size_limit: int | None
    dead_lettered: int


@dataclass(frozen=True, slots=True)
class ExpiredRun:
    env: Environment
    queue: str
    run_id: str
    concurrency_key: str | None
    expired_at_ms: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    env: Environment
    queue: str
    run_id: str
    concurrency_key: str | None
    attempt: int
    dead_lettered_at_ms: int
    payload_json: str
