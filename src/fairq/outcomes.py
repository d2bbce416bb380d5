"""Run outcomes: how a finished run is recorded, and a run's status as fairq reports it.

A run's outcome is a small JSON document kept for the outcome retention
(``RunQueueConfig.outcome_ttl_seconds``) under ``T:r:E:<run>`` (see :mod:`fairq.keys`).
It is written by the script that ends the run, in the same atomic step: ack / finish
(completed, failed, cancelled, timed out), nack (dead-lettered), cancel, and TTL expiry.

Which outcomes are kept:

* a failure, a dead letter, a cancellation, a timeout or an expiry: always;
* a completion: when the task returned a value (not None), or when the run or its task
  asked to keep it (``keep_result``). A completed run without a kept outcome is simply
  gone, which :meth:`fairq.app.RunHandle.wait` reads as "completed, result None" (every
  other ending leaves an outcome). So a no-result task costs no outcome key per run.

Fields: ``status``, ``queue``, ``key`` (encoded concurrency key, "" = none),
``tenant`` (encoded, "" = default), ``attempts``, ``error``, ``traceback``,
``started_at``, ``finished_at`` (ms), ``result`` (the task's return value, JSON).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, Final

from fairq import keys as K

#: Longest error text kept in an outcome.
MAX_ERROR_CHARS = 4_000
#: Longest traceback kept in an outcome.
MAX_TRACEBACK_CHARS = 16_000


class RunStatus(enum.StrEnum):
    """Where a run is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    EXPIRED = "expired"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """Whether the run will not run again by itself (a dead letter can be redriven)."""
        return self not in (RunStatus.QUEUED, RunStatus.RUNNING)


#: Queue-side message states -> run status.
STATE_STATUS = {
    "queued": RunStatus.QUEUED,
    "running": RunStatus.RUNNING,
    "dlq": RunStatus.DEAD_LETTERED,
}

#: How a worker can end a run it was leased (what ``finish`` records in the history).
FINISH_STATUSES: Final = tuple(
    s.value
    for s in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT)
)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run's status and, once it ended, its result or error.

    Attributes:
        run_id: the run.
        status: see :class:`RunStatus`.
        queue: its queue.
        concurrency_key: its concurrency key, if any.
        tenant: the tenant its enqueue named, if any.
        attempts: failed attempts so far.
        result: the task's return value (JSON), for ``completed``.
        error: the last error (``ExcType: message``).
        traceback: the last error's traceback (bounded).
        finished_at_ms: when it ended (ms), for finished runs.
        started_at_ms: when its last attempt started (ms).
        enqueued_at_ms: when it was enqueued (ms), while it is queued or running.
        due_at_ms: when it may run (ms), while it is queued (a delay or a backoff).
        payload_json: its payload, while it is queued, running or dead-lettered.
        cancel_requested: someone asked to cancel it while it runs.
        progress: the last progress a running task reported: (fraction, message).
    """

    run_id: str
    status: RunStatus
    queue: str | None = None
    concurrency_key: str | None = None
    tenant: str | None = None
    attempts: int = 0
    result: Any = None
    error: str | None = None
    traceback: str | None = None
    finished_at_ms: int | None = None
    started_at_ms: int | None = None
    enqueued_at_ms: int | None = None
    due_at_ms: int | None = None
    payload_json: str | None = None
    cancel_requested: bool = False
    progress: tuple[float, str] | None = None

    @property
    def duration_ms(self) -> int | None:
        """Run time of the last attempt, for finished runs that started."""
        if self.started_at_ms is None or self.finished_at_ms is None:
            return None
        return max(0, self.finished_at_ms - self.started_at_ms)


def _truncate(text: str | None, limit: int) -> str | None:
    if text is None:
        return None
    return text if len(text) <= limit else text[: limit - 1] + "…"


def encode_outcome(
    status: RunStatus,
    *,
    queue: str,
    encoded_key: str = "",
    encoded_tenant: str = "",
    attempts: int,
    finished_at_ms: int,
    started_at_ms: int | None = None,
    result_json: str = "null",
    error: str | None = None,
    traceback: str | None = None,
) -> str:
    """The outcome JSON of a finished run (``result_json`` is already JSON)."""
    head = json.dumps(
        {
            "status": status.value,
            "queue": queue,
            "key": encoded_key,
            "tenant": encoded_tenant,
            "attempts": attempts,
            "error": _truncate(error, MAX_ERROR_CHARS),
            "traceback": _truncate(traceback, MAX_TRACEBACK_CHARS),
            "started_at": started_at_ms,
            "finished_at": finished_at_ms,
        },
        separators=(",", ":"),
    )
    return head[:-1] + ',"result":' + result_json + "}"


def decode_outcome(run_id: str, raw: str | bytes) -> RunInfo:
    """A stored outcome back to a :class:`RunInfo`."""
    data = json.loads(raw)
    key = data.get("key") or ""
    tenant = data.get("tenant") or ""
    return RunInfo(
        run_id=run_id,
        status=RunStatus(data["status"]),
        queue=data.get("queue"),
        concurrency_key=K.decode_concurrency_key(key) if key else None,
        tenant=K.decode_tenant(tenant) if tenant else None,
        attempts=int(data.get("attempts") or 0),
        result=data.get("result"),
        error=data.get("error"),
        traceback=data.get("traceback"),
        started_at_ms=_int_or_none(data.get("started_at")),
        finished_at_ms=_int_or_none(data.get("finished_at")),
    )


def _int_or_none(value: object) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return int(value)
    return None
