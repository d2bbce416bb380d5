"""Run outcomes: how a finished run is recorded, and a run's status as fairq reports it.

A run's outcome is a small JSON document kept for the outcome retention
(``RunQueueConfig.outcome_ttl_seconds``) under ``T:r:E:<run>`` (see :mod:`fairq.keys`).
It is written by the script that ends the run, in the same atomic step: ack / finish
(completed, failed, cancelled, timed out), nack (dead-lettered, or cancelled), cancel,
and TTL expiry. It has one writer, ``outcome_json`` in ``include/runs.lua``, whose
fields are :data:`OUTCOME_FIELDS` (generated into the scripts, :func:`lua_outcome`). The
scripts fill it from what the server knows of the run (its queue, key, tenant and
attempts, when its lease started, the script's clock) and from a :class:`KeptOutcome`:
what only the worker knows (the result, the error and its traceback). Python only reads
it (:func:`decode_outcome`).

Which outcomes are kept:

* a failure, a dead letter, a cancellation, a timeout or an expiry: always;
* a completion: when the task returned a value (not None), or when the run or its task
  asked to keep it (``keep_result``). A completed run without a kept outcome is simply
  gone, which :meth:`fairq.app.RunHandle.wait` reads as "completed, result None" (every
  other ending leaves an outcome). So a no-result task costs no outcome key per run.

Fields (:data:`OUTCOME_FIELDS`): ``status``, ``queue``, ``key`` (encoded concurrency
key, "" = none), ``tenant`` (encoded, "" = default), ``attempts``, ``error``,
``traceback``, ``started_at``, ``finished_at`` (ms, the server's clock), ``result`` (the
task's return value, JSON). A field an ending has nothing for is absent (read as None).
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


#: The fields of an outcome document. ``result`` is JSON text spliced in as it is.
OUTCOME_FIELDS: Final = (
    "status", "queue", "key", "tenant", "attempts", "error", "traceback", "started_at",
    "finished_at", "result",
)  # fmt: skip


def _truncate(text: str | None, limit: int) -> str | None:
    if text is None:
        return None
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class KeptOutcome:
    """What only the worker knows of how a run ended, for the outcome the finishing
    script records (it adds the rest: see the module docstring).

    Attributes:
        result_json: the task's return value as JSON ("null" for none).
        error: the error (``ExcType: message``), cut to :data:`MAX_ERROR_CHARS`.
        traceback: its traceback, cut to :data:`MAX_TRACEBACK_CHARS`.
    """

    result_json: str = "null"
    error: str | None = None
    traceback: str | None = None

    def packed(self) -> str:
        """As the finishing scripts take it in one argument: the UTF-8 length of the
        error and of the traceback ('-' for none), each followed by a space, then the
        error, the traceback and the result (read by the generated ``kept_outcome``)."""
        texts = [
            _truncate(self.error, MAX_ERROR_CHARS),
            _truncate(self.traceback, MAX_TRACEBACK_CHARS),
        ]
        head = "".join("- " if t is None else f"{len(t.encode('utf-8'))} " for t in texts)
        return head + "".join(t or "" for t in texts) + self.result_json


def lua_outcome() -> str:
    """The Lua list of an outcome's fields (generated into every library; the writer,
    ``outcome_json`` in ``include/runs.lua``, fills them by name)."""
    names = ", ".join(f"'{name}'" for name in OUTCOME_FIELDS)
    return "\n".join(
        [
            "-- generated from fairq/outcomes.py: the fields of an outcome document",
            f"local OUTCOME_FIELDS = {{ {names} }}",
        ]
    )


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
