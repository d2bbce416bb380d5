"""The dashboard end to end: JSON endpoints and /metrics over httpx (ASGI, same loop), the
CLI's refusal to go public without a token, and the pages in a real headless Chromium
against a live uvicorn server.

Set FAIRQ_DASHBOARD_SCREENSHOT=path to also render the README screenshot (docs/dashboard.png).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from tests.state import run_state

from fairq import metrics
from fairq.config import RunQueueConfig
from fairq.consumer import Consumer
from fairq.dashboard.app import create_app, create_server
from fairq.dashboard.security import TOKEN_COOKIE
from fairq.dashboard.shares import format_amount, format_ratio
from fairq.dashboard.views import load_queue_detail
from fairq.keys import Environment
from fairq.models import Delivery, NackOutcome, TenantShares
from fairq.server import EmbeddedServer, connect, free_port
from fairq.store import RunQueue, wall_clock_ms

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
T0 = 1_000_000  # logical clock of the scripted workloads (ms)

MakeQueue = Callable[..., Any]


# ---------------------------------------------------------------------- workloads


async def ck_workload(
    rq: RunQueue, env: Environment, queue: str = "emails", t0: int = T0
) -> list[Delivery]:
    """Given a CK queue with 16 runs over three keys and a limit of 2 per key, drained
    until every variant is at its limit: 6 running, 10 queued (clock: ``t0``)."""
    await rq.set_queue_concurrency(env, queue, 2)
    per_key = {"tenant-a": 10, "tenant-b": 4, "tenant-c": 2}
    for key, n in per_key.items():
        for i in range(n):
            await rq.enqueue(env, queue, f"{key}-{i}", {"i": i}, concurrency_key=key, now_ms=t0 + i)
    leased: list[Delivery] = []
    for _ in range(10):
        got = await rq.dequeue_from_queue(env, queue, keyed=True, max_count=10, now_ms=t0 + 100)
        if not got:
            break
        leased += got
    assert len(leased) == 6
    return leased


async def dead_letter(rq: RunQueue, env: Environment, run_id: str, queue: str = "reports") -> None:
    """Given one keyless run that failed its only attempt."""
    await rq.enqueue(env, queue, run_id, {"report": run_id}, now_ms=T0)
    (delivery,) = await rq.dequeue_from_queue(env, queue, keyed=False, max_count=1, now_ms=T0)
    outcome = await rq.nack(delivery, max_attempts=1, now_ms=T0 + 1)
    assert outcome is NackOutcome.DEAD_LETTERED


@pytest.fixture
async def client_for() -> AsyncIterator[Callable[..., httpx.AsyncClient]]:
    made: list[httpx.AsyncClient] = []

    def factory(rq: RunQueue, token: str | None = None) -> httpx.AsyncClient:
        app = create_app(rq, token=token, allowed_hosts=None if token else ["dash"])
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash")
        made.append(client)
        return client

    yield factory
    for client in made:
        await client.aclose()


def env_row(overview: dict[str, Any], env: Environment, queue: str) -> dict[str, Any]:
    (e,) = [e for e in overview["environments"] if e["env"] == env.id]
    (q,) = [q for q in e["queues"] if q["queue"] == queue]
    return q


# ---------------------------------------------------------------------- JSON and HTML


async def test_overview_counts_ck_runs_from_the_counters(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    await ck_workload(rq, env)
    await rq.pause_queue(env, "paused-one")
    await rq.enqueue(env, "paused-one", "p1", now_ms=T0)

    client = client_for(rq)
    overview = (await client.get("/api/overview")).json()

    emails = env_row(overview, env, "emails")
    assert (emails["queued"], emails["running"], emails["concurrency_limit"]) == (10, 6, 2)
    assert emails["paused"] is False
    assert emails["oldest_wait_s"] > 0
    assert env_row(overview, env, "paused-one")["paused"] is True
    html = (await client.get("/")).text
    assert 'data-queue="emails"' in html
    assert '<td class="num" data-field="queued">10</td>' in html
    assert '<td class="num" data-field="running">6</td>' in html


async def test_queue_page_lists_variants_with_virtual_tags_and_weights(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue(vtime={"enabled": True})
    await rq.set_concurrency_key_weight(env, "emails", "tenant-b", 2.0)
    await ck_workload(rq, env)

    client = client_for(rq)
    detail = (await client.get(f"/api/queues/{env.id}/emails")).json()

    assert detail["fair_order"] is True
    assert (detail["queue"]["queued"], detail["queue"]["running"]) == (10, 6)
    variants = {v["key"]: v for v in detail["variants"]}
    assert {k: (v["queued"], v["running"]) for k, v in variants.items()} == {
        "tenant-a": (8, 2),
        "tenant-b": (2, 2),
        "tenant-c": (0, 2),
    }
    assert variants["tenant-b"]["weight"] == 2.0
    assert variants["tenant-a"]["virtual_tag"] is not None
    page = await client.get(f"/queues/{env.id}/emails")
    assert page.status_code == 200
    assert "Virtual tag" in page.text and 'data-key="tenant-a"' in page.text


async def test_redrive_button_moves_a_run_out_of_the_dlq(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    await dead_letter(rq, env, "r1")
    client = client_for(rq)
    detail = (await client.get(f"/api/queues/{env.id}/reports")).json()
    assert [d["run_id"] for d in detail["dead_letters"]] == ["r1"]

    back = f"/queues/{env.id}/reports"
    reply = await client.post(f"/envs/{env.id}/dlq/r1/redrive", data={"next": back})

    assert reply.status_code == 303
    assert reply.headers["location"].startswith(back + "?flash=")
    assert await run_state(rq, env, "r1") == "queued"
    assert (await client.get(f"/api/queues/{env.id}/reports")).json()["dead_letters"] == []
    again = await client.post(
        f"/envs/{env.id}/dlq/r1/redrive", headers={"Accept": "application/json"}
    )
    assert again.status_code == 404 and again.json() == {"run_id": "r1", "redriven": False}


async def test_redrive_never_redirects_off_site(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    await dead_letter(rq, env, "r2")
    reply = await client_for(rq).post(
        f"/envs/{env.id}/dlq/r2/redrive", data={"next": "//evil.example/x"}
    )
    assert reply.headers["location"].startswith("/?flash=")


async def test_redrive_refuses_a_form_posted_by_another_site(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    await dead_letter(rq, env, "r3")
    client = client_for(rq)
    path = f"/envs/{env.id}/dlq/r3/redrive"

    refused = await client.post(path, headers={"Origin": "https://evil.example"})

    assert refused.status_code == 403
    assert await run_state(rq, env, "r3") == "dlq"
    same_site = await client.post(path, headers={"Origin": "http://dash"})
    assert same_site.status_code == 303


async def test_bad_names_are_a_clear_400(
    make_queue: MakeQueue, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    reply = await client_for(rq).get("/api/queues/not-an-env/emails")
    assert reply.status_code == 400 and "org:project:env" in reply.text


async def test_metrics_exposes_per_queue_gauges_and_dequeue_latency(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    # a consumer's dequeues are observed in fairq's registry (latency of each run leased);
    # first, as its maintenance (server clock) would reclaim the logical-clock leases below
    # (the labels the process's bounded label set gives this queue: after the first
    # MAX_LABELLED_QUEUES queues a process saw, a queue is counted under '~other')
    env_label, queue_label = metrics.queue_labels(env.id, "webhooks")
    labels = {"env": env_label, "queue": queue_label}
    count = "fairq_dequeue_latency_seconds_count"
    before = metrics.REGISTRY.get_sample_value(count, labels) or 0.0
    calls_before = metrics.REGISTRY.get_sample_value("fairq_dequeue_call_seconds_count") or 0.0
    await rq.enqueue(env, "webhooks", "w1", concurrency_key="k")
    async with Consumer(rq, env=env, queues=["webhooks"]) as consumer:
        assert [d.run_id for d in await consumer.next_batch(10, timeout=5)] == ["w1"]
    await ck_workload(rq, env)

    reply = await client_for(rq).get("/metrics")

    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = reply.text
    emails = f'env="{env.id}",queue="emails"'
    assert f"fairq_queue_queued{{{emails}}} 10.0" in text
    assert f"fairq_queue_running{{{emails}}} 6.0" in text
    assert f"fairq_queue_oldest_wait_seconds{{{emails}}}" in text
    assert f'fairq_env_dead_lettered{{env="{env.id}"}} 0.0' in text
    webhooks = f'env="{env_label}",queue="{queue_label}"'
    assert f"fairq_dequeue_latency_seconds_count{{{webhooks}}} {before + 1}" in text
    calls = metrics.REGISTRY.get_sample_value("fairq_dequeue_call_seconds_count")
    assert calls is not None and calls >= calls_before + 1
    assert "fairq_dequeue_call_seconds_count" in text
    assert "python_gc_objects_collected_total" not in text  # not the global registry


# ---------------------------------------------------------------------- served share


async def test_served_share_is_what_every_dequeue_served(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    """No worker and no record call: the dequeue scripts count what they serve, per
    tenant, in the queue's history; the chart reads that."""
    rq = await make_queue()
    now = wall_clock_ms()
    earlier = now - metrics.SERVED_BUCKET_MS
    await rq.set_queue_concurrency(env, "emails", 2)
    for key, n in {"tenant-a": 10, "tenant-b": 4, "tenant-c": 2}.items():
        for i in range(n):
            await rq.enqueue(env, "emails", f"{key}-{i}", concurrency_key=key, now_ms=earlier - 1)
    first = await rq.dequeue(2, env=env, queues=["emails"], now_ms=earlier)
    await rq.ack(first, now_ms=earlier)
    # a reference model's serve of one key is counted too
    variant = await rq.dequeue_variant(env, "emails", "tenant-c", now_ms=now)
    leased = list(variant)
    for _ in range(10):
        got = await rq.dequeue_from_queue(env, "emails", keyed=True, max_count=10, now_ms=now)
        if not got:
            break
        leased += got
    assert (len(first), len(leased)) == (2, 6)

    served = (await client_for(rq).get(f"/api/queues/{env.id}/emails")).json()["served"]

    assert served["source"] == "history"
    assert served["total"] == 8
    shares = {s["label"]: round(s["share"], 3) for s in served["series"]}
    served_per_key = Counter(d.concurrency_key for d in [*first, *leased])
    assert shares == {key: round(n / 8, 3) for key, n in served_per_key.items()}
    # by window (read at the dequeues' own clock: the wall clock may cross a window)
    detail = (await load_queue_detail(rq, env, "emails", now_ms=now)).served
    assert sum(s["counts"][-1] for s in detail["series"]) == 6
    assert sum(s["counts"][-2] for s in detail["series"]) == 2
    assert detail["windows"][-1] == now // metrics.SERVED_BUCKET_MS * metrics.SERVED_BUCKET_MS
    # the history expires by itself (kept an hour, plus a margin)
    ttl = await rq.client.ttl(rq.keys.queue(env, "emails").history(now // metrics.SERVED_BUCKET_MS))
    assert 3_600 <= ttl <= 3_900


async def test_served_share_names_tenants(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue(vtime={"enabled": True})
    now = wall_clock_ms()
    for i in range(3):
        await rq.enqueue(env, "jobs", f"a{i}", concurrency_key=f"user-{i}", tenant="acme",
                         now_ms=now - 1)  # fmt: skip
    await rq.enqueue(env, "jobs", "solo", concurrency_key="solo-key", now_ms=now - 1)
    await rq.enqueue(env, "jobs", "plain", now_ms=now - 1)
    assert len(await rq.dequeue(10, env=env, queues=["jobs"], now_ms=now)) == 5

    detail = (await load_queue_detail(rq, env, "jobs", now_ms=now)).served

    # a named tenant over its keys, a key that is its own tenant, the keyless runs
    assert {s["label"]: s["counts"][-1] for s in detail["series"]} == {
        "acme": 3, "solo-key": 1, "(no key)": 1,
    }  # fmt: skip
    assert (await client_for(rq).get(f"/api/queues/{env.id}/jobs")).json()["fair_order"] is True


# ---------------------------------------------------------------------- access token


async def test_every_request_needs_the_token_when_one_is_set(
    make_queue: MakeQueue, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    client = client_for(rq, token="s3cret")

    assert (await client.get("/api/overview")).status_code == 401
    assert (await client.get("/metrics")).status_code == 401
    assert (await client.get("/api/overview?token=wrong")).status_code == 401
    bearer = await client.get("/metrics", headers={"Authorization": "Bearer s3cret"})
    assert bearer.status_code == 200
    once = await client.get("/?token=s3cret&x=1")
    assert once.status_code == 303 and once.headers["location"] == "/?x=1"
    assert client.cookies.get(TOKEN_COOKIE) == "s3cret"
    assert (await client.get("/api/overview")).status_code == 200


def test_cli_refuses_to_bind_beyond_loopback_without_a_token() -> None:
    fairq = shutil.which("fairq") or str(Path(sys.executable).with_name("fairq"))
    environ = {k: v for k, v in os.environ.items() if k != "FAIRQ_DASHBOARD_TOKEN"}
    done = subprocess.run(
        [fairq, "dashboard", "--host", "0.0.0.0", "--port", "1"],
        capture_output=True, text=True, timeout=60, env=environ,
    )  # fmt: skip
    assert done.returncode == 2
    assert "FAIRQ_DASHBOARD_TOKEN" in done.stderr and "--token" in done.stderr


def test_cli_serves_with_a_token_and_stops_cleanly_on_ctrl_c(redis_url: str) -> None:
    fairq = shutil.which("fairq") or str(Path(sys.executable).with_name("fairq"))
    port = free_port()
    proc = subprocess.Popen(
        [fairq, "dashboard", "--url", redis_url, "--port", str(port)],
        env={**os.environ, "FAIRQ_DASHBOARD_TOKEN": "t0k"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            for _ in range(200):  # wait until it listens (not an ordering sleep)
                try:
                    refused = http.get("/metrics")
                    break
                except httpx.TransportError:
                    assert proc.poll() is None, proc.communicate()[0]
                    time.sleep(0.05)
            else:
                raise AssertionError("the dashboard did not start listening")
            assert refused.status_code == 401
            assert http.get("/metrics", headers={"Authorization": "Bearer t0k"}).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert f"http://127.0.0.1:{port}/?token=t0k" in out


# ---------------------------------------------------------------------- real browser


class ThreadedDashboard:
    """``fairq dashboard`` in a background thread with its own event loop and connection."""

    def __init__(
        self,
        redis_url: str,
        config: RunQueueConfig,
        token: str | None = None,
        **app_options: Any,
    ) -> None:
        self.redis_url, self.config, self.token = redis_url, config, token
        self.app_options = app_options
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._ready = threading.Event()
        self._server: Any = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        rq = RunQueue(await connect(self.redis_url), self.config)
        try:
            self._server = create_server(rq, port=self.port, token=self.token, **self.app_options)
            self._ready.set()
            await self._server.serve()
        finally:
            self._ready.set()
            await rq.close()

    def __enter__(self) -> ThreadedDashboard:
        self._thread.start()
        assert self._ready.wait(30), "dashboard did not start"
        for _ in range(300):
            if self._server is not None and self._server.started:
                return self
            self._thread.join(0.02)
        raise AssertionError("dashboard did not start listening")

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.should_exit = True
        self._thread.join(15)


async def refreshed(page: Any) -> None:
    """Wait for the page's first live refresh (an attribute check: the page's CSP allows
    no string evaluation, so no ``wait_for_function``)."""
    from playwright.async_api import expect

    await expect(page.locator("body")).to_have_attribute("data-refreshed", re.compile(r"^\d+$"))


@pytest.fixture
def chromium() -> Iterator[Path]:
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (/usr/bin/chromium); see .ci/run")
    yield CHROMIUM


async def test_the_page_shows_ck_counts_live_and_redrive_empties_the_dlq(
    chromium: Path,
    make_queue: MakeQueue,
    env: Environment,
    redis_url: str,
    tmp_path: Path,
) -> None:
    from playwright.async_api import async_playwright, expect

    rq = await make_queue()
    leased = await ck_workload(rq, env)
    await dead_letter(rq, env, "r1")

    with ThreadedDashboard(redis_url, rq.config) as dash:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch_persistent_context(
                str(tmp_path / "profile"),
                executable_path=str(chromium),
                args=CHROMIUM_ARGS,
                headless=True,
            )
            try:
                page = await browser.new_page()
                await page.goto(dash.url + "/")
                row = page.locator(f'section[data-env="{env.id}"] tr[data-queue="emails"]')
                # Server-rendered numbers, then the same after a live refresh.
                await expect(row.locator('[data-field="queued"]')).to_have_text("10")
                await expect(row.locator('[data-field="running"]')).to_have_text("6")
                await refreshed(page)
                await expect(row.locator('[data-field="queued"]')).to_have_text("10")

                # Live refresh: two runs finish, the page follows without a reload.
                await rq.ack(leased[:2], now_ms=T0 + 200)
                await expect(row.locator('[data-field="running"]')).to_have_text("4", timeout=8000)

                await row.locator("a").click()
                await expect(page.locator('#tiles [data-field="queued"]')).to_have_text("10")
                variant = page.locator('#variants tr[data-key="tenant-a"]')
                await expect(variant.locator('[data-field="queued"]')).to_have_text("8")

                dlq_row = page.locator('#dlq tr[data-run="r1"]')
                await expect(dlq_row).to_have_count(1)
                await dlq_row.locator("button.redrive").click()
                await expect(page.locator("#flash")).to_have_text("redriven r1")
                await expect(page.locator('#dlq tr[data-run="r1"]')).to_have_count(0)
                await expect(page.locator("#dlq-count")).to_have_text("0")
                assert await run_state(rq, env, "r1") == "queued"
            finally:
                await browser.close()


async def launch(pw: Any, chromium: Path, tmp_path: Path) -> Any:
    return await pw.chromium.launch_persistent_context(
        str(tmp_path / "profile"), executable_path=str(chromium), args=CHROMIUM_ARGS,
        headless=True,
    )  # fmt: skip


async def test_a_queue_named_like_a_path_opens_its_own_page_in_the_browser(
    chromium: Path, make_queue: MakeQueue, env: Environment, redis_url: str, tmp_path: Path
) -> None:
    """Given "a/../jobs" next to "jobs": a browser resolves an unencoded link
    /queues/<env>/a/../jobs to /queues/<env>/jobs; the dashboard's links must not."""
    from playwright.async_api import async_playwright, expect

    rq = await make_queue()
    await dead_letter(rq, env, "tricky-dead", queue="a/../jobs")
    for i in range(7):
        await rq.enqueue(env, "a/../jobs", f"tricky-{i}", now_ms=T0 + i)
    for i in range(3):
        await rq.enqueue(env, "jobs", f"plain-{i}", now_ms=T0 + i)
    encoded_env = quote(env.id, safe="")

    with ThreadedDashboard(redis_url, rq.config) as dash:
        async with async_playwright() as pw:
            browser = await launch(pw, chromium, tmp_path)
            try:
                page = await browser.new_page()
                await page.goto(dash.url + "/")
                await refreshed(page)  # the links are now the ones the live refresh built
                section = page.locator(f'section[data-env="{env.id}"]')
                await section.locator('tr[data-queue="a/../jobs"] a').click()

                await expect(page).to_have_url(f"{dash.url}/queues/{encoded_env}/a%2F..%2Fjobs")
                await expect(page.locator("header .crumbs strong")).to_have_text("a/../jobs")
                await expect(page.locator('#tiles [data-field="queued"]')).to_have_text("7")
                await refreshed(page)  # its JSON endpoint is its own too
                await expect(page.locator('#tiles [data-field="queued"]')).to_have_text("7")

                # Its redrive button comes back to its own page.
                await page.locator('#dlq tr[data-run="tricky-dead"] button.redrive').click()
                await expect(page.locator("#flash")).to_have_text("redriven tricky-dead")
                await expect(page).to_have_url(re.compile(re.escape(
                    f"{dash.url}/queues/{encoded_env}/a%2F..%2Fjobs?flash="
                )))  # fmt: skip
                await expect(page.locator('#tiles [data-field="queued"]')).to_have_text("8")

                await page.goto(dash.url + "/")
                await section.locator('tr[data-queue="jobs"] a').click()
                await expect(page).to_have_url(f"{dash.url}/queues/{encoded_env}/jobs")
                await expect(page.locator('#tiles [data-field="queued"]')).to_have_text("3")
            finally:
                await browser.close()


#: Collects the page's CSP violations (Playwright's init scripts are not subject to CSP).
CSP_PROBE = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__cspViolations.push(e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""


async def test_the_pages_work_under_their_csp_and_nothing_can_frame_them(
    chromium: Path, make_queue: MakeQueue, env: Environment, redis_url: str, tmp_path: Path
) -> None:
    from playwright.async_api import async_playwright, expect

    rq = await make_queue()
    # served within the chart's window: the chart has a legend
    await ck_workload(rq, env, t0=wall_clock_ms() - 1_000)

    with ThreadedDashboard(redis_url, rq.config) as dash:
        async with async_playwright() as pw:
            browser = await launch(pw, chromium, tmp_path)
            try:
                page = await browser.new_page()
                await page.add_init_script(CSP_PROBE)
                console: list[str] = []
                page.on("console", lambda msg: console.append(msg.text))
                await page.goto(dash.url + "/")
                await refreshed(page)
                assert await page.evaluate("() => window.__cspViolations") == []
                await page.locator('tr[data-queue="emails"] a').click()
                await refreshed(page)
                # The stylesheet applies, the legend's colours too (set via the CSSOM).
                swatch = page.locator("#legend .swatch").first
                await expect(swatch).to_have_css("background-color", "rgb(59, 111, 216)")
                await expect(page.locator(".tiles")).to_have_css("display", "grid")
                assert await page.evaluate("() => window.__cspViolations") == []
                assert not [m for m in console if "Content Security Policy" in m], console

                # Another site framing the dashboard gets nothing (frame-ancestors, DENY).
                framer = await browser.new_page()
                await framer.set_content(
                    f'<iframe id="f" src="{dash.url}/" width="600" height="400"></iframe>'
                )
                frame_host = framer.locator("#f")
                await expect(frame_host).to_have_count(1)
                inner = await (await frame_host.element_handle()).content_frame()
                assert inner is not None
                await inner.wait_for_load_state()
                assert await inner.locator("section.env, #envs").count() == 0
            finally:
                await browser.close()


@pytest.fixture
def private_server() -> Iterator[EmbeddedServer]:
    """A server of this test's own, to stop and start."""
    server = EmbeddedServer()
    server.start()
    yield server
    server.stop()


async def test_the_page_says_when_the_server_is_not_answering_and_comes_back_by_itself(
    chromium: Path, private_server: EmbeddedServer, env: Environment, tmp_path: Path
) -> None:
    from playwright.async_api import async_playwright, expect

    rq = RunQueue(await connect(private_server.url))
    try:
        await rq.enqueue(env, "emails", "e1", now_ms=T0)
        queue_url = f"/queues/{quote(env.id, safe='')}/emails"
        not_answering = f"fairq server at {private_server.url} is not answering; retrying"
        dash = ThreadedDashboard(
            private_server.url, rq.config, server_url=private_server.url, retry_after_s=1
        )
        with dash:
            async with async_playwright() as pw:
                browser = await launch(pw, chromium, tmp_path)
                try:
                    page = await browser.new_page()
                    await page.goto(dash.url + queue_url)
                    await expect(page.locator('#tiles [data-field="queued"]')).to_have_text("1")

                    private_server.stop()
                    # The open page says so at its next refresh...
                    await expect(page.locator("#live-text")).to_contain_text(
                        not_answering, timeout=8000
                    )
                    await expect(page.locator("#live")).to_have_class(re.compile("stale"))
                    # ...and a page opened now is the friendly 503, not a traceback.
                    reply = await page.reload()
                    assert reply is not None and reply.status == 503
                    message = page.locator("#unavailable-message")
                    await expect(message).to_contain_text(not_answering)

                    private_server.start()  # same port, empty
                    # The 503 page reloads itself into the queue page.
                    await expect(page.locator('#tiles [data-field="queued"]')).to_have_text(
                        "0", timeout=8000
                    )
                    await refreshed(page)
                    await expect(page.locator("#live-text")).to_contain_text("live")
                finally:
                    await browser.close()
    finally:
        await rq.close()


# ---------------------------------------------------------------------- README screenshot

#: Light tenants of the screenshot workload: (first arrival step, runs per step, last step).
LIGHT_TENANTS = {
    "globex": (10, 2, 150),
    "initech": (25, 1, 150),
    "umbrella": (40, 1, 120),
    "hooli": (55, 2, 150),
    "stark": (70, 1, 150),
}


async def realistic_workload(rq: RunQueue, env: Environment, now: int) -> None:
    """Five simulated minutes (2 s steps) of a multi-tenant video queue in fair order: one
    tenant with a big backlog, light tenants arriving over time (every dequeue counts
    what it serves), runs taking 6-8 s."""
    queue = "video/encode"
    await rq.set_env_limits(env, concurrency=40)
    await rq.set_queue_concurrency(env, queue, 4)
    await rq.set_queue_size_limit(env, queue, 5000)
    await rq.set_concurrency_key_weight(env, queue, "hooli", 2.0)
    start = now - 300_000
    for i in range(600):
        await rq.enqueue(env, queue, f"acme-{i}", {"clip": i}, concurrency_key="acme",
                         now_ms=start + i)  # fmt: skip
    running: list[tuple[int, Delivery]] = []
    for step, t in enumerate(range(start, now, 2_000)):
        for key, (first, per_step, last) in LIGHT_TENANTS.items():
            for j in range(per_step if first <= step <= last else 0):
                await rq.enqueue(env, queue, f"{key}-{step}-{j}", {"clip": step},
                                 concurrency_key=key, now_ms=t)  # fmt: skip
        done = [d for finish, d in running if finish <= t]
        running = [(finish, d) for finish, d in running if finish > t]
        if done:
            await rq.ack(done, now_ms=t)
        await rq.sample_shares(now_ms=t)  # as maintenance does, about once a second
        got = await rq.dequeue_from_queue(env, queue, keyed=True, max_count=8, now_ms=t)
        running += [(t + 6_000 + 500 * (i % 5), d) for i, d in enumerate(got)]
    for i in range(120):
        await rq.enqueue(env, "emails/send", f"mail-{i}", {"to": i}, now_ms=now - 20_000 + i)
    got = await rq.dequeue_from_queue(env, "emails/send", keyed=False, max_count=12, now_ms=now)
    await rq.pause_queue(env, "reports/monthly")
    for i in range(8):
        await rq.enqueue(env, "reports/monthly", f"report-{i}", now_ms=now - 90_000)
    for i, key in enumerate(("globex", "initech", "stark")):
        await rq.enqueue(env, "webhooks", f"hook-{key}-{i}", {"url": f"https://{key}.example/cb"},
                         concurrency_key=key, now_ms=now - 50_000)  # fmt: skip
        (d,) = await rq.dequeue_from_queue(env, "webhooks", keyed=True, max_count=1, now_ms=now)
        error = f"HTTPError: 503 from https://{key}.example/cb"
        trace = ("Traceback (most recent call last):\n  File \"hooks.py\", line 12, in deliver\n"
                 f"    response.raise_for_status()\n{error}\n")  # fmt: skip
        await rq.nack(d, max_attempts=1, error=error, traceback=trace,
                      now_ms=now - 40_000 + i * 7_000)  # fmt: skip
    staging = Environment("acme", "media", "staging")
    for i in range(14):
        await rq.enqueue(staging, "video/encode", f"s-{i}", concurrency_key=f"qa-{i % 3}",
                         now_ms=now - 5_000)  # fmt: skip
    await rq.dequeue_from_queue(staging, "video/encode", keyed=True, max_count=3, now_ms=now)


async def expect_shares_panel(page: Any, rq: RunQueue, env: Environment, queue: str) -> None:
    """The received-vs-entitled panel shows the store's 5-minute numbers, one row and one
    bar pair per tenant, most received first. The window slides with the server's clock
    (a 10-s bucket may leave it between the page's read and the store's): the page
    refreshes every 1.5 s, so a second read of the store meets the page again."""
    for attempt in range(3):
        try:
            await _expect_shares(page, await rq.tenant_shares(env, queue))
            return
        except AssertionError:
            if attempt == 2:
                raise


async def _expect_shares(page: Any, five: TenantShares) -> None:
    from playwright.async_api import expect

    rows = page.locator("#shares tbody tr[data-tenant]")
    await expect(rows).to_have_count(len(five.tenants))
    labels = await rows.evaluate_all("rows => rows.map(r => r.dataset.tenant)")
    assert labels == [t.tenant for t in five.tenants]
    first = five.tenants[0]
    cells = rows.first.locator("td")
    await expect(cells.nth(1)).to_have_text(format_amount(first.received))
    await expect(cells.nth(2)).to_have_text(format_amount(first.entitled))
    await expect(cells.nth(4)).to_have_text(format_ratio(first.ratio))
    chart = page.locator("#chart-shares")
    await expect(chart).to_have_attribute("data-rows", str(len(five.tenants)))
    await expect(chart.locator("rect.key0")).to_have_count(len(five.tenants))
    await expect(chart.locator("rect.key1")).to_have_count(len(five.tenants))


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG file (from its IHDR chunk)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


async def test_render_the_readme_screenshot(
    chromium: Path, make_queue: MakeQueue, redis_url: str, tmp_path: Path
) -> None:
    """The README's screenshot shows the workload: the queue's counts as the store reads
    them, every tenant's variant (hooli at weight 2), the served share of each tenant and
    what each received vs was entitled to (the store's numbers, and a bar pair each).
    Written to FAIRQ_DASHBOARD_SCREENSHOT when set (docs/dashboard.png), else to a
    scratch file."""
    from playwright.async_api import async_playwright, expect

    rq = await make_queue(vtime={"enabled": True})
    env = Environment("acme", "media", "prod")
    await realistic_workload(rq, env, wall_clock_ms())
    stats = await rq.queue_stats(env, "video/encode")
    tenants = ["acme", *LIGHT_TENANTS]
    target = Path(os.environ.get("FAIRQ_DASHBOARD_SCREENSHOT") or tmp_path / "dashboard.png")
    with ThreadedDashboard(redis_url, rq.config) as dash:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch_persistent_context(
                str(tmp_path / "profile"), executable_path=str(chromium), args=CHROMIUM_ARGS,
                headless=True, viewport={"width": 1280, "height": 760}, device_scale_factor=1,
            )  # fmt: skip
            try:
                page = await browser.new_page()
                await page.goto(f"{dash.url}/queues/{env.id}/video/encode")
                await refreshed(page)
                tiles = page.locator("#tiles")
                await expect(tiles.locator('[data-field="queued"]')).to_have_text(str(stats.queued))
                await expect(tiles.locator('[data-field="running"]')).to_have_text(
                    str(stats.running)
                )
                await expect(tiles.locator('[data-field="order"]')).to_have_text("fair")
                # umbrella's last runs came at step 120 of 150 and were served at once
                # (the fair order): every other tenant still has runs
                variants = page.locator("#variants tbody tr")
                assert sorted(await variants.evaluate_all(
                    "rows => rows.map(r => r.dataset.key)"
                )) == sorted(set(tenants) - {"umbrella"})  # fmt: skip
                hooli = page.locator('#variants tr[data-key="hooli"] [data-field="weight"]')
                await expect(hooli).to_have_text("2")
                legend = page.locator("#legend .lk")
                await expect(legend).to_have_count(len(tenants))
                assert sorted(await legend.all_inner_texts()) == sorted(tenants)
                await expect_shares_panel(page, rq, env, "video/encode")
                await page.screenshot(path=str(target), full_page=True)
            finally:
                await browser.close()
    width, height = png_size(target)
    assert width == 1280 and height >= 760, (width, height)


async def test_a_token_less_dashboard_answers_loopback_host_names_only(make_queue: Any) -> None:
    """DNS rebinding: a page on another site must not read a loopback dashboard."""
    rq = await make_queue()
    app = create_app(rq, token=None)
    for host, expected in (("127.0.0.1:8765", 200), ("localhost", 200), ("evil.example", 400)):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=f"http://{host}"
        ) as client:
            assert (await client.get("/api/overview")).status_code == expected, host
