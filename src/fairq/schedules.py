"""Schedules: periodic triggers, each tick enqueued exactly once however many workers run.

A schedule is a cron expression (5 fields, in a time zone; parsed by ``cronsim``) or an
interval. Every worker of the app runs a :class:`Scheduler`; once a second each works out
the ticks that are due since the schedule's last claimed tick (kept on the server) and
claims them with ``RunQueue.enqueue_tick``: the enqueue script enqueues a tick's run only
if the tick is later than the last claimed one, atomically, so a tick is enqueued once.

Catch-up after downtime (no worker ran for a while):

* ``none``: missed ticks are skipped; only a tick that is due now (less than one period
  late, at most a minute) is enqueued;
* ``latest`` (default): the latest missed tick is enqueued, older ones skipped;
* ``all``: every missed tick is enqueued in order, at most ``max_catch_up`` (the oldest
  beyond that are skipped).

A schedule seen for the first time starts from the present: nothing before it is due.

Every value of a schedule is checked when it is made (:func:`validate_schedule`: its
runs exactly as a trigger's), so a schedule that cannot enqueue its ticks is refused at
``app.schedule``. A schedule that fails anyway (one built by hand) fails alone: its error
is logged and the other schedules' ticks are still claimed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from fairq.errors import ConfigurationError, ConnectionLostError, short
from fairq.models import EnqueueRequest, EnqueueStatus
from fairq.store import validate
from fairq.store.enqueue import PAYLOAD_FIELD, encode_request

if TYPE_CHECKING:
    from fairq.app import Fairq, Schedule
    from fairq.store import RunQueue

#: How late a tick may be and still count as "on time" for catch-up ``none`` (ms).
ON_TIME_MS: Final = 60_000
#: The shortest interval schedule (ms).
MIN_INTERVAL_MS: Final = 1_000

log = logging.getLogger("fairq.schedules")


def _zone(s: Schedule) -> ZoneInfo:
    if not isinstance(s.timezone, str):
        raise ConfigurationError(
            f"schedule {s.name!r}: a time zone is an IANA name, got {short(s.timezone)}"
        )
    try:
        return ZoneInfo(s.timezone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # (a name too long for a file name is an OSError)
        raise ConfigurationError(
            f"schedule {s.name!r}: unknown time zone {short(s.timezone)}"
        ) from None


def validate_schedule(s: Schedule) -> Schedule:
    """Check a schedule's name, expression, time zone and policy, and its runs exactly as
    a trigger checks a run (payload, concurrency key, tenant, the task's TTL and
    timeout). Returns it with its payload copied (a later change to the object given
    cannot make the schedule's ticks fail).

    Raises:
        InvalidLimitError: the name is not 1..200 characters of text without ``:``.
        PayloadError: the payload is not JSON-serialisable, too deep or too large.
        InvalidNameError: the concurrency key or the tenant cannot be a name.
        ConfigurationError: anything else (expression, time zone, catch-up policy).
    """
    validate.schedule_name(s.name)
    if (s.cron is None) == (s.every_ms is None):
        raise ConfigurationError(f"schedule {s.name!r}: give exactly one of cron= and every=")
    if s.every_ms is not None and s.every_ms < MIN_INTERVAL_MS:
        raise ConfigurationError(f"schedule {s.name!r}: every= must be at least 1 second")
    zone = _zone(s)
    if s.cron is not None:
        if not isinstance(s.cron, str):
            raise ConfigurationError(f"schedule {s.name!r}: cron must be a string")
        try:
            next(CronSim(s.cron, datetime.now(zone)))
        except (CronSimError, StopIteration) as exc:
            raise ConfigurationError(f"schedule {s.name!r}: bad cron expression: {exc}") from None
    if s.catch_up not in ("none", "latest", "all"):
        raise ConfigurationError(f"schedule {s.name!r}: catch_up must be none, latest or all")
    if (
        isinstance(s.max_catch_up, bool)
        or not isinstance(s.max_catch_up, int)
        or not 1 <= s.max_catch_up <= 10_000
    ):
        raise ConfigurationError(f"schedule {s.name!r}: max_catch_up must be in 1..10000")
    config = s.task.app.config
    # the runs of its ticks, as its enqueue will check them (tick 0 stands for any)
    payload = encode_request(tick_request(s, 0), config.max_payload_bytes)[PAYLOAD_FIELD]
    return dataclasses.replace(s, payload=json.loads(payload))


def tick_request(s: Schedule, tick_ms: int) -> EnqueueRequest:
    """The run a schedule's tick enqueues."""
    task = s.task
    return EnqueueRequest(
        env=task.app.env, queue=task.queue, run_id=run_id_of(s, tick_ms), payload=s.payload,
        concurrency_key=s.concurrency_key, tenant=s.tenant, ttl_ms=task.ttl_ms,
        timeout_ms=task.timeout_ms, keep_outcome=bool(task.keep_result),
        priority=s.priority if s.priority is not None else task.priority,
    )  # fmt: skip


def ticks_after(s: Schedule, after_ms: int) -> Iterator[int]:
    """The schedule's ticks strictly after ``after_ms``, in ms, oldest first, forever."""
    if s.every_ms is not None:
        tick = (after_ms // s.every_ms + 1) * s.every_ms
        while True:
            yield tick
            tick += s.every_ms
    assert s.cron is not None
    zone = ZoneInfo(s.timezone)
    start = datetime.fromtimestamp(after_ms / 1000, UTC).astimezone(zone)
    for when in CronSim(s.cron, start):
        ms = int(when.timestamp() * 1000)
        if ms > after_ms:
            yield ms


def ticks_until(s: Schedule, at_ms: int) -> Iterator[int]:
    """The schedule's ticks at or before ``at_ms``, in ms, newest first (however long
    ago the last one was, the first comes without walking the ticks in between)."""
    if s.every_ms is not None:
        tick = (at_ms // s.every_ms) * s.every_ms
        while tick >= 0:
            yield tick
            tick -= s.every_ms
        return
    assert s.cron is not None
    zone = ZoneInfo(s.timezone)
    # cron ticks fall on whole seconds; reverse iteration excludes its start
    start = datetime.fromtimestamp(at_ms // 1000 + 1, UTC).astimezone(zone)
    for when in CronSim(s.cron, start, reverse=True):
        yield int(when.timestamp() * 1000)


def due_ticks(s: Schedule, last_ms: int | None, now_ms: int) -> list[int]:
    """The ticks to claim now, by the schedule's catch-up policy (oldest first).

    ``last_ms`` is the last tick claimed (None: the schedule is new, so only a tick of
    the last second is due). Cost: at most ``max_catch_up`` ticks are computed, whatever
    the downtime.
    """
    after = now_ms - 1_000 if last_ms is None else last_ms
    limit = s.max_catch_up if s.catch_up == "all" else 1
    due: list[int] = []
    for tick in ticks_until(s, now_ms):
        if tick <= after or len(due) >= limit:
            break
        due.append(tick)
    due.reverse()
    if s.catch_up == "none" and due:
        newest = due[-1]
        period = next(ticks_after(s, newest)) - newest
        if now_ms - newest > min(period, ON_TIME_MS):
            return []
    return due


def run_id_of(s: Schedule, tick_ms: int) -> str:
    """A tick's run id (deterministic: the same tick is the same run)."""
    digest = hashlib.sha256(s.name.encode()).hexdigest()[:12]
    return f"sched_{digest}_{tick_ms}"


class Scheduler:
    """Enqueues an app's schedules' due ticks (run by every worker; ticks claim once)."""

    def __init__(self, app: Fairq) -> None:
        self.app = app
        #: When this scheduler first saw a schedule that had no claimed tick yet (ms):
        #: its ticks since then are due even if a call comes late.
        self._first_seen: dict[str, int] = {}

    async def tick(self, rq: RunQueue, *, now_ms: int | None = None) -> int:
        """Claim every due tick of every schedule; returns how many runs this call enqueued.

        Costs one ``TIME`` (unless ``now_ms`` is given) and one ``HMGET`` per call, plus one
        enqueue script call per due tick.
        """
        schedules = list(self.app.schedules.values())
        if not schedules:
            return 0
        now = now_ms if now_ms is not None else await rq.server_time_ms()
        last = await rq.schedule_ticks(self.app.env, [s.name for s in schedules])
        enqueued = 0
        for s in schedules:
            claimed = last.get(s.name)
            if claimed is None:
                claimed = self._first_seen.setdefault(s.name, now - 1_000)
            try:
                enqueued += await self._claim_due(rq, s, claimed, now, now_ms)
            except ConnectionLostError:
                raise
            except Exception as exc:
                # this schedule alone: the others' ticks are still claimed
                log.error("schedule %r: its due ticks failed: %s", s.name, exc, exc_info=exc)
        return enqueued

    async def _claim_due(
        self, rq: RunQueue, s: Schedule, claimed: int, now: int, now_ms: int | None
    ) -> int:
        enqueued = 0
        for tick in due_ticks(s, claimed, now):
            result = await rq.enqueue_tick(s.name, tick, tick_request(s, tick), now_ms=now_ms)
            if result is not None and result.status is EnqueueStatus.ENQUEUED:
                enqueued += 1
        return enqueued

    def upcoming(self, now_ms: int, *, count: int = 3) -> dict[str, list[int]]:
        """The next ``count`` ticks of every schedule after ``now_ms`` (ms), for
        ``fairq schedules``."""
        now = now_ms
        out: dict[str, list[int]] = {}
        for s in self.app.schedules.values():
            it = ticks_after(s, now)
            out[s.name] = [next(it) for _ in range(count)]
        return out
