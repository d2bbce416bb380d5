"""Blocking single-run enqueues, for the blocking API (``Task.trigger_sync``) on one server.

A thread that triggers a run sends the enqueue script itself on a blocking connection:
no hop to an event-loop thread and back. Threads enqueueing into the same queue at once
share script calls (group commit): a call that finds none of its queue in flight is sent
at once; calls made while one is in flight wait, and the first of them sends them all
together when the call in flight returns (each caller gets its own result or error).

It shares its :class:`~fairq.store.RunQueue`'s key schema, scripts, context, validation
and what it learned about environments' orders; a cluster keeps the event-loop path.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import redis

from fairq.keys import Environment
from fairq.models import EnqueueRequest, EnqueueResult
from fairq.store._core import raise_translated
from fairq.store.enqueue import MAX_RUNS_PER_CALL, enqueue_args, enqueue_results
from fairq.store.scripts import Order

if TYPE_CHECKING:
    from fairq.store import RunQueue

#: (env, partition, queue): what one enqueue script call can carry.
_Key = tuple[Environment, int, str]


class _Call:
    """One caller's run, and what came of it. ``done`` is a plain lock held from the
    start and released once to wake the caller (cheaper than an Event, whose wait makes
    a lock of its own every time)."""

    __slots__ = ("batch", "done", "encoded", "error", "lead", "request", "result")

    def __init__(self, request: EnqueueRequest, encoded: list[str]) -> None:
        self.request = request
        self.encoded = encoded
        self.done = threading.Lock()
        self.done.acquire()
        self.result: EnqueueResult | None = None
        self.error: BaseException | None = None
        #: Set when this caller must send the batch it is part of (``batch``).
        self.lead = False
        self.batch: list[_Call] = []


class BlockingEnqueuer:
    """Thread-safe blocking ``enqueue_one`` on its own connection pool."""

    def __init__(self, rq: RunQueue, url: str) -> None:
        self._rq = rq
        self._client = redis.Redis.from_url(
            url, decode_responses=False, socket_timeout=None, socket_connect_timeout=5
        )
        self._lock = threading.Lock()
        self._waiting: dict[_Key, list[_Call]] = {}
        self._sending: set[_Key] = set()

    def enqueue_one(self, request: EnqueueRequest) -> EnqueueResult:
        """Queue one run (validated first, nothing written on bad input).

        Raises:
            InvalidNameError, PayloadError, InvalidLimitError: bad input.
            ConnectionLostError: the server cannot be reached.
        """
        call = _Call(request, self._rq.encode_request(request))
        key = (request.env, self._partition(request.env, call.encoded), request.queue)
        with self._lock:
            if key in self._sending:
                self._waiting.setdefault(key, []).append(call)
                lead = False
            else:
                self._sending.add(key)
                lead = True
        if lead:
            self._send_and_hand_over(key, [call])
        else:
            call.done.acquire()
            if call.lead:
                self._send_and_hand_over(key, call.batch)
                call.done.acquire()
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result

    def _partition(self, env: Environment, encoded: list[str]) -> int:
        """The partition an encoded run goes to, from the store's copy of the placement
        record (read again here, on this thread's connection, when it is stale)."""
        placements = self._rq.placements
        if not placements.fresh(time.monotonic()):
            try:
                record = self._client.hgetall(self._rq.keys.placement)
            except Exception as exc:
                raise_translated(exc, self._rq.server)
            placements.load(record, time.monotonic())
        return placements.get(env.id).partition_of(encoded[2], encoded[1])

    def _send_and_hand_over(self, key: _Key, batch: list[_Call]) -> None:
        """Send ``batch``, then make the first caller that waited meanwhile send the next
        batch (or mark the queue idle)."""
        try:
            self._send(key, batch)
        except BaseException as exc:  # every caller of the batch hears of it
            for call in batch:
                if call.result is None and call.error is None:
                    call.error = exc
        finally:
            with self._lock:
                following = self._waiting.pop(key, [])
                if following:
                    following[0].lead = True
                    following[0].batch = following
                    following[0].done.release()
                else:
                    self._sending.discard(key)
            for call in batch:  # (a caller that led this batch is past its wait already)
                call.done.release()

    def _send(self, key: _Key, batch: list[_Call]) -> None:
        env, partition, queue = key
        for start in range(0, len(batch), MAX_RUNS_PER_CALL):
            part = batch[start : start + MAX_RUNS_PER_CALL]
            args = enqueue_args(env, queue, [call.encoded for call in part])
            reply = self._call_for_env(env, partition, args)
            results = enqueue_results([call.request for call in part], reply)
            for call, result in zip(part, results, strict=True):
                call.result = result

    def _call_for_env(self, env: Environment, partition: int, args: list[str]) -> Any:
        """The enqueue script in the environment's order (the fair build when the age
        build refuses), as :meth:`fairq.store.RunQueue.call_for_env` does."""
        rq = self._rq
        tag = rq.keys.tag_of(env, partition)
        order = rq.order_for(env)
        reply = self._fcall(order, tag, args)
        if rq.refused_as_fair(env, order, reply):
            reply = self._fcall("fair", tag, args)
        return reply

    def _fcall(self, order: Order, tag: str, args: list[str]) -> Any:
        script, argv = self._rq.script_argv("enqueue", order, args, None)
        try:
            return script.call_blocking(self._client, [tag], argv)
        except Exception as exc:
            raise_translated(exc, self._rq.server)

    def close(self) -> None:
        self._client.close()
