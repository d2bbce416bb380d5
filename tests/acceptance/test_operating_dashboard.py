"""Operating fairq from the dashboard: find a run and read its traceback, pause and
resume, redrive all, change limits and weights, delete and cancel; every action refused
cross-site and without the token; charts of the last hour. JSON over httpx (ASGI), the
pages in Debian's Chromium."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from tests.acceptance.test_dashboard import (
    ThreadedDashboard,
    chromium,  # noqa: F401 - the fixture
    launch,
    refreshed,
)
from tests.state import run_state

from fairq import keys as K
from fairq.dashboard import app as dashboard_app
from fairq.dashboard.app import create_app
from fairq.keys import Environment
from fairq.outcomes import RunStatus
from fairq.store import RunQueue

MakeQueue = Callable[..., Any]
TRACEBACK = (
    'Traceback (most recent call last):\n  File "job.py", line 3, in run\nValueError: bad row 7\n'
)


async def failed_run(rq: RunQueue, env: Environment, run_id: str, queue: str = "imports") -> None:
    """Given a run that failed its only attempt with a traceback (as a worker nacks it)."""
    await rq.enqueue(env, queue, run_id, {"file": f"{run_id}.csv"}, concurrency_key="acme")
    (d,) = await rq.dequeue_from_queue(env, queue, keyed=True, max_count=1)
    await rq.nack(d, max_attempts=1, error="ValueError: bad row 7", traceback=TRACEBACK,
                  keep_outcome=True)  # fmt: skip


@pytest.fixture
async def http(make_queue: MakeQueue) -> AsyncIterator[tuple[RunQueue, httpx.AsyncClient]]:
    rq = await make_queue()
    app = create_app(rq, token=None, allowed_hosts=["dash"])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://dash") as client:  # fmt: skip
        yield rq, client


def act(env: Environment, action: str) -> str:
    return f"/envs/{quote(env.id, safe='')}/actions/{action}"


JSON = {"Accept": "application/json"}


async def test_actions_over_http_change_the_server_and_report(
    http: tuple[RunQueue, httpx.AsyncClient], env: Environment
) -> None:
    rq, client = http
    await rq.set_queue_concurrency(env, "imports", 3)
    await failed_run(rq, env, "f1")
    await failed_run(rq, env, "f2")
    await rq.enqueue(env, "imports", "q1", {}, concurrency_key="acme")

    paused = await client.post(act(env, "pause"), data={"queue": "imports"}, headers=JSON)
    assert paused.status_code == 200 and paused.json()["ok"] is True
    stats = await rq.queue_stats(env, "imports")
    assert (stats.paused, stats.concurrency_limit) == (True, 3)
    await client.post(act(env, "resume"), data={"queue": "imports"}, headers=JSON)
    stats = await rq.queue_stats(env, "imports")
    assert (stats.paused, stats.concurrency_limit) == (False, 3)  # the limit is kept

    limits = await client.post(act(env, "limits"), headers=JSON, data={
        "queue": "imports", "concurrency": "5", "total": "8", "order": "fair", "max_size": "",
    })  # fmt: skip
    assert limits.status_code == 200, limits.text
    stats = await rq.queue_stats(env, "imports", breakdown=True)
    assert (stats.concurrency_limit, stats.total_concurrency_limit, stats.order) == (5, 8, "fair")
    bad = await client.post(act(env, "limits"), data={"queue": "imports", "concurrency": "x"},
                            headers=JSON)  # fmt: skip
    assert bad.status_code == 400 and "not a number" in bad.json()["message"]
    assert (await rq.queue_stats(env, "imports")).concurrency_limit == 5  # nothing changed

    await client.post(act(env, "key_weight"), data={"queue": "imports", "key": "acme",
                                                      "value": "3"}, headers=JSON)  # fmt: skip
    await client.post(act(env, "key_cap"), data={"queue": "imports", "key": "acme",
                                                   "value": "2"}, headers=JSON)  # fmt: skip
    (v,) = (await rq.queue_stats(env, "imports", breakdown=True)).variants
    assert (v.weight, v.cap) == (3.0, 2)

    cancel = await client.post(act(env, "cancel"), data={"run": "q1"}, headers=JSON)
    assert cancel.status_code == 200 and await run_state(rq, env, "q1") is None
    again = await client.post(act(env, "cancel"), data={"run": "f1"}, headers=JSON)
    assert again.status_code == 409 and await run_state(rq, env, "f1") == "dlq"
    delete = await client.post(act(env, "delete"), data={"run": "f1"}, headers=JSON)
    assert delete.status_code == 200 and await run_state(rq, env, "f1") is None
    assert (await rq.get_run(env, "f1")).status is RunStatus.CANCELLED  # type: ignore[union-attr]

    # a run's JSON has its traceback; the search finds it in any environment
    run = (await client.get(f"/api/runs/{env.id}/f2")).json()
    assert run["status"] == "dead_lettered" and run["traceback"] == TRACEBACK
    found = await client.get("/runs", params={"run": "f2"})
    assert found.status_code == 303
    assert found.headers["location"] == f"/runs/{quote(env.id, safe='')}/f2"
    assert (await client.get("/runs", params={"run": "nope"})).status_code == 404

    charts = (await client.get(f"/api/queues/{env.id}/imports/charts")).json()
    assert len(charts["points"]) == 60 and charts["dead_lettered"] == 1
    assert sum(p["served"] for p in charts["points"]) == 2
    assert sum(p["dead_lettered"] for p in charts["points"]) == 2


async def dead_letter(rq: RunQueue, env: Environment, run_id: str, queue: str, at_ms: int) -> None:
    """Given a run dead-lettered at ``at_ms`` (the dead-letter list's order)."""
    await rq.enqueue(env, queue, run_id, {}, available_at_ms=at_ms, now_ms=at_ms)
    (d,) = await rq.dequeue_from_queue(env, queue, max_count=1, now_ms=at_ms)
    await rq.nack(d, max_attempts=1, error="boom", now_ms=at_ms)


async def test_redrive_all_of_one_queue_reaches_past_other_queues_dead_letters(
    http: tuple[RunQueue, httpx.AsyncClient], env: Environment, monkeypatch: Any
) -> None:
    """Given more dead letters of another queue ahead of a queue's own than one read of
    the list returns, "redrive all" of that queue still redrives every one of its own
    and none of the other queue's; then "redrive all" of every queue takes the rest."""
    rq, client = http
    monkeypatch.setattr(dashboard_app, "REDRIVE_PAGE", 3)
    for i in range(7):
        await dead_letter(rq, env, f"other{i}", "other", 1_000_000 + i)
    for i in range(2):
        await dead_letter(rq, env, f"mine{i}", "imports", 2_000_000 + i)
    mine = await client.post(act(env, "redrive_all"), data={"queue": "imports"}, headers=JSON)
    assert mine.status_code == 200 and "redriven 2 " in mine.json()["message"], mine.text
    assert [await run_state(rq, env, f"mine{i}") for i in range(2)] == ["queued"] * 2
    assert [await run_state(rq, env, f"other{i}") for i in range(7)] == ["dlq"] * 7
    rest = await client.post(act(env, "redrive_all"), data={}, headers=JSON)
    assert "redriven 7 " in rest.json()["message"], rest.text
    assert await rq.dead_letters(env) == []


async def test_tenant_weight_and_cap_actions_and_an_unknown_action(
    http: tuple[RunQueue, httpx.AsyncClient], env: Environment
) -> None:
    """A tenant's weight (environment-wide) and cap (in a queue) set, refused when not a
    number (nothing changes), and removed; an unknown action is refused by name."""
    rq, client = http
    weights = rq.keys.env(env).tenant_weights
    caps = rq.keys.queue(env, "imports").tenant_caps
    tenant = K.encode_tenant("acme")
    weight = await client.post(act(env, "tenant_weight"), headers=JSON,
                               data={"tenant": "acme", "value": "2.5"})  # fmt: skip
    assert weight.status_code == 200, weight.text
    assert float(await rq.client.hget(weights, tenant)) == 2.5  # type: ignore[misc]
    cap = await client.post(act(env, "tenant_cap"), headers=JSON,
                            data={"queue": "imports", "tenant": "acme", "value": "4"})  # fmt: skip
    assert cap.status_code == 200, cap.text
    assert int(await rq.client.hget(caps, tenant)) == 4  # type: ignore[misc]
    bad = await client.post(act(env, "tenant_weight"), headers=JSON,
                            data={"tenant": "acme", "value": "heavy"})  # fmt: skip
    assert bad.status_code == 400 and "not a number" in bad.json()["message"]
    assert float(await rq.client.hget(weights, tenant)) == 2.5  # type: ignore[misc]
    form = {"queue": "imports", "tenant": "acme", "value": "none"}
    cleared = await client.post(act(env, "tenant_cap"), headers=JSON, data=form)
    assert cleared.status_code == 200
    assert await rq.client.hget(caps, tenant) is None  # type: ignore[misc]
    unknown = await client.post(act(env, "explode"), data={"queue": "imports"}, headers=JSON)
    assert unknown.status_code == 400 and "unknown action 'explode'" in unknown.json()["message"]


async def test_actions_are_refused_cross_site_and_without_the_token(
    make_queue: MakeQueue, env: Environment
) -> None:
    rq = await make_queue()
    await rq.enqueue(env, "imports", "q1", {})
    app = create_app(rq, token="s3cret", allowed_hosts=["dash"])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://dash") as client:  # fmt: skip
        bearer = {"Authorization": "Bearer s3cret"}
        no_token = await client.post(act(env, "pause"), data={"queue": "imports"})
        cross = await client.post(act(env, "pause"), data={"queue": "imports"},
                                  headers={**bearer, "Origin": "https://evil.example"})  # fmt: skip
        assert (no_token.status_code, cross.status_code) == (401, 403)
        assert (await rq.queue_stats(env, "imports")).paused is False
        ok = await client.post(act(env, "pause"), data={"queue": "imports"}, headers=bearer)
        assert ok.status_code == 303
        assert (await rq.queue_stats(env, "imports")).paused is True


async def test_actions_are_audited_on_the_server(
    http: tuple[RunQueue, httpx.AsyncClient], env: Environment
) -> None:
    rq, client = http
    await rq.enqueue(env, "imports", "q1", {})
    await client.post(act(env, "pause"), data={"queue": "imports"}, headers=JSON)
    page = (await client.get(f"/queues/{env.id}/imports")).text
    assert 'class="audit-row"' in page and "pause" in page
    entries = await rq.audit_log(env, limit=10)
    assert [(e.action, e.target) for e in entries] == [("pause", "queue imports")]
    assert entries[0].who.startswith("dashboard ")


async def test_operating_a_fair_queue_in_the_browser(
    chromium: Path,  # noqa: F811
    make_queue: MakeQueue,
    env: Environment,
    redis_url: str,
    tmp_path: Path,
) -> None:
    """Given a fair queue set by another process (the dashboard's own default is age),
    two failed runs and a queued one."""
    from playwright.async_api import async_playwright, expect

    rq = await make_queue()
    other = await make_queue()  # another process's store: it sets the order and a weight
    await other.set_queue_options(env, "imports", order="fair", concurrency=4)
    await other.set_concurrency_key_weight(env, "imports", "acme", 2.0)
    await failed_run(rq, env, "f1")
    await failed_run(rq, env, "f2")
    await rq.enqueue(env, "imports", "waiting", {"file": "w.csv"}, concurrency_key="globex")
    queue_url = f"/queues/{quote(env.id, safe='')}/imports"

    with ThreadedDashboard(redis_url, rq.config) as dash:
        async with async_playwright() as pw:
            browser = await launch(pw, chromium, tmp_path)
            try:
                page = await browser.new_page()
                page.on("dialog", lambda dialog: dialog.accept())  # confirm every action
                await page.goto(dash.url + queue_url)
                await refreshed(page)
                # the order and the fair order's columns, set by the other process
                await expect(page.locator('#tiles [data-field="order"]')).to_have_text("fair")
                await expect(page.locator("#variants thead")).to_contain_text("Virtual tag")
                row = page.locator('#variants tr[data-key="globex"]')
                await expect(row.locator('[data-field="tag"]')).to_have_text(re.compile(r"\d"))
                # charts: three SVGs with an hour of points, the throughput drawn
                await expect(page.locator("#charts")).to_have_attribute(
                    "data-loaded", re.compile(r"\d")
                )
                await expect(page.locator("#chart-throughput")).to_have_attribute(
                    "data-points", "60"
                )
                await expect(
                    page.locator('#chart-throughput path[data-series="served"]')
                ).to_have_count(1)
                await expect(
                    page.locator('#chart-dead rect[data-series="dead_lettered"]')
                ).not_to_have_count(0)
                # a dead letter's traceback, expanded in place (and kept open across refreshes)
                tb = page.locator('#dlq details.tb[data-run="f1"]')
                await tb.locator("summary").click()
                await expect(tb.locator("pre")).to_contain_text("ValueError: bad row 7")
                await refreshed(page)

                # pause, then resume: the limit is kept
                await page.locator("#pause-button").click()
                await expect(page.locator("#flash")).to_contain_text("paused")
                await expect(page.locator('#tiles [data-field="state"]')).to_have_text("paused")
                await expect(page.locator('#tiles [data-field="concurrency_limit"]')).to_have_text(
                    "4"
                )
                await page.locator("#pause-button").click()
                await expect(page.locator('#tiles [data-field="state"]')).to_have_text("active")
                await expect(page.locator('#tiles [data-field="concurrency_limit"]')).to_have_text(
                    "4"
                )
                assert (await rq.queue_stats(env, "imports")).concurrency_limit == 4

                # search by run id: the run's page with its traceback
                await page.locator("#search-run").fill("f2")
                await page.locator("#search button").click()
                await expect(page).to_have_url(f"{dash.url}/runs/{quote(env.id, safe='')}/f2")
                await expect(page.locator("#run-status")).to_have_text("dead_lettered")
                await expect(page.locator("#run-key")).to_have_text("acme")
                await expect(page.locator("#run-payload")).to_contain_text("f2.csv")
                await expect(page.locator("#run-traceback pre")).to_contain_text(
                    'File "job.py", line 3'
                )

                # redrive all from the queue page
                await page.goto(dash.url + queue_url)
                await page.locator("#redrive-all").click()
                await expect(page.locator("#flash")).to_have_text("redriven 2 dead letter(s)")
                await expect(page.locator("#dlq-count")).to_have_text("0")
                assert [await run_state(rq, env, r) for r in ("f1", "f2")] == ["queued", "queued"]
            finally:
                await browser.close()
