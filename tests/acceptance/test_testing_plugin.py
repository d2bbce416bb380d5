"""The ``fairq.testing`` pytest plugin, used as a project would: a conftest with
``pytest_plugins = ["fairq.testing"]``, a module-level app, async tests (run in a pytest
subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

PROJECT = {
    "pytest.ini": """
        [pytest]
        asyncio_mode = auto
        asyncio_default_fixture_loop_scope = function
        """,
    "conftest.py": """
        pytest_plugins = ["fairq.testing"]
        """,
    "shop.py": """
        from fairq import Fairq, current_run

        app = Fairq("acme:shop:test")  # no url: the plugin points it at its server

        @app.task(queue="invoices")
        async def invoice(payload: dict) -> dict:
            run = current_run()
            return {"total": sum(payload["lines"]), "run": run.run_id if run else None}

        @app.task(queue="plain")
        def plain(payload: int) -> int:
            return payload + 1
        """,
    "test_shop.py": """
        from fairq import EnqueueStatus
        from shop import app, invoice, plain

        async def test_a_worker_runs_the_task(fairq_worker, fairq_url):
            worker = await fairq_worker(app, concurrency=2)
            assert app.url == fairq_url
            handle = await invoice.trigger({"lines": [1, 2, 3]}, run_id="inv-1")
            assert await handle.wait(timeout=10) == {"total": 6, "run": "inv-1"}
            assert await (await plain.trigger(1)).wait(timeout=10) == 2
            assert worker.stats.completed == 2

        async def test_each_test_has_its_own_keys(fairq_bind):
            fairq_bind(app)
            handle = await invoice.trigger({"lines": []}, run_id="inv-1")
            assert handle.status is EnqueueStatus.ENQUEUED  # not a duplicate of the first test
            info = await handle.info()
            assert info is not None and info.status.value == "queued"

        async def test_two_workers(fairq_worker):
            await fairq_worker(app)
            await fairq_worker(app)
            handles = await invoice.trigger_many([{"lines": [i]} for i in range(20)])
            assert sorted([(await h.wait(timeout=10))["total"] for h in handles]) == list(range(20))

        def test_the_server_is_private(fairq_server):
            assert fairq_server.url.startswith("redis://127.0.0.1:")
        """,
}


def test_the_plugin_gives_tests_a_private_server_and_workers(tmp_path: Path) -> None:
    for name, text in PROJECT.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAIRQ_", "PYTEST_"))}
    # no server given: the plugin must not need FAIRQ_REDIS_URL or the shared server
    env["FAIRQ_REDIS_URL"] = "redis://127.0.0.1:1/0"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "4 passed" in out.stdout
