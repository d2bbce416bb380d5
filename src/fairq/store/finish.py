"""Finishing leased runs: finish (outcome + ack in one step), nack, heartbeat, release."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Final

from fairq.config import MAX_ATTEMPTS
from fairq.errors import InvalidLimitError
from fairq.keys import MAX_PARTITIONS, Environment
from fairq.models import (
    AckStatus,
    Delivery,
    Finish,
    HeartbeatStatus,
    NackOutcome,
    ReleaseStatus,
)
from fairq.outcomes import FINISH_STATUSES, MAX_ERROR_CHARS, MAX_TRACEBACK_CHARS, KeptOutcome
from fairq.store import validate
from fairq.store._core import StoreCore
from fairq.store.scripts import Order
from fairq.store.status import Status

#: The longest error, traceback and result JSON a finishing call takes (characters;
#: the error and traceback are cut to the outcome's bounds).
MAX_ERROR_INPUT_CHARS: Final = 100_000
MAX_TRACEBACK_INPUT_CHARS: Final = 1_000_000
MAX_RESULT_CHARS: Final = 100_000_000

_ACK: Final = {
    Status.ACKED: AckStatus.ACKED,
    Status.UNKNOWN_RUN: AckStatus.UNKNOWN,
    Status.LEASE_LOST: AckStatus.LEASE_LOST,
}
_NACK: Final = {
    Status.REQUEUED: NackOutcome.REQUEUED,
    Status.DEAD_LETTERED: NackOutcome.DEAD_LETTERED,
    Status.CANCELLED: NackOutcome.CANCELLED,
    Status.UNKNOWN_RUN: NackOutcome.UNKNOWN,
    Status.LEASE_LOST: NackOutcome.LEASE_LOST,
}
_HEARTBEAT: Final = {
    Status.EXTENDED: HeartbeatStatus.EXTENDED,
    Status.CANCEL_REQUESTED: HeartbeatStatus.CANCEL_REQUESTED,
    Status.UNKNOWN_RUN: HeartbeatStatus.UNKNOWN,
    Status.LEASE_LOST: HeartbeatStatus.LEASE_LOST,
}
_RELEASE: Final = {
    Status.RELEASED: ReleaseStatus.RELEASED,
    Status.NOT_HELD: ReleaseStatus.NOT_HELD,
    Status.UNKNOWN_RUN: ReleaseStatus.UNKNOWN,
    Status.LEASE_LOST: ReleaseStatus.LEASE_LOST,
}


def _packed_outcome(outcome: object) -> str:
    """A Finish's outcome as the ack script takes it ('' = keep none), checked."""
    if outcome is None:
        return ""
    if not isinstance(outcome, KeptOutcome):
        raise InvalidLimitError("outcome", outcome, "must be a KeptOutcome or None")
    validate.text("result_json", outcome.result_json, MAX_RESULT_CHARS)
    try:
        json.loads(outcome.result_json)
    except ValueError:
        raise InvalidLimitError("result_json", outcome.result_json, "is not JSON") from None
    if outcome.error is not None:
        validate.text("error", outcome.error, MAX_ERROR_INPUT_CHARS)
    if outcome.traceback is not None:
        validate.text("traceback", outcome.traceback, MAX_TRACEBACK_INPUT_CHARS)
    return outcome.packed()


def _check_delivery(d: object) -> Delivery:
    if not isinstance(d, Delivery):
        raise InvalidLimitError("delivery", d, "must be a Delivery from a dequeue")
    validate.integer("lease token", d.lease_token, 0, validate.MAX_LEASE_TOKEN)
    validate.integer("partition", d.partition, 0, MAX_PARTITIONS - 1)
    return d


class FinishOps(StoreCore):
    async def _per_shard(
        self,
        operation: str,
        head: list[str],
        items: list[tuple[Delivery, list[str]]],
        now_ms: int | None,
    ) -> list[Status]:
        """Run a batch script once per shard (the fair build when any of its environments
        uses the fair order) and return its per-run statuses in the order of ``items``."""
        by_shard: dict[int, list[int]] = defaultdict(list)
        for i, (d, _) in enumerate(items):
            by_shard[self.keys.partition_shard(d.env, d.partition)].append(i)
        statuses: list[Status] = [Status.UNKNOWN_RUN] * len(items)
        for shard, indexes in by_shard.items():
            envs = {items[i][0].env for i in indexes}
            order: Order = "fair" if any(self.order_for(e) == "fair" for e in envs) else "age"
            args = list(head)
            for i in indexes:
                args.extend(items[i][1])
            reply = await self.call(operation, order, self.keys.tag(shard), args, now_ms)
            for i, code in zip(indexes, reply, strict=True):
                statuses[i] = self.decode(operation, code)
        return statuses

    async def finish(
        self, items: Sequence[Finish], *, now_ms: int | None = None
    ) -> list[AckStatus]:
        """End runs: record each outcome (if any), free its slots and forget it, in one
        atomic script call per shard (an outcome is written only if its ack succeeds).

        Raises:
            InvalidLimitError: an item that is not a Finish of a Delivery, a bad status.
        """
        validate.batch("finish", items)
        encoded: list[tuple[Delivery, list[str]]] = []
        for item in items:
            if not isinstance(item, Finish):
                raise InvalidLimitError("finish item", item, "must be a Finish")
            d = _check_delivery(item.delivery)
            if item.status not in FINISH_STATUSES:
                raise InvalidLimitError("status", item.status, f"must be one of {FINISH_STATUSES}")
            outcome = _packed_outcome(item.outcome)
            encoded.append((d, [d.lease_member, str(d.lease_token), outcome, item.status]))
        if not encoded:
            return []
        statuses = await self._per_shard("ack", [], encoded, now_ms)
        return [_ACK[s] for s in statuses]

    async def ack(
        self, deliveries: Sequence[Delivery], *, now_ms: int | None = None
    ) -> list[AckStatus]:
        """Finish runs as completed without keeping an outcome (see :meth:`finish`)."""
        return await self.finish([Finish(d) for d in deliveries], now_ms=now_ms)

    async def nack(
        self,
        delivery: Delivery,
        *,
        retry_at_ms: int | None = None,
        retry_delay_ms: int | None = None,
        increment_attempt: bool = True,
        max_attempts: int | None = None,
        error: str | None = None,
        traceback: str | None = None,
        keep_outcome: bool = False,
        now_ms: int | None = None,
    ) -> NackOutcome:
        """Give a run back for a retry, or dead-letter it at its last attempt. A run whose
        cancellation was asked while it ran gets neither: it ends cancelled (``CANCELLED``).

        Args:
            retry_at_ms: when it may run again (absolute); or
            retry_delay_ms: after this long (on the server's clock); default: the retry
                policy's backoff for this attempt (no delay when the attempt does not count).
            increment_attempt: count this as a failed attempt.
            max_attempts: override the retry policy's maximum (1..1000).
            error: the attempt's error, kept with the run (bounded).
            traceback: the attempt's traceback, kept with the run (bounded), shown by
                ``get_run`` and ``dead_letters``.
            keep_outcome: keep an outcome if the run is dead-lettered (with the error
                and the traceback; the script adds the rest, see fairq.outcomes).

        Every argument is checked before the script runs; the script checks them again
        before its first write, so a bad argument never loses the run.
        """
        d = _check_delivery(delivery)
        for name, flag in (
            ("increment_attempt", increment_attempt),
            ("keep_outcome", keep_outcome),
        ):
            if not isinstance(flag, bool):
                raise InvalidLimitError(name, flag, "must be True or False")
        policy = self.config.retry
        limit = policy.max_attempts if max_attempts is None else max_attempts
        validate.integer("max_attempts", limit, 1, MAX_ATTEMPTS)
        attempt = d.attempt + (1 if increment_attempt else 0)
        if retry_at_ms is not None:
            at = str(validate.time_ms("retry_at_ms", retry_at_ms))
            delay = 0
        else:
            at = ""
            if retry_delay_ms is not None:
                delay = validate.duration_ms("retry_delay_ms", retry_delay_ms)
            else:
                delay = policy.delay_ms(attempt, self.rng) if increment_attempt else 0
        text = (
            ""
            if error is None
            else validate.text("error", error, MAX_ERROR_INPUT_CHARS)[:MAX_ERROR_CHARS]
        )
        trace = (
            ""
            if traceback is None
            else validate.text("traceback", traceback, MAX_TRACEBACK_INPUT_CHARS)[
                -MAX_TRACEBACK_CHARS:
            ]
        )
        reply = await self.call_for_env(
            "nack", d.env,
            [d.lease_member, str(d.lease_token), at, str(delay), "1" if increment_attempt else "0",
             str(limit), text, "1" if keep_outcome else "0", trace],
            now_ms, d.partition,
        )  # fmt: skip
        return _NACK[self.decode("nack", reply[0])]

    async def heartbeat(
        self,
        deliveries: Sequence[Delivery],
        *,
        lease_ms: int | None = None,
        progress: dict[str, tuple[float, str]] | None = None,
        now_ms: int | None = None,
    ) -> list[HeartbeatStatus]:
        """Extend leases (to now + lease on the server's clock); each run's full outcome.

        Args:
            progress: run id -> (fraction 0..1, message): recorded with the run in the
                same call (so reporting progress costs no extra round trip).
        """
        validate.batch("heartbeat", deliveries)
        lease = validate.lease_ms(self.config.lease_ms if lease_ms is None else lease_ms)
        notes = progress or {}

        def note(d: Delivery) -> str:
            if d.run_id not in notes:
                return ""
            fraction, message = notes[d.run_id]
            return validate.progress_note(fraction, message)

        items = [
            (d, [d.lease_member, str(d.lease_token), note(d)])
            for d in map(_check_delivery, deliveries)
        ]
        if not items:
            return []
        statuses = await self._per_shard("heartbeat", [str(lease)], items, now_ms)
        return [_HEARTBEAT[s] for s in statuses]

    async def release(
        self, deliveries: Sequence[Delivery], *, now_ms: int | None = None
    ) -> list[ReleaseStatus]:
        """Free the concurrency slots of leased runs but keep them leased."""
        validate.batch("release", deliveries)
        items = [
            (d, [d.lease_member, str(d.lease_token)]) for d in map(_check_delivery, deliveries)
        ]
        if not items:
            return []
        statuses = await self._per_shard("release", [], items, now_ms)
        return [_RELEASE[s] for s in statuses]

    def _env_of(self, d: Delivery) -> Environment:
        return d.env
