"""The integration examples run: the FastAPI app (through httpx's ASGI transport, its
lifespan included) and the Django project (management commands via call_command), each
with a real worker on the test server."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fairq.worker import Worker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


async def test_the_fastapi_example_triggers_a_task_that_a_worker_runs(
    redis_url: str, prefix: str
) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    example = load("fairq_fastapi_example", EXAMPLES / "fastapi_app.py")
    example.fq.use_server(redis_url, prefix=prefix)
    api = example.api
    transport = httpx.ASGITransport(app=api)
    async with (
        api.router.lifespan_context(api),  # what uvicorn runs at startup and shutdown
        httpx.AsyncClient(transport=transport, base_url="http://test") as client,
    ):
        worker = Worker(example.fq, concurrency=2, idle_timeout=0.2)
        running = asyncio.create_task(worker.run())
        try:
            response = await client.post("/reports", json={"account": "acme", "month": "2024-05"})
            assert response.status_code == 202
            run_id = response.json()["run_id"]
            body: dict[str, Any] = {}
            async with asyncio.timeout(10):
                while body.get("status") != "completed":
                    status = await client.get(f"/reports/{run_id}")
                    assert status.status_code == 200
                    body = status.json()
                    await asyncio.sleep(0.05)
            assert body["result"] == {"account": "acme", "month": "2024-05", "rows": 42}
            assert (await client.get("/reports/run_unknown")).status_code == 404
            invalid = await client.post("/reports", json={"account": "acme"})
            assert invalid.status_code == 422
        finally:
            worker.stop()
            await asyncio.wait_for(running, 10)


@pytest.fixture
async def django_project(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Any]:
    django = pytest.importorskip("django")
    monkeypatch.syspath_prepend(str(EXAMPLES / "django_example"))
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "django_example_site.settings")
    django.setup()
    tasks = importlib.import_module("reports.tasks")  # the example's app

    tasks.app.use_server(redis_url, prefix=prefix)
    yield tasks
    await tasks.app.aclose()  # the connection a worker or a trigger made on the test's loop
    tasks.app.close()  # the blocking API's


async def test_the_django_command_triggers_and_waits_while_a_worker_runs(
    django_project: Any,
) -> None:
    call_command = importlib.import_module("django.core.management").call_command

    app = django_project.app
    worker = Worker(app, concurrency=2, idle_timeout=0.2)
    running = asyncio.create_task(worker.run())
    try:
        out = io.StringIO()
        # a management command is blocking code: run it off the loop the worker uses
        await asyncio.to_thread(call_command, "request_report", "acme", "--wait", stdout=out)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 10)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("run run_") and lines[0].endswith(" enqueued")
    assert lines[1] == '{"account": "acme", "rows": 40}'
    assert worker.stats.completed == 1


async def test_the_django_worker_command_runs_queued_reports(django_project: Any) -> None:
    call_command = importlib.import_module("django.core.management").call_command

    handles = [await django_project.build_report.trigger({"account": a}) for a in ("a", "bb")]
    out = io.StringIO()
    await asyncio.to_thread(call_command, "run_fairq_worker", "--burst", stdout=out)
    assert "worker stopped: 2 completed, 0 failed" in out.getvalue()
    assert [await h.wait(timeout=5) for h in handles] == [
        {"account": "a", "rows": 10},
        {"account": "bb", "rows": 20},
    ]
    await django_project.app.aclose()
