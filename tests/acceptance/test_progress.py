"""Progress a running task reports: kept with the run, coalesced into heartbeats, shown by
``handle.info()`` and ``get_run``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fairq.app import Fairq
from fairq.config import RunQueueConfig
from fairq.errors import ConfigurationError
from fairq.keys import Environment
from fairq.outcomes import RunInfo, RunStatus
from fairq.worker import Worker, current_run


@pytest.fixture
async def app(redis_url: str, prefix: str, env: Environment) -> AsyncIterator[Fairq]:
    application = Fairq(env, url=redis_url, config=RunQueueConfig(prefix=prefix, lease_ms=1500))
    yield application
    await application.aclose()


async def progress_of(handle: Any, expected: tuple[float, str]) -> RunInfo:
    """The run's info once it shows ``expected`` (bounded: heartbeats come every 0.5 s)."""
    async with asyncio.timeout(5):
        while True:
            info: RunInfo | None = await handle.info()
            if info is not None and info.progress == expected:
                return info
            await asyncio.sleep(0.05)


async def test_progress_is_stored_with_the_run_and_coalesced_into_heartbeats(
    app: Fairq,
) -> None:
    step = asyncio.Event()
    done = asyncio.Event()

    @app.task(queue="import_csv")
    async def import_csv(payload: None) -> str:
        run = current_run()
        assert run is not None
        for i in range(1000):  # many reports in a burst...
            run.progress(i / 1000, f"row {i}")
        run.progress(0.4, "step 2 of 5")  # ...only the last one is sent
        await step.wait()
        run.progress(2.5, "x" * 5000)  # bounded: clamped to 1, message cut to 1000 chars
        await done.wait()
        return "imported"

    worker = Worker(app, concurrency=2, idle_timeout=0.2)
    runner = asyncio.create_task(worker.run())
    try:
        rq = await app.queue()  # the worker's RunQueue (same loop): count its heartbeats
        calls: list[dict[str, tuple[float, str]] | None] = []
        heartbeat = rq.heartbeat

        async def counting(deliveries: Any, **kwargs: Any) -> Any:
            calls.append(kwargs.get("progress"))
            return await heartbeat(deliveries, **kwargs)

        rq.heartbeat = counting  # type: ignore[method-assign]
        handle = await import_csv.trigger()
        info = await progress_of(handle, (0.4, "step 2 of 5"))
        assert info.status is RunStatus.RUNNING
        # the 1001 reports cost one heartbeat with the last of them, not 1001 round trips
        # (heartbeats without progress, every 0.5 s meanwhile, are not counted)
        assert [p for p in calls if p] == [{handle.run_id: (0.4, "step 2 of 5")}]
        step.set()
        info = await progress_of(handle, (1.0, "x" * 1000))
        # the same through the app
        again = await app.get_run(handle.run_id)
        assert again is not None and again.progress == (1.0, "x" * 1000)
        done.set()
        assert await handle.wait(timeout=10) == "imported"
    finally:
        worker.stop()
        await asyncio.wait_for(runner, 10)


async def test_a_plain_function_reports_progress_and_bad_values_are_refused(
    app: Fairq,
) -> None:
    go_on = threading.Event()
    errors: list[str] = []

    @app.task(queue="render")
    def render(payload: None) -> None:
        run = current_run()
        assert run is not None
        try:
            run.progress("half")  # type: ignore[arg-type]
        except ConfigurationError as exc:
            errors.append(str(exc))
        run.progress(0.5, "frame 50 of 100")
        go_on.wait(10)

    worker = Worker(app, concurrency=2, idle_timeout=0.2)
    runner = asyncio.create_task(worker.run())
    try:
        handle = await render.trigger()
        info = await progress_of(handle, (0.5, "frame 50 of 100"))
        assert info.status is RunStatus.RUNNING
        assert errors == ["progress must be a number in 0..1"]
        go_on.set()
        await handle.wait(timeout=10)
        assert await handle.info() is None  # completed without a result: nothing kept
    finally:
        go_on.set()
        worker.stop()
        await asyncio.wait_for(runner, 10)
