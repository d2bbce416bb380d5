"""The command line through its real entry point (``python -m fairq``), on the test server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.state import run_state

from fairq.app import Fairq
from fairq.config import RunQueueConfig
from fairq.keys import Environment
from fairq.outcomes import RunStatus
from fairq.store import RunQueue


@pytest.fixture
def fairq_cli(redis_url: str, prefix: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python -m fairq ARGS`` against the test server and prefix."""

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        environ = {
            **os.environ, "FAIRQ_REDIS_URL": redis_url, "FAIRQ_PREFIX": prefix, "COLUMNS": "200",
        }  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "fairq", *args],
            env=environ, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if ok:
            assert done.returncode == 0, done.stderr + done.stdout
        return done

    return run


async def queue_on(make_queue: Callable[..., Any]) -> RunQueue:
    rq: RunQueue = await make_queue()
    return rq


async def test_help_lists_every_command(fairq_cli: Callable[..., Any]) -> None:
    out = fairq_cli("--help").stdout
    for name in (
        "demo",
        "worker",
        "dashboard",
        "stats",
        "limits",
        "dlq",
        "cancel",
        "bench",
        "server",
    ):
        assert name in out


async def test_stats_shows_ck_aware_counts(
    fairq_cli: Callable[..., Any], make_queue: Callable[..., Any], env: Environment
) -> None:
    # Given runs of one queue spread over three concurrency keys, one of them leased
    rq = await queue_on(make_queue)
    for i in range(5):
        await rq.enqueue(env, "emails", f"r{i}", {"i": i}, concurrency_key=f"tenant-{i % 3}")
    await rq.set_queue_concurrency(env, "emails", 4)
    assert len(await rq.dequeue_from_queue(env, "emails", keyed=True, max_count=1)) == 1
    # When stats are asked for
    data = json.loads(fairq_cli("stats", "--json").stdout)
    table = fairq_cli("stats").stdout
    # Then the queue counts every key
    (env_data,) = [e for e in data if e["env"] == env.id]
    (queue,) = env_data["queues"]
    assert (queue["queue"], queue["queued"], queue["running"]) == ("emails", 4, 1)
    assert queue["concurrency_limit"] == 4
    assert sorted(k["key"] for k in queue["keys"]) == ["tenant-0", "tenant-1", "tenant-2"]
    assert env.id in table and "emails" in table


async def test_limits_set_get_pause_resume(
    fairq_cli: Callable[..., Any], make_queue: Callable[..., Any], env: Environment
) -> None:
    rq = await queue_on(make_queue)
    await rq.enqueue(env, "emails", "r1", 1)
    fairq_cli("limits", "set", env.id, "--concurrency", "7", "--burst", "2", "--size-limit", "100")
    fairq_cli("limits", "set", env.id, "emails", "--concurrency", "3", "--size-limit", "50")
    e = await rq.env_stats(env)
    q = await rq.queue_stats(env, "emails")
    assert (e.concurrency_limit, e.burst_factor, e.queue_size_limit) == (7, 2.0, 100)
    assert (q.concurrency_limit, q.queue_size_limit) == (3, 50)
    shown = fairq_cli("limits", "get", env.id).stdout
    assert "queue emails" in shown and "7" in shown

    fairq_cli("limits", "pause", env.id, "emails")
    paused = await rq.queue_stats(env, "emails")
    assert paused.paused and paused.is_paused
    # pausing is a flag: the queue keeps its limits while paused
    assert (paused.concurrency_limit, paused.queue_size_limit) == (3, 50)
    assert "paused" in fairq_cli("limits", "get", env.id, "emails").stdout
    assert await rq.dequeue(10, env=env, queues=["emails"]) == []
    fairq_cli("limits", "resume", env.id, "emails")
    resumed = await rq.queue_stats(env, "emails")
    # resume keeps the limit (it used to be removed with the pause)
    assert not resumed.paused
    assert (resumed.concurrency_limit, resumed.queue_size_limit) == (3, 50)
    assert "paused" not in fairq_cli("limits", "get", env.id, "emails").stdout
    assert [d.run_id for d in await rq.dequeue(10, env=env, queues=["emails"])] == ["r1"]
    fairq_cli("limits", "resume", env.id, "emails", "--concurrency", "5")
    assert (await rq.queue_stats(env, "emails")).concurrency_limit == 5


async def test_limits_set_is_validated_whole_and_applied_at_once(
    fairq_cli: Callable[..., Any], make_queue: Callable[..., Any], env: Environment
) -> None:
    rq = await queue_on(make_queue)
    await rq.enqueue(env, "emails", "r1", 1)
    fairq_cli(
        "limits", "set", env.id, "emails", "--concurrency", "3", "--size-limit", "50",
        "--total", "8", "--rate", "30/m", "--rate-burst", "4", "--order", "fair", "--borrow",
    )  # fmt: skip
    q = await rq.queue_stats(env, "emails")
    assert (q.concurrency_limit, q.queue_size_limit, q.total_concurrency_limit) == (3, 50, 8)
    assert (q.rate, q.rate_burst, q.order, q.borrow) == (0.5, 4, "fair", True)
    shown = fairq_cli("limits", "get", env.id, "emails").stdout
    assert "fair" in shown and "0.5 (burst 4)" in shown and "borrow" in shown
    # one bad value anywhere in the command: nothing of it is written
    for bad in (
        ["--concurrency", "9", "--size-limit", "-1"],
        ["--concurrency", "9", "--order", "random"],
        ["--concurrency", "9", "--rate", "fast"],
        ["--concurrency", "9", "--total", "x"],
    ):
        done = fairq_cli("limits", "set", env.id, "emails", *bad, ok=False)
        assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
        assert "Error" in done.stderr
        assert (await rq.queue_stats(env, "emails")).concurrency_limit == 3
    # clearing one setting leaves every other as it is
    fairq_cli("limits", "set", env.id, "emails", "--size-limit", "none")
    q = await rq.queue_stats(env, "emails")
    assert q.queue_size_limit is None
    assert (q.concurrency_limit, q.total_concurrency_limit, q.rate, q.order) == (3, 8, 0.5, "fair")
    fairq_cli("limits", "set", env.id, "emails", "--rate", "none", "--no-borrow")
    q = await rq.queue_stats(env, "emails")
    assert (q.rate, q.rate_burst, q.borrow) == (None, None, False)
    assert (q.concurrency_limit, q.total_concurrency_limit) == (3, 8)
    # environment settings: the same rules
    fairq_cli("limits", "set", env.id, "--concurrency", "7", "--burst", "2")
    fairq_cli("limits", "set", env.id, "--burst", "none")
    e = await rq.env_stats(env)
    assert (e.concurrency_limit, e.burst_factor) == (7, 1.0)
    misplaced = fairq_cli("limits", "set", env.id, "--total", "3", ok=False)
    assert misplaced.returncode == 2 and "apply to a queue" in misplaced.stderr


async def test_a_bad_limit_is_one_clear_error(
    fairq_cli: Callable[..., Any], env: Environment
) -> None:
    done = fairq_cli("limits", "set", env.id, "--concurrency", "-3", ok=False)
    assert done.returncode == 1
    assert "Error: invalid env concurrency limit -3" in done.stderr
    assert "Traceback" not in done.stderr


async def test_dlq_list_and_redrive(
    fairq_cli: Callable[..., Any], make_queue: Callable[..., Any], env: Environment
) -> None:
    # Given two dead-lettered runs
    rq = await queue_on(make_queue)
    for run_id in ("dead-1", "dead-2"):
        await rq.enqueue(env, "emails", run_id, {"to": run_id}, concurrency_key="t1")
        (delivery,) = await rq.dequeue_from_queue(env, "emails", keyed=True, max_count=1)
        await rq.nack(delivery, max_attempts=1, error=f"ValueError: {run_id} broke")
    listing = fairq_cli("dlq", "list", env.id).stdout
    assert "dead-1" in listing and "dead-2" in listing
    # with the last error of each and the count
    assert "ValueError: dead-1 broke" in listing and "ValueError: dead-2 broke" in listing
    assert f"dead letters of {env.id} (2)" in listing
    # When one is redriven by id, then the rest with --all
    fairq_cli("dlq", "redrive", env.id, "dead-1")
    assert await run_state(rq, env, "dead-1") == "queued"
    assert await run_state(rq, env, "dead-2") == "dlq"
    fairq_cli("dlq", "redrive", env.id, "--all")
    assert await run_state(rq, env, "dead-2") == "queued"
    assert await rq.dead_letters(env) == []
    # and an unknown id is reported
    missing = fairq_cli("dlq", "redrive", env.id, "nope", ok=False)
    assert missing.returncode == 1 and "nope" in missing.stderr


WORKER_APP = """
import os
from fairq.app import Fairq

app = Fairq(os.environ["TEST_ENV"])


@app.task(queue="double", concurrency_limit=2)
def double(payload):
    return payload * 2
"""


async def test_worker_starts_runs_tasks_and_stops_on_sigterm(
    tmp_path: Path, redis_url: str, prefix: str, env: Environment
) -> None:
    (tmp_path / "cliapp.py").write_text(WORKER_APP)
    environ = {
        **os.environ,
        "FAIRQ_REDIS_URL": redis_url,
        "FAIRQ_PREFIX": prefix,
        "TEST_ENV": env.id,
    }
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", "fairq", "worker", "cliapp:app", "--concurrency", "3"],
        cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    client = Fairq(env, url=redis_url, config=RunQueueConfig(prefix=prefix))
    double = client.task(queue="double")(lambda payload: None)
    try:
        handle = await double.trigger(21)
        assert await handle.wait(timeout=20) == 42
        rq = await client.queue()
        # the decorator's limit was written when the worker started
        assert (await rq.queue_stats(env, "double")).concurrency_limit == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        _, stderr = await asyncio.to_thread(proc.communicate, timeout=20)
        await client.aclose()
    assert proc.returncode == 0, stderr.decode()
    assert time.monotonic() - started < 10
    text = stderr.decode()
    assert f"env {env.id}" in text and "queues double" in text
    assert "1 completed" in text
    info = await client.get_run(handle.run_id)
    assert info is not None and info.status is RunStatus.COMPLETED
    await client.aclose()


async def test_worker_refuses_what_is_not_an_app(
    tmp_path: Path, fairq_cli: Callable[..., Any]
) -> None:
    done = fairq_cli("worker", "json:dumps", ok=False)
    assert done.returncode == 2 and "not a fairq.Fairq app" in done.stderr
    done = fairq_cli("worker", "no_such_module_xyz:app", ok=False)
    assert done.returncode == 2 and "cannot import" in done.stderr


async def test_cancel_a_queued_run(
    fairq_cli: Callable[..., Any], make_queue: Callable[..., Any], env: Environment
) -> None:
    rq = await queue_on(make_queue)
    await rq.enqueue(env, "emails", "r1", {}, concurrency_key="t")
    await rq.enqueue(env, "emails", "r2", {}, concurrency_key="t")

    done = fairq_cli("cancel", env.id, "r1")
    assert "r1: cancelled" in done.stdout
    assert (await rq.queue_stats(env, "emails")).queued == 1

    # cancelled runs keep an outcome: cancelling one again says it already finished
    again = fairq_cli("cancel", env.id, "r1", ok=False)
    assert again.returncode == 1
    assert "r1: already finished" in again.stdout
    missing = fairq_cli("cancel", env.id, "nope", ok=False)
    assert missing.returncode == 1
    assert "nope: unknown" in missing.stdout
    assert (await rq.get_run(env, "r1")).status is RunStatus.CANCELLED  # type: ignore[union-attr]
