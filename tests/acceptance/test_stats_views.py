"""``fairq stats`` and the dashboard show the same numbers: both are built from the view
models of :mod:`fairq.dashboard.views`. Through the real CLI entry point and the app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import httpx

from fairq.dashboard.app import create_app
from fairq.keys import Environment
from fairq.store import RunQueue

T0 = 1_000_000
MakeQueue = Callable[..., Any]


def fairq_cli(redis_url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ, "FAIRQ_REDIS_URL": redis_url, "FAIRQ_PREFIX": prefix, "COLUMNS": "200",
    }  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "fairq", *args],
        env=environ, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def workload(rq: RunQueue, env: Environment) -> None:
    """Given a CK queue (three keys, two running per key), a paused keyless queue with a
    size limit of 0 (no cap), and a dead letter."""
    await rq.set_queue_concurrency(env, "emails", 2)
    for key, n in {"tenant-a": 5, "tenant-b": 3, "tenant-c": 1}.items():
        for i in range(n):
            await rq.enqueue(env, "emails", f"{key}-{i}", concurrency_key=key, now_ms=T0 + i)
    leased = 0
    for _ in range(10):  # until every variant is at its limit
        got = await rq.dequeue_from_queue(env, "emails", keyed=True, max_count=10, now_ms=T0 + 50)
        if not got:
            break
        leased += len(got)
    assert leased == 5
    await rq.set_queue_size_limit(env, "reports", 0)
    await rq.enqueue(env, "reports", "dead", now_ms=T0)
    (d,) = await rq.dequeue_from_queue(env, "reports", keyed=False, max_count=1, now_ms=T0)
    await rq.nack(d, max_attempts=1, now_ms=T0 + 1)
    await rq.pause_queue(env, "reports")
    await rq.enqueue(env, "reports", "waiting", now_ms=T0)


def without_waits(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Queue rows without the wall-clock-dependent ages."""
    return [{k: v for k, v in row.items() if k not in ("oldest_wait_s", "keys")} for row in rows]


async def test_stats_json_and_the_dashboard_overview_agree(
    make_queue: MakeQueue, env: Environment, redis_url: str, prefix: str
) -> None:
    rq = await make_queue()
    await workload(rq, env)
    done = fairq_cli(redis_url, prefix, "stats", "--json", "--env", env.id)
    assert done.returncode == 0, done.stderr
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(rq, token=None, allowed_hosts=["dash"])),
        base_url="http://dash",
    ) as client:
        overview = (await client.get("/api/overview")).json()

    (from_cli,) = json.loads(done.stdout)
    (from_app,) = [e for e in overview["environments"] if e["env"] == env.id]
    assert {k: v for k, v in from_cli.items() if k != "queues"} == {
        k: v for k, v in from_app.items() if k != "queues"
    }
    assert without_waits(from_cli["queues"]) == without_waits(from_app["queues"])
    emails, reports = from_cli["queues"]
    assert (emails["queue"], emails["queued"], emails["running"]) == ("emails", 4, 5)
    assert [(k["key"], k["queued"], k["running"]) for k in emails["keys"]] == [
        ("tenant-a", 3, 2),  # busiest first
        ("tenant-b", 1, 2),
        ("tenant-c", 0, 1),
    ]
    assert (reports["paused"], reports["queue_size_limit"]) == (True, None)  # 0 = no cap
    # pausing is a flag now: the queue keeps its limit (here: none) while paused
    assert reports["concurrency_limit"] is None
    assert from_cli["dead_lettered"] == 1
    # the autoscaling figures are the dashboard's too
    assert (emails["backlog"]["servable"], emails["backlog"]["held_by"]["key_cap"]) == (0, 4)
    assert (reports["backlog"]["servable"], reports["backlog"]["held_by"]["paused"]) == (0, 1)
    assert from_cli["backlog"]["held"] == 5 and from_app["backlog"] == from_cli["backlog"]


async def test_stats_table_shows_the_same_rows(
    make_queue: MakeQueue, env: Environment, redis_url: str, prefix: str
) -> None:
    rq = await make_queue()
    await workload(rq, env)

    done = fairq_cli(redis_url, prefix, "stats", "-k", "--env", env.id)

    assert done.returncode == 0, done.stderr
    # Cells of each row, without the table's borders.
    lines = [[c for c in line.split() if c not in "│┃"] for line in done.stdout.splitlines()]
    emails = next(cells for cells in lines if "emails" in cells)
    assert emails[emails.index("emails") + 1 :][:3] == ["4", "5", "2"]  # queued running limit
    keys = [cells[cells.index("key") + 1] for cells in lines if "key" in cells]
    assert keys == ["tenant-a", "tenant-b", "tenant-c"]
    reports = next(cells for cells in lines if "reports" in cells)
    # queued running limit size-limit paused: pausing is a flag, not a limit of 0
    # ... servable, held (by gate): the paused queue holds its one ready run
    assert reports[reports.index("reports") + 1 :] == [
        "1", "0", "-", "-", "0", "1", "(paused", "1)", "age", "paused",
    ]  # fmt: skip
    # the emails keys are at their cap of 2: 4 ready runs held by it, none servable
    assert emails[emails.index("emails") + 1 :][3:8] == ["-", "0", "4", "(key_cap", "4)"]


def test_stats_refuses_a_watch_interval_that_is_not_positive(redis_url: str, prefix: str) -> None:
    for bad in ("0", "-1"):
        done = fairq_cli(redis_url, prefix, "stats", "--watch", bad)
        assert done.returncode == 2, done.stdout
        assert "--watch" in done.stderr and "Traceback" not in done.stderr
