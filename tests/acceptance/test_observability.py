"""Observability of a worker: Prometheus metrics from the worker process, JSON log lines,
and OpenTelemetry spans (recorded with the SDK's in-memory exporter)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fairq import telemetry
from fairq.app import Fairq
from fairq.config import RetryPolicy, RunQueueConfig
from fairq.keys import Environment
from fairq.outcomes import RunStatus
from fairq.server import free_port
from fairq.worker import Worker

APP_MODULE = """
import os
from fairq import Fairq, RetryPolicy

app = Fairq(os.environ["TEST_ENV"])


@app.task(queue="obs", retry=RetryPolicy(max_attempts=2, min_delay_ms=1, max_delay_ms=1,
                                         randomize=False))
async def obs(payload):
    if payload.get("fail"):
        raise ValueError("boom " + str(payload["n"]))
    return payload["n"]
"""


def start_worker(tmp_path: Path, redis_url: str, prefix: str, env: Environment,
                 *args: str) -> subprocess.Popen[str]:  # fmt: skip
    (tmp_path / "obsapp.py").write_text(APP_MODULE)
    environ = {**os.environ, "FAIRQ_REDIS_URL": redis_url, "FAIRQ_PREFIX": prefix,
               "TEST_ENV": env.id}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "fairq", "worker", "obsapp:app", *args],
        cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_a_workers_metrics_and_json_logs_after_a_drain(
    tmp_path: Path, redis_url: str, prefix: str, env: Environment
) -> None:
    port = free_port()
    proc = start_worker(tmp_path, redis_url, prefix, env, "--metrics-port", str(port),
                        "--log-format", "json", "--concurrency", "4")  # fmt: skip
    client = Fairq(env, url=redis_url, config=RunQueueConfig(prefix=prefix))
    obs = client.task(queue="obs")(lambda payload: None)
    try:
        ok = [await obs.trigger({"n": n}) for n in range(5)]
        bad = await obs.trigger({"n": 99, "fail": True})
        assert [await h.wait(timeout=20) for h in ok] == [0, 1, 2, 3, 4]
        deadline = time.monotonic() + 20
        while (info := await bad.info()) is None or info.status is not RunStatus.DEAD_LETTERED:
            assert time.monotonic() < deadline, info
            await asyncio.sleep(0.05)
        labels = (("env", env.id), ("queue", "obs"))
        async with httpx.AsyncClient(timeout=5) as http:
            # the counters are bumped when a run ends, just before its ack: a deadline
            while True:
                text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
                got = samples(text)
                dead = ("fairq_runs_finished_total", tuple(sorted(
                    (*labels, ("outcome", "dead_lettered"))
                )))  # fmt: skip
                if got.get(dead) == 1.0 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(proc.communicate, timeout=20)
        await client.aclose()
    assert proc.returncode == 0, stderr
    assert got[("fairq_runs_started_total", labels)] == 7.0  # 5 + 2 attempts of the bad one
    finished = {
        dict(k[1])["outcome"]: v
        for k, v in got.items()
        if k[0] == "fairq_runs_finished_total" and dict(k[1])["queue"] == "obs"
    }
    assert finished == {"completed": 5.0, "retried": 1.0, "dead_lettered": 1.0}
    assert got[("fairq_run_duration_seconds_count", labels)] == 7.0
    assert got[("fairq_dequeue_latency_seconds_count", labels)] >= 7.0
    inf = tuple(sorted((*labels, ("le", "+Inf"))))
    assert got[("fairq_run_duration_seconds_bucket", inf)] == 7.0

    # every line on stderr is one JSON object; each attempt has its run line
    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert all({"ts", "level", "logger", "message"} <= set(d) for d in lines)
    runs = [d for d in lines if d["logger"] == "fairq.run"]
    assert sorted(d["outcome"] for d in runs) == ["completed"] * 5 + ["dead_lettered", "retried"]
    failed = next(d for d in runs if d["outcome"] == "dead_lettered")
    assert failed["run_id"] == bad.run_id and failed["queue"] == "obs"
    assert failed["attempt"] == 2 and failed["error"] == "ValueError: boom 99"
    assert any("fairq worker stopped: 5 completed" in d["message"] for d in lines)


# ---------------------------------------------------------------------- tracing


@pytest.fixture
def spans() -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_tracer_provider(provider)
    yield exporter
    telemetry.use_tracer_provider(None)
    provider.shutdown()


@pytest.fixture
async def traced_app(redis_url: str, prefix: str, env: Environment) -> AsyncIterator[Fairq]:
    app = Fairq(env, url=redis_url, config=RunQueueConfig(prefix=prefix))
    yield app
    await app.aclose()


async def test_a_span_per_trigger_and_per_run_attempt(
    spans: Any, traced_app: Fairq, env: Environment
) -> None:
    seen_inside: list[str] = []

    @traced_app.task(
        queue="traced",
        retry=RetryPolicy(max_attempts=2, min_delay_ms=1, max_delay_ms=1, randomize=False),
    )
    async def traced(payload: dict[str, Any]) -> int:
        from opentelemetry import trace

        seen_inside.append(format(trace.get_current_span().get_span_context().span_id, "016x"))
        if payload["n"] == 1 and len(seen_inside) == 1:
            raise ValueError("first attempt fails")
        return int(payload["n"])

    handle = await traced.trigger({"n": 1}, concurrency_key="k1", tenant="acme")
    worker = Worker(traced_app, concurrency=2)
    task = asyncio.create_task(worker.run())
    try:
        assert await handle.wait(timeout=15) == 1
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)

    finished = spans.get_finished_spans()
    (trigger,) = [s for s in finished if s.name == "fairq trigger traced"]
    runs = sorted((s for s in finished if s.name == "fairq run traced"),
                  key=lambda s: s.attributes["fairq.attempt"])  # fmt: skip
    assert trigger.kind.name == "PRODUCER"
    assert dict(trigger.attributes) | {} == {
        "messaging.system": "fairq", "fairq.env": env.id, "fairq.queue": "traced",
        "fairq.run_id": handle.run_id, "fairq.concurrency_key": "k1", "fairq.tenant": "acme",
    }  # fmt: skip
    assert [s.attributes["fairq.attempt"] for s in runs] == [1, 2]
    assert [s.attributes["fairq.outcome"] for s in runs] == ["retried", "completed"]
    assert all(s.kind.name == "CONSUMER" and s.attributes["fairq.tenant"] == "acme" for s in runs)
    assert runs[0].status.status_code.name == "ERROR"
    assert [e.name for e in runs[0].events] == ["exception"]
    # the run's span is current while the task runs (its own spans are children)
    assert seen_inside == [format(s.context.span_id, "016x") for s in runs]


async def test_the_run_span_links_to_its_trigger_span(
    spans: Any, traced_app: Fairq, env: Environment
) -> None:
    @traced_app.task(queue="linked")
    async def linked(payload: int) -> int:
        return payload

    handle = await linked.trigger(5)
    worker = Worker(traced_app, concurrency=1)
    task = asyncio.create_task(worker.run())
    try:
        assert await handle.wait(timeout=15) == 5
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    finished = spans.get_finished_spans()
    (trigger,) = [s for s in finished if s.name == "fairq trigger linked"]
    (run,) = [s for s in finished if s.name == "fairq run linked"]
    assert [link.context.span_id for link in run.links] == [trigger.context.span_id]
    assert run.links[0].context.trace_id == trigger.context.trace_id
