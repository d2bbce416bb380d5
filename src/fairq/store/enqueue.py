"""Enqueueing: one script call per base queue, validated before anything is written."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Final

from fairq import keys as K
from fairq.errors import (
    InvalidLimitError,
    InvalidNameError,
    QueueSizeLimitExceededError,
    ScriptProtocolError,
)
from fairq.keys import Environment
from fairq.models import EnqueueRequest, EnqueueResult, EnqueueStatus
from fairq.store import validate
from fairq.store._core import StoreCore
from fairq.store.run_hash import KEEP_OUTCOME
from fairq.store.status import ReplyMemo, Status, decode

#: Script calls one enqueue_many keeps in flight at once (bounds connections used).
MAX_CONCURRENT_CALLS: Final = 8
#: Runs per enqueue script call (larger groups are split).
MAX_RUNS_PER_CALL: Final = 1000

_STATUS: Final = {
    Status.ENQUEUED: EnqueueStatus.ENQUEUED,
    Status.DUPLICATE: EnqueueStatus.DUPLICATE,
    Status.REJECTED_SIZE: EnqueueStatus.REJECTED,
}


#: Where an encoded run's payload is (the last of its fields: the only one that may hold
#: a space).
PAYLOAD_FIELD: Final = 11


def run_argument(f: list[str]) -> str:
    """One run's script argument from its encoded fields: run id, key, tenant, the options
    (one field, separated by commas, the trace context last), payload; separated by
    single spaces."""
    return f"{f[0]} {f[1]} {f[2]} {f[3]},{f[4]},{f[5]},{f[6]},{f[7]},{f[8]},{f[9]},{f[10]} {f[11]}"


def enqueue_args(env: Environment, queue: str, encoded: Sequence[list[str]]) -> list[str]:
    """The arguments of one enqueue script call of already encoded runs (no schedule)."""
    return [env.id, queue, "", "0", *map(run_argument, encoded)]


def enqueue_reply(reply: Any) -> list[bytes]:
    """An enqueue script's reply, one text (its status, the size limit in force, then each
    run's status: a text costs the server less than a list), split into its words.

    Raises:
        ScriptProtocolError: the reply is not a text.
    """
    if isinstance(reply, str):
        reply = reply.encode()
    if not isinstance(reply, bytes):
        raise ScriptProtocolError("enqueue", reply)
    return reply.split(b" ")


def enqueue_results(requests: Sequence[EnqueueRequest], reply: Any) -> list[EnqueueResult]:
    """Each run's result from an enqueue script's reply."""
    limit, statuses = _PARSED_REPLIES(reply) if isinstance(reply, bytes) else _parsed_reply(reply)
    if len(requests) == 1 and len(statuses) == 1:  # (one run: no zip)
        return [EnqueueResult(requests[0].run_id, statuses[0], limit)]
    return [
        EnqueueResult(request.run_id, status, limit)
        for request, status in zip(requests, statuses, strict=True)
    ]


def _parsed_reply(reply: Any) -> tuple[int, tuple[EnqueueStatus, ...]]:
    """The size limit and the runs' statuses of an enqueue reply, checked."""
    words = enqueue_reply(reply)
    decode("enqueue", words[0])
    return int(words[1]), tuple(_STATUS[decode("enqueue", code)] for code in words[2:])


#: The parsed short replies (one or a few runs), looked up by their bytes.
_PARSED_REPLIES: Final = ReplyMemo(_parsed_reply)


_Pending = list[tuple[EnqueueRequest, list[str], "asyncio.Future[EnqueueResult]"]]
#: (event loop, env, partition, queue, logical clock): what one enqueue script call can
#: carry.
_BatchKey = tuple[int, Environment, int, str, int | None]


def encode_request(r: EnqueueRequest, max_payload_bytes: int) -> list[str]:
    """The 12 encoded fields of one run, validating every field (the payload up to
    ``max_payload_bytes``): what an enqueue, a schedule's tick and the blocking facade
    send, and how :meth:`fairq.Fairq.schedule` checks a schedule's runs up front.

    Raises:
        InvalidNameError, PayloadError, InvalidLimitError: bad input.
    """
    if not isinstance(r, EnqueueRequest):
        raise InvalidLimitError("request", r, "must be an EnqueueRequest")
    if not isinstance(r.env, Environment):
        raise InvalidNameError("environment", r.env, "must be an Environment")
    K.validate_name("queue", r.queue, allow_slash=True)
    K.validate_name("run id", r.run_id)
    encoded_ck = "" if r.concurrency_key is None else K.encode_concurrency_key(r.concurrency_key)
    encoded_tenant = "" if r.tenant is None else K.encode_tenant(r.tenant)
    delay = validate.duration_ms("delay_ms", r.delay_ms)
    head_start = validate.duration_ms("head_start_ms", r.head_start_ms)
    level = "" if r.priority is None else str(validate.priority(r.priority))
    available = (
        ""
        if r.available_at_ms is None
        else str(validate.time_ms("available_at_ms", r.available_at_ms))
    )
    ttl = 0 if r.ttl_ms is None else validate.duration_ms("ttl_ms", r.ttl_ms, minimum=1)
    if not isinstance(r.keep_outcome, bool):
        raise InvalidLimitError("keep_outcome", r.keep_outcome, "must be True or False")
    timeout = (
        0 if r.timeout_ms is None else validate.duration_ms("timeout_ms", r.timeout_ms, minimum=1)
    )
    payload = validate.payload(r.payload, max_payload_bytes)
    trace = "" if r.trace_context is None else validate.trace_context(r.trace_context)
    return [
        r.run_id, encoded_ck, encoded_tenant, available, str(delay), str(head_start),
        str(ttl), KEEP_OUTCOME if r.keep_outcome else "", str(timeout), level, trace, payload,
    ]  # fmt: skip


class EnqueueOps(StoreCore):
    #: Single-run enqueues waiting for the call in flight for their queue.
    _batches: dict[_BatchKey, _Pending]
    #: Queues with an enqueue_one call in flight.
    _sending: set[_BatchKey]
    #: Tasks sending the calls that waited.
    _drainers: set[asyncio.Task[None]]

    async def enqueue_one(
        self, request: EnqueueRequest, *, now_ms: int | None = None
    ) -> EnqueueResult:
        """Queue one run in one round trip.

        Group commit per queue: a call finding no other call of its queue in flight is
        sent at once (a sequential producer pays no batching delay); calls made while one
        is in flight wait for it and then go together in one script call (each caller
        still gets its own result, and a size-limit rejection only for its own run).

        Raises:
            InvalidNameError, PayloadError, InvalidLimitError: bad input (nothing written).
        """
        encoded = self.encode_request(request)
        if now_ms is not None:
            validate.time_ms("now_ms", now_ms)
        partition = await self.partition_of(request.env, encoded)
        loop = asyncio.get_running_loop()
        key = (id(loop), request.env, partition, request.queue, now_ms)
        future: asyncio.Future[EnqueueResult] = loop.create_future()
        if key in self._sending:
            self._batches.setdefault(key, []).append((request, encoded, future))
            return await future
        self._sending.add(key)
        try:
            await self._deliver_batch(key, [(request, encoded, future)])
        finally:
            self._send_waiting(key)
            if future.done() and not future.cancelled():
                future.exception()  # retrieved here, raised below (or the call was cancelled)
        return future.result()

    def _send_waiting(self, key: _BatchKey) -> None:
        """The call in flight for ``key`` returned: send what waited for it (in a task of
        its own, which keeps sending while more arrive), or mark the queue idle."""
        if self._batches.get(key):
            task = asyncio.get_running_loop().create_task(self._drain_waiting(key))
            self._drainers.add(task)  # referenced until done (the loop keeps tasks weakly)
            task.add_done_callback(self._drainers.discard)
        else:
            self._sending.discard(key)

    async def _drain_waiting(self, key: _BatchKey) -> None:
        try:
            while batch := self._batches.pop(key, None):
                await self._deliver_batch(key, batch)
        finally:
            self._sending.discard(key)
            for _, _, waiting in self._batches.pop(key, []):  # only if this task was cancelled
                waiting.cancel()

    async def _deliver_batch(self, key: _BatchKey, batch: _Pending) -> None:
        _, env, partition, queue, now_ms = key
        try:
            for start in range(0, len(batch), MAX_RUNS_PER_CALL):
                part = batch[start : start + MAX_RUNS_PER_CALL]
                args = enqueue_args(env, queue, [encoded for _, encoded, _ in part])
                reply = await self.call_for_env("enqueue", env, args, now_ms, partition)
                results = enqueue_results([request for request, _, _ in part], reply)
                for (_, _, future), result in zip(part, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        except BaseException as exc:
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    async def enqueue(
        self,
        env: Environment,
        queue: str,
        run_id: str,
        payload: Any = None,
        *,
        concurrency_key: str | None = None,
        tenant: str | None = None,
        delay_ms: int = 0,
        available_at_ms: int | None = None,
        head_start_ms: int = 0,
        ttl_ms: int | None = None,
        keep_outcome: bool = False,
        priority: int | None = None,
        now_ms: int | None = None,
    ) -> EnqueueStatus:
        """Queue one run.

        Args:
            env: its environment.
            queue: its queue (letters, digits, ``_ . - /``).
            run_id: unique per environment; enqueueing an existing id is a no-op.
            payload: any JSON-serialisable value.
            concurrency_key: the CK variant (user, account…) the run belongs to.
            tenant: the fairness group it belongs to (default: its concurrency key, or
                for keyless runs its queue).
            delay_ms: make it available this long after now (the server's clock).
            available_at_ms: or at this absolute time (overrides ``delay_ms``).
            head_start_ms: a time credit: the run orders as if it were this much older.
            ttl_ms: expire it (never deliver it) if not dequeued within this time.
            keep_outcome: keep the outcome of a completed run even without a result.
            priority: its priority level, 1 (the highest) to the queue's
                ``priority_levels`` (default 5); None = the middle level (3 of 5).
            now_ms: a logical clock (tests, the simulator); default: the server's.

        Returns:
            ``ENQUEUED`` or ``DUPLICATE``.

        Raises:
            QueueSizeLimitExceededError: the queue is at its size limit (nothing written).
            InvalidNameError, PayloadError, InvalidLimitError: bad input (nothing written).
        """
        request = EnqueueRequest(
            env, queue, run_id, payload, concurrency_key, delay_ms, available_at_ms,
            head_start_ms, ttl_ms, tenant, keep_outcome, priority=priority,
        )  # fmt: skip
        result = await self.enqueue_one(request, now_ms=now_ms)
        if result.status is EnqueueStatus.REJECTED:
            raise QueueSizeLimitExceededError(queue, result.queue_size_limit)
        return result.status

    async def partition_of(self, env: Environment, encoded: list[str]) -> int:
        """The partition of the environment an encoded run goes to (by its tenant)."""
        return (await self.placement(env)).partition_of(encoded[2], encoded[1])

    def encode_request(self, r: EnqueueRequest) -> list[str]:
        """The 12 encoded fields of one run (see :func:`encode_request`)."""
        return encode_request(r, self.config.max_payload_bytes)

    async def enqueue_tick(
        self,
        schedule: str,
        tick_ms: int,
        request: EnqueueRequest,
        *,
        now_ms: int | None = None,
    ) -> EnqueueResult | None:
        """Enqueue a schedule's run for one tick, exactly once however many processes
        call this: the script claims the tick only if it is later than the schedule's
        last claimed one. Returns None when another caller already claimed it."""
        validate.schedule_name(schedule)
        validate.time_ms("tick_ms", tick_ms)
        encoded = self.encode_request(request)
        args = [request.env.id, request.queue, schedule, str(tick_ms), run_argument(encoded)]
        partition = await self.partition_of(request.env, encoded)
        reply = await self.call_for_env("enqueue", request.env, args, now_ms, partition)
        words = enqueue_reply(reply)
        if self.decode("enqueue", words[0]) is Status.TICK_TAKEN:
            return None
        status = _STATUS[self.decode("enqueue", words[2])]
        return EnqueueResult(request.run_id, status, int(words[1]))

    async def enqueue_many(
        self, requests: Sequence[EnqueueRequest], *, now_ms: int | None = None
    ) -> list[EnqueueResult]:
        """Queue several runs: one script call per base queue, a few in flight at once.

        Every request is validated before anything is written. Returns one result per
        request, in order: enqueued, duplicate, or rejected by the queue size limit.
        """
        if now_ms is not None:
            validate.time_ms("now_ms", now_ms)
        groups: dict[tuple[Environment, int, str], list[int]] = defaultdict(list)
        encoded: list[list[str]] = []
        for r in requests:
            encoded.append(self.encode_request(r))
        for i, r in enumerate(requests):
            groups[(r.env, await self.partition_of(r.env, encoded[i]), r.queue)].append(i)
        results: list[EnqueueResult | None] = [None] * len(requests)
        calls = [
            (env, partition, queue, indexes[i : i + MAX_RUNS_PER_CALL])
            for (env, partition, queue), indexes in groups.items()
            for i in range(0, len(indexes), MAX_RUNS_PER_CALL)
        ]

        async def one(env: Environment, partition: int, queue: str, indexes: list[int]) -> None:
            args = enqueue_args(env, queue, [encoded[i] for i in indexes])
            reply = await self.call_for_env("enqueue", env, args, now_ms, partition)
            got = enqueue_results([requests[i] for i in indexes], reply)
            for i, result in zip(indexes, got, strict=True):
                results[i] = result

        if len(calls) == 1:
            await one(*calls[0])
        else:
            limiter = asyncio.Semaphore(MAX_CONCURRENT_CALLS)

            async def limited(
                env: Environment, partition: int, queue: str, indexes: list[int]
            ) -> None:
                async with limiter:
                    await one(env, partition, queue, indexes)

            await asyncio.gather(*(limited(*c) for c in calls))
        return [r for r in results if r is not None]
