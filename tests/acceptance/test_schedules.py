"""Schedules end to end on a real server: each tick enqueued exactly once however many
schedulers run, catch-up after downtime, time zones, and the ``fairq schedules`` command.

Schedulers run on a logical clock (``now_ms``); one test runs real workers."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fairq.app import Fairq
from fairq.config import RunQueueConfig
from fairq.errors import ConfigurationError
from fairq.keys import Environment
from fairq.models import EnqueueRequest, EnqueueStatus
from fairq.outcomes import RunStatus
from fairq.schedules import Scheduler, due_ticks, run_id_of, ticks_after, ticks_until
from fairq.store import RunQueue
from fairq.worker import Worker, current_run

MINUTE = 60_000
#: A logical "now": 2024-01-01 12:00:00 UTC, a multiple of every period used here.
T0 = int(datetime(2024, 1, 1, 12, 0, tzinfo=UTC).timestamp() * 1000)


@pytest.fixture
async def app(redis_url: str, prefix: str, env: Environment) -> AsyncIterator[Fairq]:
    application = Fairq(env, url=redis_url, config=RunQueueConfig(prefix=prefix))
    yield application
    await application.aclose()


async def queued(rq: RunQueue, app: Fairq, queue: str) -> int:
    return (await rq.queue_stats(app.env, queue)).queued


async def test_three_schedulers_over_30_ticks_enqueue_exactly_30_runs(
    app: Fairq, make_queue: Callable[..., Any], prefix: str
) -> None:
    # Given an interval schedule and a cron schedule, and three schedulers (three
    # processes: each its own connection) that each wake at slightly different times
    @app.task(queue="pulse")
    async def pulse(payload: None) -> None: ...

    @app.task(queue="report")
    async def report(payload: None) -> None: ...

    app.schedule(pulse, every=60)
    app.schedule(report, cron="* * * * *")
    queues: list[RunQueue] = [await make_queue() for _ in range(3)]
    schedulers = [Scheduler(app) for _ in range(3)]
    # When they run concurrently over 30 minutes of logical time
    enqueued = 0
    for minute in range(30):
        base = T0 + minute * MINUTE
        counts = await asyncio.gather(
            *(
                s.tick(rq, now_ms=base + offset)
                for s, rq, offset in zip(schedulers, queues, (0, 150, 900), strict=True)
            )
        )
        enqueued += sum(counts)
    # Then each of the 30 ticks of each schedule was enqueued once: 60 runs in all
    assert enqueued == 60
    assert await queued(queues[0], app, "pulse") == 30
    assert await queued(queues[0], app, "report") == 30
    for s in app.schedules.values():
        for minute in range(30):
            info = await app.get_run(run_id_of(s, T0 + minute * MINUTE))
            assert info is not None and info.status is RunStatus.QUEUED, (s.name, minute)
    # and a scheduler that comes late for a tick already claimed enqueues nothing
    assert await schedulers[0].tick(queues[0], now_ms=T0 + 29 * MINUTE + 5_000) == 0


async def test_a_tick_is_claimed_on_the_server_not_just_by_its_run_id(
    app: Fairq, make_queue: Callable[..., Any]
) -> None:
    # (a completed run without a result leaves nothing, so its run id alone would not do)
    @app.task(queue="pulse")
    async def pulse(payload: None) -> None: ...

    s = app.schedule(pulse, every=60)
    rq: RunQueue = await make_queue()
    assert await Scheduler(app).tick(rq, now_ms=T0) == 1
    # the tick is claimed on the server: the same tick under another run id is refused
    request = EnqueueRequest(env=app.env, queue="pulse", run_id="other-id", payload=None)
    assert await rq.enqueue_tick(s.name, T0, request) is None
    assert await rq.enqueue_tick(s.name, T0 - MINUTE, request) is None  # older: refused
    # a scheduler that never saw the schedule before, at the same tick
    assert await Scheduler(app).tick(rq, now_ms=T0 + 500) == 0
    assert await queued(rq, app, "pulse") == 1
    # the next tick is claimed
    later = await rq.enqueue_tick(s.name, T0 + MINUTE, request)
    assert later is not None and later.status is EnqueueStatus.ENQUEUED


@pytest.mark.parametrize(
    ("policy", "max_catch_up", "expected_minutes"),
    [
        ("none", 100, []),
        ("latest", 100, [60]),
        ("all", 100, list(range(5, 61, 5))),
        ("all", 4, [45, 50, 55, 60]),
    ],
)
async def test_catch_up_after_downtime(
    app: Fairq,
    make_queue: Callable[..., Any],
    policy: Any,
    max_catch_up: int,
    expected_minutes: list[int],
) -> None:
    # Given a schedule every 5 minutes whose tick at T0 was enqueued
    @app.task(queue="digest")
    async def digest(payload: None) -> None: ...

    s = app.schedule(digest, cron="*/5 * * * *", catch_up=policy, max_catch_up=max_catch_up)
    rq: RunQueue = await make_queue()
    assert await Scheduler(app).tick(rq, now_ms=T0 + 200) == 1
    # When no scheduler runs for an hour, and one wakes 2.5 minutes after a tick
    wake = T0 + 62 * MINUTE + 30_000
    count = await Scheduler(app).tick(rq, now_ms=wake)
    # Then the policy decides which missed ticks run
    assert count == len(expected_minutes)
    expected = {run_id_of(s, T0 + m * MINUTE) for m in [0, *expected_minutes]}
    for minute in range(0, 65, 5):
        run_id = run_id_of(s, T0 + minute * MINUTE)
        info = await app.get_run(run_id)
        assert (info is not None) == (run_id in expected), minute
    # and the next tick runs on time whatever the policy
    assert await Scheduler(app).tick(rq, now_ms=T0 + 65 * MINUTE + 300) == 1


def test_none_runs_a_tick_that_is_due_now_but_not_a_stale_one() -> None:
    app = Fairq("o:p:e")

    @app.task(queue="q")
    def q(payload: None) -> None: ...

    s = app.schedule(q, cron="0 * * * *", catch_up="none")  # hourly
    assert due_ticks(s, T0 - 60 * MINUTE, T0 + 2_000) == [T0]  # 2 s late: on time
    assert due_ticks(s, T0 - 60 * MINUTE, T0 + 5 * MINUTE) == []  # 5 min late: skipped
    # a week of downtime computes one tick, not 168
    assert due_ticks(s, T0 - 7 * 24 * 60 * MINUTE, T0 + 1_000) == [T0]


def test_time_zones_and_daylight_saving() -> None:
    app = Fairq("o:p:e")

    @app.task(queue="q")
    def q(payload: None) -> None: ...

    # 09:00 in New York is 14:00 UTC in winter and 13:00 UTC from 10 March 2024 (DST)
    s = app.schedule(q, cron="0 9 * * *", timezone="America/New_York")
    start = int(datetime(2024, 3, 8, tzinfo=UTC).timestamp() * 1000)
    ticks = ticks_after(s, start)
    got = [datetime.fromtimestamp(next(ticks) / 1000, UTC).hour for _ in range(3)]
    assert got == [14, 14, 13]
    # and backwards, from a moment on the tick itself
    at = int(datetime(2024, 3, 10, 13, 0, tzinfo=UTC).timestamp() * 1000)
    assert next(ticks_until(s, at)) == at
    assert next(ticks_until(s, at - 1)) == at - (24 * 60 - 60) * MINUTE
    # Asia/Kolkata is UTC+05:30
    k = app.schedule(q, cron="30 0 * * *", timezone="Asia/Kolkata")
    first = datetime.fromtimestamp(next(ticks_after(k, start)) / 1000, UTC)
    assert (first.hour, first.minute) == (19, 0)


async def test_a_scheduled_run_carries_the_schedules_payload_key_and_tenant(
    app: Fairq, make_queue: Callable[..., Any]
) -> None:
    @app.task(queue="sync_account", timeout=30)
    async def sync_account(payload: dict[str, str]) -> None: ...

    s = app.schedule(
        sync_account, every=timedelta(minutes=10), payload={"account": "a1"},
        concurrency_key="acct-1", tenant="acme", name="sync-a1",
    )  # fmt: skip
    rq: RunQueue = await make_queue()
    assert await Scheduler(app).tick(rq, now_ms=T0 + 10) == 1
    info = await app.get_run(run_id_of(s, T0))
    assert info is not None
    assert (info.concurrency_key, info.tenant, info.payload_json) == (
        "acct-1", "acme", '{"account":"a1"}',
    )  # fmt: skip


def test_the_decorator_registers_cron_and_interval_schedules_and_checks_them() -> None:
    app = Fairq("o:p:e")

    @app.task(queue="a", schedule="*/5 * * * *")
    async def a(payload: None) -> None: ...

    @app.task(queue="b", schedule=timedelta(seconds=30))
    async def b(payload: None) -> None: ...

    by_queue = {s.task.queue: s for s in app.schedules.values()}
    assert (by_queue["a"].cron, by_queue["a"].every_ms) == ("*/5 * * * *", None)
    assert (by_queue["b"].cron, by_queue["b"].every_ms) == (None, 30_000)
    with pytest.raises(ConfigurationError, match="bad cron"):
        app.schedule(a, cron="61 * * * *", name="bad")
    with pytest.raises(ConfigurationError, match="time zone"):
        app.schedule(a, cron="* * * * *", timezone="Mars/Olympus", name="tz")
    with pytest.raises(ConfigurationError, match="exactly one"):
        app.schedule(a, name="neither")
    with pytest.raises(ConfigurationError, match="at least 1 second"):
        app.schedule(a, every=0.5, name="fast")
    with pytest.raises(ConfigurationError, match="already exists"):
        app.schedule(a, cron="*/5 * * * *")
    with pytest.raises(ConfigurationError, match="catch_up"):
        app.schedule(a, every=5, catch_up="sometimes", name="c")  # type: ignore[arg-type]


async def test_three_workers_run_each_tick_of_a_schedule_once(app: Fairq) -> None:
    # Given a schedule every second and three workers (each runs the scheduler)
    seen: list[str] = []
    three = asyncio.Event()

    @app.task(queue="beat")
    async def beat(payload: None) -> None:
        run = current_run()
        assert run is not None
        seen.append(run.run_id)
        if len(seen) >= 3:
            three.set()

    # catch_up="all": a slow machine that holds all three past a second still runs its
    # tick (the default, latest, would skip it)
    app.schedule(beat, every=1, catch_up="all")
    workers = [Worker(app, concurrency=2, idle_timeout=0.2) for _ in range(3)]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        await asyncio.wait_for(three.wait(), 15)
    finally:
        for w in workers:
            w.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
    # Then each tick ran once, on consecutive seconds
    assert len(seen) == len(set(seen))
    ticks = sorted(int(r.rsplit("_", 1)[1]) for r in seen)
    assert all(b - a == 1_000 for a, b in itertools.pairwise(ticks)), ticks


def test_fairq_schedules_lists_schedules_and_next_runs(tmp_path: Path, redis_url: str) -> None:
    (tmp_path / "sched_app.py").write_text(
        textwrap.dedent(
            """
            from fairq import Fairq

            app = Fairq("acme:shop:dev")

            @app.task(queue="digest", schedule="0 8 * * *")
            async def digest(payload: None) -> None: ...

            app.schedule(digest, every=90, name="often", catch_up="all", max_catch_up=5)
            app.schedule(digest, cron="0 9 * * 1", timezone="Europe/Paris", name="weekly")
            """
        )
    )
    env = {**os.environ, "FAIRQ_REDIS_URL": redis_url, "FAIRQ_PREFIX": "schedcli"}
    out = subprocess.run(
        [sys.executable, "-m", "fairq", "schedules", "sched_app:app", "--next", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "digest@0 8 * * *: task sched_app.digest (queue digest), cron '0 8 * * *' (UTC)" in text
    assert "often: task sched_app.digest (queue digest), every 90s" in text
    assert "catch-up all (max 5)" in text
    assert "weekly:" in text and "(Europe/Paris)" in text
    assert text.count("last: never") == 3
    nexts = [line for line in text.splitlines() if line.strip().startswith("next:")]
    assert len(nexts) == 6
    assert any(line.endswith("08:00:00+00:00") for line in nexts)
    assert any("09:00:00+01:00" in line or "09:00:00+02:00" in line for line in nexts)


async def test_a_schedule_keeps_a_copy_of_its_payload(app: Fairq) -> None:
    """The payload is checked and copied when the schedule is made: changing the object
    afterwards (here to a value JSON cannot hold) changes neither the schedule nor its
    ticks' runs."""

    @app.task(queue="copied")
    async def copied(payload: Any) -> None:
        return None

    payload: dict[str, Any] = {"n": 1}
    s = app.schedule(copied, every=60, payload=payload, name="copy")
    payload["n"] = float("nan")
    assert s.payload == {"n": 1} and app.schedules["copy"].payload == {"n": 1}
