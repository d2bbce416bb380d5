"""A run's place from its handle (``handle.position()``) and from ``fairq runs show``, and
the autoscaling figures in ``fairq stats --json`` and ``/metrics``, end to end on the
server's clock."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fairq.app import Fairq
from fairq.config import RunQueueConfig
from fairq.dashboard.app import create_app
from fairq.dashboard.prometheus import metrics_text
from fairq.keys import Environment
from fairq.outcomes import RunStatus


@pytest.fixture
async def app(redis_url: str, prefix: str, env: Environment) -> AsyncIterator[Fairq]:
    application = Fairq(env, url=redis_url, config=RunQueueConfig(prefix=prefix))
    yield application
    await application.aclose()


@pytest.fixture
def cli(redis_url: str, prefix: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        environ = {**os.environ, "FAIRQ_REDIS_URL": redis_url, "FAIRQ_PREFIX": prefix,
                   "COLUMNS": "200"}  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "fairq", *args], env=environ,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr + done.stdout
        return done

    return run


async def test_handle_and_cli_show_where_a_run_stands(
    app: Fairq, env: Environment, cli: Callable[..., Any]
) -> None:
    @app.task(queue="jobs")
    async def job(payload: int) -> int:
        return payload

    rq = await app.queue()
    await rq.set_key_concurrency(env, "jobs", "k", 1)
    handles = [await job.trigger(i, concurrency_key="k") for i in range(3)]
    (first,) = await rq.dequeue(1, env=env, queues=["jobs"])
    assert first.run_id == handles[0].run_id

    running = await handles[0].position()
    assert running is not None and running.status is RunStatus.RUNNING
    last = await handles[2].position()
    assert last is not None and last.status is RunStatus.QUEUED
    assert (last.ahead_in_flow, last.flow_queued, last.rank) == (1, 2, 1)
    assert [g.name for g in last.gates] == ["key_cap"]
    assert last.estimate is not None and last.estimate.runs_before == 1

    shown = json.loads(cli("runs", "show", env.id, handles[2].run_id, "--json").stdout)
    position = shown["position"]
    assert (position["ahead_in_flow"], position["rank"]) == (1, 1)
    assert [g["gate"] for g in position["gates"]] == ["key_cap"]
    assert position["estimated_start"]["estimate"] is True
    text = cli("runs", "show", env.id, handles[2].run_id).stdout
    assert "1 of 2 queued in its flow" in text and "key's concurrency cap (1/1" in text
    assert "estimate:" in text

    await job.trigger(9, delay=600)  # keyless, due in 10 minutes
    data = json.loads(cli("stats", "--env", env.id, "--json").stdout)
    (queue,) = data[0]["queues"]
    assert queue["backlog"] == {
        "servable": 0, "held": 2, "held_by": {**dict.fromkeys(queue["backlog"]["held_by"], 0),
                                              "key_cap": 2},
        "delayed": 1, "running": 1,
    }  # fmt: skip
    table = cli("stats", "--env", env.id).stdout
    header = next(line for line in table.splitlines() if "Servable" in line)
    row = next(line for line in table.splitlines() if " jobs " in line)
    cells = dict(zip(
        [c.strip() for c in re.split("[┃│]", header)], [c.strip() for c in row.split("│")],
        strict=True,
    ))  # fmt: skip
    assert (cells["Servable"], cells["Held"], cells["Delayed"]) == ("0", "2 (key_cap 2)", "1")

    metrics = (await metrics_text(rq)).decode()
    labels = f'env="{env.id}",queue="jobs"'
    assert f"fairq_queue_backlog_servable{{{labels}}} 0.0" in metrics
    held = f'fairq_queue_backlog_held{{env="{env.id}",gate="key_cap",queue="jobs"}} 2.0'
    assert held in metrics
    assert f"fairq_queue_backlog_delayed{{{labels}}} 1.0" in metrics
    assert f'fairq_env_backlog_servable{{env="{env.id}"}} 0.0' in metrics


KEDA = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "keda.yaml"


def keda_value(metrics: str, env_id: str) -> float:
    """The KEDA example's query evaluated on a scrape (its form: sums of one metric of one
    environment, added), for ``env_id`` instead of the example's environment."""
    (trigger,) = yaml.safe_load(KEDA.read_text())["spec"]["triggers"]
    query = " ".join(trigger["metadata"]["query"].split())
    term = r'sum\((fairq_[a-z_]+)\{env="[^"]+"\}\)'
    assert re.fullmatch(rf"{term}( \+ {term})*", query), query
    samples = [s for family in text_string_to_metric_families(metrics) for s in family.samples]
    return sum(
        s.value
        for name in re.findall(term, query)
        for s in samples
        if s.name == name and s.labels.get("env") == env_id
    )


async def test_the_keda_query_follows_what_more_workers_could_start(
    app: Fairq, env: Environment
) -> None:
    """A key capped at 1 with its backlog, and 5 keyless runs: the query asks for the one
    run in flight and the 5 servable ones; 20 more runs of the capped key change nothing;
    a paused queue asks for the run in flight only."""
    rq = await app.queue()
    await rq.set_key_concurrency(env, "jobs", "k", 1)
    for i in range(10):
        await rq.enqueue(env, "jobs", f"k{i}", None, concurrency_key="k", available_at_ms=1 + i)
    for i in range(5):
        await rq.enqueue(env, "jobs", f"n{i}", None, available_at_ms=100 + i)
    (started,) = await rq.dequeue(1, env=env, queues=["jobs"])
    assert started.run_id == "k0"
    assert keda_value((await metrics_text(rq)).decode(), env.id) == 1 + 5
    for i in range(20):
        await rq.enqueue(env, "jobs", f"more{i}", None, concurrency_key="k")
    assert keda_value((await metrics_text(rq)).decode(), env.id) == 1 + 5
    await rq.pause_queue(env, "jobs")
    assert keda_value((await metrics_text(rq)).decode(), env.id) == 1


async def test_the_dashboard_shows_where_a_queued_run_stands(
    make_queue: Callable[..., Any], env: Environment
) -> None:
    rq = await make_queue()
    app = create_app(rq, token=None, allowed_hosts=["dash"])
    await rq.set_key_concurrency(env, "jobs", "k", 1)
    for i in range(3):
        await rq.enqueue(env, "jobs", f"r{i}", None, concurrency_key="k", available_at_ms=1 + i)
    (started,) = await rq.dequeue(1, env=env, queues=["jobs"])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://dash") as client:  # fmt: skip
        run = (await client.get(f"/api/runs/{env.id}/r2")).json()
        assert (run["position"]["ahead_in_flow"], run["position"]["rank"]) == (1, 1)
        assert [g["text"] for g in run["position"]["gates"]] == [
            "its key's concurrency cap (1/1 in flight)"
        ]
        page = (await client.get(f"/runs/{quote(env.id, safe='')}/r2")).text
        assert 'id="run-position"' in page and "1 of 2 queued" in page
        assert "its key&#39;s concurrency cap (1/1 in flight)" in page
        running = (await client.get(f"/api/runs/{env.id}/{started.run_id}")).json()
        assert running["status"] == "running" and running["position"] is None
        assert 'id="run-position"' not in (await client.get(f"/runs/{env.id}/r0")).text
