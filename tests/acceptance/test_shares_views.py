"""Shares received vs entitled, end to end: ``fairq stats --tenants``, the queue page's
JSON and ``/metrics`` show the same numbers as RunQueue.tenant_shares (the CLI through
the real entry point, the app through httpx).

The workload runs on a logical clock placed 80 to 20 seconds before the server's clock,
so the 5- and 15-minute windows hold all of it whenever each reader reads."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx
from tests.acceptance.test_stats_views import fairq_cli

from fairq.dashboard.app import create_app
from fairq.keys import Environment
from fairq.models import EnqueueRequest
from fairq.store import RunQueue

MakeQueue = Callable[..., Any]
Q = "jobs"
WEIGHTS = {"a": 1.0, "b": 2.0, "c": 4.0}


async def weighted_workload(rq: RunQueue, env: Environment) -> None:
    """60 one-second steps, 7 slots, tenants a, b, c at weights 1, 2, 4, all backlogged:
    each step acks the last step's runs, samples, and leases 7 more."""
    await rq.set_env_limits(env, concurrency=7)
    for tenant, w in WEIGHTS.items():
        await rq.set_tenant_weight(env, tenant, w)
    start = await rq.server_time_ms() - 80_000
    requests = [
        EnqueueRequest(env, Q, f"{t}-{i}", None, tenant=t, available_at_ms=start + i)
        for t in WEIGHTS for i in range(300)
    ]  # fmt: skip
    await rq.enqueue_many(requests, now_ms=start + 300)
    running: list[Any] = []
    for step in range(60):
        now = start + 1_000 + step * 1_000
        if running:
            await rq.ack(running, now_ms=now)
        await rq.sample_shares(now_ms=now)
        running = await rq.dequeue(7, env=env, queues=[Q], now_ms=now)


def app_client(rq: RunQueue) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(rq, token=None, allowed_hosts=["dash"])),
        base_url="http://dash",
    )


def settled(panel: dict[str, Any]) -> list[tuple[str, list[float], list[float]]]:
    """The rows' 5- and 15-minute numbers (the 1-minute one moves with the clock)."""
    return [(r["label"], r["received"][1:], r["entitled"][1:]) for r in panel["rows"]]


async def test_stats_tenants_the_queue_page_and_the_store_agree(
    make_queue: MakeQueue, env: Environment, redis_url: str, prefix: str
) -> None:
    rq = await make_queue(vtime={"enabled": True})
    await weighted_workload(rq, env)
    five = await rq.tenant_shares(env, Q, window=300)
    rows = {t.tenant: t for t in five.tenants}
    assert five.received == 7 * 59 and five.samples == 60
    # entitled 1:2:4, and the fair order gave about that
    for tenant, w in WEIGHTS.items():
        assert abs(rows[tenant].entitled - five.received * w / 7) < 1e-6
        assert 0.9 < (rows[tenant].ratio or 0) < 1.1

    done = fairq_cli(redis_url, prefix, "stats", "--tenants", "--env", env.id, "--json")
    assert done.returncode == 0, done.stderr
    from_cli = json.loads(done.stdout)
    assert from_cli["env"] == env.id and list(from_cli["queues"]) == [Q]
    cli_panel = from_cli["queues"][Q]
    async with app_client(rq) as client:
        page_panel = (await client.get(f"/api/queues/{env.id}/{Q}")).json()["shares"]
        html = (await client.get(f"/queues/{env.id}/{Q}")).text
    assert settled(cli_panel) == settled(page_panel)
    assert [r["label"] for r in cli_panel["rows"]] == ["c", "b", "a"]
    for label, received, entitled in settled(cli_panel):
        assert received[0] == rows[label].received
        assert abs(entitled[0] - rows[label].entitled) < 1e-6
    assert cli_panel["unit"] == "runs" and cli_panel["samples"][1] == 60
    # the page renders the rows on the server too (before its script runs)
    assert 'id="chart-shares"' in html
    assert re.findall(r'<tr data-tenant="([^"]+)">', html) == ["c", "b", "a"]

    table = fairq_cli(redis_url, prefix, "stats", "--tenants", "--env", env.id, "--queue", Q)
    assert table.returncode == 0, table.stderr
    lines = [line for line in table.stdout.splitlines() if re.search(r"│ [abc] ", line)]
    assert [line.split("│")[1].strip() for line in lines] == ["c", "b", "a"]
    c_line = [cell.strip() for cell in lines[0].split("│")[1:-1]]
    assert c_line[1] == str(int(rows["c"].received)) and c_line[2] == f"{rows['c'].entitled:.1f}"
    assert c_line[4] == f"{rows['c'].ratio:.2f}"


async def test_metrics_show_received_entitled_and_their_ratio(
    make_queue: MakeQueue, env: Environment
) -> None:
    rq = await make_queue(vtime={"enabled": True})
    await weighted_workload(rq, env)
    five = {t.tenant: t for t in (await rq.tenant_shares(env, Q, window=300)).tenants}
    async with app_client(rq) as client:
        text = (await client.get("/metrics")).text
    for tenant, share in five.items():
        labels = f'env="{env.id}",queue="{Q}",tenant="{tenant}",unit="runs"'
        got = re.search(rf"^fairq_tenant_received\{{{labels}\}} (\S+)$", text, re.MULTILINE)
        owed = re.search(rf"^fairq_tenant_entitled\{{{labels}\}} (\S+)$", text, re.MULTILINE)
        ratio = re.search(rf"^fairq_tenant_share_ratio\{{{labels}\}} (\S+)$", text, re.MULTILINE)
        assert got and owed and ratio, tenant
        assert float(got.group(1)) == share.received
        assert abs(float(owed.group(1)) - share.entitled) < 1e-6
        assert abs(float(ratio.group(1)) - (share.ratio or 0)) < 1e-6


def test_stats_tenants_needs_an_environment(redis_url: str, prefix: str) -> None:
    done = fairq_cli(redis_url, prefix, "stats", "--tenants")
    assert done.returncode == 2 and "--tenants needs --env" in done.stderr
    done = fairq_cli(redis_url, prefix, "stats", "--queue", "jobs")
    assert done.returncode == 2 and "--queue goes with --tenants" in done.stderr
