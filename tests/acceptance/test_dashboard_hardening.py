"""The dashboard's hardening over HTTP (httpx on the ASGI app, same loop as the queue):
security headers on every kind of response, cross-site POSTs refused, the body cap, names
that look like paths, and the 503 answers while the server is unreachable."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest
from starlette.types import Message
from tests.state import run_state

from fairq.dashboard.app import create_app
from fairq.dashboard.security import MAX_BODY_BYTES, TOKEN_COOKIE
from fairq.keys import Environment
from fairq.models import NackOutcome
from fairq.server import EmbeddedServer, connect, free_port
from fairq.store import RunQueue

T0 = 1_000_000
MakeQueue = Callable[..., Any]
HOST = "dash"


async def dead_letter(rq: RunQueue, env: Environment, run_id: str, queue: str = "reports") -> None:
    """Given one keyless run that failed its only attempt."""
    await rq.enqueue(env, queue, run_id, {"report": run_id}, now_ms=T0)
    (delivery,) = await rq.dequeue_from_queue(env, queue, keyed=False, max_count=1, now_ms=T0)
    assert await rq.nack(delivery, max_attempts=1, now_ms=T0 + 1) is NackOutcome.DEAD_LETTERED


@pytest.fixture
async def client_for() -> AsyncIterator[Callable[..., httpx.AsyncClient]]:
    made: list[httpx.AsyncClient] = []

    def factory(rq: RunQueue, token: str | None = None, **options: Any) -> httpx.AsyncClient:
        app = create_app(rq, token=token, allowed_hosts=[HOST], **options)
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=f"http://{HOST}"
        )
        made.append(client)
        return client

    yield factory
    for client in made:
        await client.aclose()


def e(env: Environment) -> str:
    return quote(env.id, safe="")


def assert_security_headers(reply: httpx.Response) -> None:
    what = f"{reply.request.method} {reply.request.url} -> {reply.status_code}"
    assert reply.headers.get("x-frame-options") == "DENY", what
    assert reply.headers.get("x-content-type-options") == "nosniff", what
    assert reply.headers.get("referrer-policy") == "same-origin", what
    csp = reply.headers.get("content-security-policy", "")
    directives = {d.split()[0]: d.split()[1:] for d in csp.split(";") if d.strip()}
    assert directives.get("frame-ancestors") == ["'none'"], what
    assert directives.get("default-src") == ["'self'"], what
    assert directives.get("script-src") == ["'self'"], what  # no inline script, no CDN
    assert directives.get("style-src") == ["'self'"], what
    assert "unsafe" not in csp and "http" not in csp, what


# ---------------------------------------------------------------------- headers


async def test_every_kind_of_response_carries_the_security_headers(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    await dead_letter(rq, env, "r1")
    client = client_for(rq)
    expected = {
        "/": (200, "text/html"),
        "/api/overview": (200, "application/json"),
        f"/queues/{e(env)}/reports": (200, "text/html"),
        f"/api/queues/{e(env)}/reports": (200, "application/json"),
        "/static/dashboard.js": (200, "javascript"),
        "/static/style.css": (200, "text/css"),
        "/metrics": (200, "text/plain"),
        "/no/such/page": (404, "text/plain"),
        "/api/queues/not-an-env/reports": (400, "text/plain"),
    }
    for path, (status, content_type) in expected.items():
        reply = await client.get(path)
        assert reply.status_code == status, path
        assert content_type in reply.headers["content-type"], path
        assert_security_headers(reply)
    # Refusals too: cross-site, oversized, unknown host, missing token.
    refused = await client.post(
        f"/envs/{e(env)}/dlq/r1/redrive", headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert refused.status_code == 403
    assert_security_headers(refused)
    too_big = await client.post(f"/envs/{e(env)}/dlq/r1/redrive", content=b"x" * 70_000)
    assert too_big.status_code == 413
    assert_security_headers(too_big)
    other_host = await client.get("/", headers={"Host": "evil.example"})
    assert other_host.status_code == 400
    assert_security_headers(other_host)
    locked = await client_for(rq, token="s3cret").get("/api/overview")
    assert locked.status_code == 401
    assert_security_headers(locked)
    assert await run_state(rq, env, "r1") == "dlq"


# ---------------------------------------------------------------------- cross-site POST


async def test_a_cross_site_post_is_refused_and_changes_nothing(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    await dead_letter(rq, env, "r1")
    client = client_for(rq)
    path = f"/envs/{e(env)}/dlq/r1/redrive"
    form = {"next": f"/queues/{e(env)}/reports"}

    for headers in (
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # a sibling subdomain is another origin
        {"Sec-Fetch-Site": "cross-site", "Origin": f"http://{HOST}"},
        {"Origin": "https://evil.example"},
        {"Origin": "null"},  # a sandboxed frame or a data: page
        {"Origin": f"http://{HOST}:9999"},  # same name, another port
        {"Sec-Fetch-Site": "same-origin", "Origin": "https://evil.example"},
    ):
        refused = await client.post(path, data=form, headers=headers)
        assert refused.status_code == 403, headers
        assert "cross-site request refused" in refused.text, headers
        assert await run_state(rq, env, "r1") == "dlq", headers
        assert [d.run_id for d in await rq.dead_letters(env)] == ["r1"], headers

    # The dashboard's own form (same origin), then a user-initiated one, are accepted.
    own = {"Sec-Fetch-Site": "same-origin", "Origin": f"http://{HOST}"}
    accepted = await client.post(path, data=form, headers=own)
    assert accepted.status_code == 303
    assert await run_state(rq, env, "r1") == "queued"
    await dead_letter(rq, env, "r2")
    typed = await client.post(f"/envs/{e(env)}/dlq/r2/redrive", headers={"Sec-Fetch-Site": "none"})
    assert typed.status_code == 303
    assert await run_state(rq, env, "r2") == "queued"


async def test_the_token_does_not_excuse_a_cross_site_post(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    await dead_letter(rq, env, "r1")
    client = client_for(rq, token="s3cret")
    path = f"/envs/{e(env)}/dlq/r1/redrive"
    bearer = {"Authorization": "Bearer s3cret"}

    refused = await client.post(path, headers={**bearer, "Sec-Fetch-Site": "cross-site"})

    assert refused.status_code == 403
    assert await run_state(rq, env, "r1") == "dlq"
    assert (await client.post(path, headers=bearer)).status_code == 303
    assert await run_state(rq, env, "r1") == "queued"


async def test_a_link_from_another_site_still_opens_the_pages(
    make_queue: MakeQueue, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    reply = await client_for(rq).get(
        "/", headers={"Sec-Fetch-Site": "cross-site", "Origin": "https://wiki.example"}
    )
    assert reply.status_code == 200  # reading is never refused (browsers keep it same-origin)


# ---------------------------------------------------------------------- body cap


async def test_a_body_over_the_cap_is_refused_and_changes_nothing(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    await dead_letter(rq, env, "r1")
    client = client_for(rq)
    path = f"/envs/{e(env)}/dlq/r1/redrive"
    back = f"/queues/{e(env)}/reports"
    head = f"next={quote(back, safe='')}&pad=".encode()

    over = await client.post(path, content=head + b"x" * (MAX_BODY_BYTES + 1 - len(head)))

    assert over.status_code == 413
    assert f"larger than {MAX_BODY_BYTES} bytes" in over.text
    assert await run_state(rq, env, "r1") == "dlq"
    # Exactly at the cap is accepted.
    at_cap = await client.post(
        path,
        content=head + b"x" * (MAX_BODY_BYTES - len(head)),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert at_cap.status_code == 303
    assert at_cap.headers["location"].startswith(back + "?flash=")
    assert await run_state(rq, env, "r1") == "queued"


def asgi_scope(
    path: str, headers: list[tuple[bytes, bytes]], method: str = "POST", query: bytes = b""
) -> dict[str, Any]:
    """A request as a server hands it over: ``path`` decoded, ``raw_path`` as sent."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(path),
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query,
        "headers": [(b"host", HOST.encode()), *headers],
        "client": ("127.0.0.1", 50000),
        "server": (HOST, 80),
    }


async def call_asgi(
    app: Any, scope: dict[str, Any], chunks: Iterator[bytes]
) -> tuple[int, bytes, int, dict[str, str]]:
    """Run one request through ``app``: (status, body, body chunks it read, headers)."""
    read = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal read
        chunk = next(chunks, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        read += 1
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], body, read, headers


async def test_a_streamed_body_is_cut_off_as_soon_as_it_goes_over_the_cap(
    make_queue: MakeQueue, env: Environment
) -> None:
    rq = await make_queue()
    await dead_letter(rq, env, "r1")
    app = create_app(rq, token=None, allowed_hosts=[HOST])
    path = f"/envs/{e(env)}/dlq/r1/redrive"
    chunk = b"x" * (16 * 1024)

    # Chunked (no Content-Length): 100 chunks of 16 KiB offered, the 5th goes over 64 KiB.
    status, body, read, _ = await call_asgi(app, asgi_scope(path, []), iter([chunk] * 100))

    assert status == 413 and b"larger than" in body, body
    assert read == MAX_BODY_BYTES // len(chunk) + 1
    assert await run_state(rq, env, "r1") == "dlq"

    # A declared length over the cap: refused before one byte is read.
    declared = [(b"content-length", str(100 * len(chunk)).encode())]
    status, _, read, _ = await call_asgi(app, asgi_scope(path, declared), iter([chunk] * 100))
    assert (status, read) == (413, 0)
    bad = [(b"content-length", b"12, 12")]
    status, _, read, _ = await call_asgi(app, asgi_scope(path, bad), iter([chunk]))
    assert (status, read) == (400, 0)
    assert await run_state(rq, env, "r1") == "dlq"


# ---------------------------------------------------------------------- names like paths


async def test_a_queue_named_like_a_path_keeps_its_own_page(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    for i in range(7):
        await rq.enqueue(env, "a/../jobs", f"tricky-{i}", now_ms=T0 + i)
    for i in range(3):
        await rq.enqueue(env, "jobs", f"plain-{i}", now_ms=T0 + i)
    await rq.enqueue(env, "video/encode", "clip-1", now_ms=T0)
    client = client_for(rq)

    html = (await client.get("/")).text

    tricky = f"/queues/{e(env)}/a%2F..%2Fjobs"
    assert f'href="{tricky}"' in html
    assert f'href="/queues/{e(env)}/jobs"' in html
    page = await client.get(tricky)
    assert page.status_code == 200
    assert '<span class="value" data-field="queued">7</span>' in page.text
    assert f'data-api="/api/queues/{e(env)}/a%2F..%2Fjobs"' in page.text
    api = (await client.get(f"/api/queues/{e(env)}/a%2F..%2Fjobs")).json()
    assert (api["queue"]["queue"], api["queue"]["queued"]) == ("a/../jobs", 7)
    plain = (await client.get(f"/api/queues/{e(env)}/jobs")).json()
    assert (plain["queue"]["queue"], plain["queue"]["queued"]) == ("jobs", 3)
    # Unencoded slashes still name the whole queue (older links, hand-typed URLs)...
    nested = (await client.get(f"/api/queues/{env.id}/video/encode")).json()["queue"]
    assert (nested["queue"], nested["queued"]) == ("video/encode", 1)
    # ...but an unencoded "a/../jobs" is resolved by the client itself (httpx, like a
    # browser): the very link the dashboard must never write.
    resolved = await client.get(f"/api/queues/{env.id}/a/../jobs")
    assert resolved.json()["queue"]["queue"] == "jobs"


async def test_the_redrive_form_and_the_token_redirect_keep_the_encoded_path(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    await dead_letter(rq, env, "r1", queue="a/../jobs")
    client = client_for(rq)
    tricky = f"/queues/{e(env)}/a%2F..%2Fjobs"

    page = (await client.get(tricky)).text
    assert f'action="/envs/{e(env)}/dlq/r1/redrive"' in page
    assert f'name="next" value="{tricky}"' in page
    reply = await client.post(f"/envs/{e(env)}/dlq/r1/redrive", data={"next": tricky})
    assert reply.status_code == 303
    assert re.fullmatch(re.escape(tricky) + r"\?flash=redriven%20r1", reply.headers["location"])

    locked = client_for(rq, token="s3cret")
    once = await locked.get(f"{tricky}?token=s3cret&x=1")
    assert once.status_code == 303 and once.headers["location"] == f"{tricky}?x=1"
    assert locked.cookies.get(TOKEN_COOKIE) == "s3cret"
    # A path a browser would take to another host is never redirected to (sent raw:
    # httpx, like a browser, would read "//evil.example" as a host).
    app = create_app(rq, token="s3cret", allowed_hosts=[HOST])
    for raw in ("//evil.example/x", "/\\evil.example/x"):
        scope = asgi_scope(raw, [], method="GET", query=b"token=s3cret")
        status, _, _, headers = await call_asgi(app, scope, iter([]))
        assert (status, headers["location"]) == (303, "/"), raw


async def test_a_redrive_never_redirects_to_another_host(
    make_queue: MakeQueue, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = await make_queue()
    client = client_for(rq)
    for i, target in enumerate(("//evil.example/x", "/\\evil.example", "/\t/evil.example", "x")):
        await dead_letter(rq, env, f"r{i}")
        reply = await client.post(f"/envs/{e(env)}/dlq/r{i}/redrive", data={"next": target})
        assert reply.status_code == 303
        assert reply.headers["location"].startswith("/?flash="), target


# ---------------------------------------------------------------------- server unreachable


def assert_unavailable_page(reply: httpx.Response, shown_url: str) -> None:
    assert reply.status_code == 503
    assert reply.headers["content-type"].startswith("text/html")
    assert reply.headers["retry-after"] == "5"
    assert f"fairq server at {shown_url} is not answering; retrying" in reply.text
    assert '<meta http-equiv="refresh" content="5">' in reply.text
    assert "Traceback" not in reply.text
    assert_security_headers(reply)


def assert_unavailable_json(reply: httpx.Response, shown_url: str) -> None:
    assert reply.status_code == 503
    assert reply.json() == {
        "error": "server_unavailable",
        "detail": f"the fairq server at {shown_url} is not answering; retrying",
        "server": shown_url,
        "retry_after_s": 5,
    }
    assert_security_headers(reply)


async def test_a_closed_port_gets_a_503_page_and_json_never_a_500(
    env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    port = free_port()  # nothing listens there
    url = f"redis://127.0.0.1:{port}/0"
    rq = RunQueue(await connect(url, check=False))
    try:
        client = client_for(rq, server_url=f"redis://admin:hunter2@127.0.0.1:{port}/0?x=1")

        for path in ("/", f"/queues/{e(env)}/emails"):
            page = await client.get(path)
            assert_unavailable_page(page, url)
            assert "hunter2" not in page.text and "admin" not in page.text
        for path in ("/api/overview", f"/api/queues/{e(env)}/emails"):
            assert_unavailable_json(await client.get(path), url)
        redrive = f"/envs/{e(env)}/dlq/r1/redrive"
        assert_unavailable_page(await client.post(redrive), url)
        assert_unavailable_json(
            await client.post(redrive, headers={"Accept": "application/json"}), url
        )
        scrape = await client.get("/metrics")
        assert scrape.status_code == 503 and "is not answering" in scrape.text
        # The page's own CSS and JS do not need the server.
        assert (await client.get("/static/style.css")).status_code == 200
        # Bad input is still a 400, not a 503.
        assert (await client.get("/api/queues/nope/emails")).status_code == 400
    finally:
        await rq.close()


@pytest.fixture
def private_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer()
    server.start()
    yield server
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


async def test_a_server_stopped_mid_use_gets_503_then_the_dashboard_recovers(
    private_server: EmbeddedServer, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = RunQueue(await connect(private_server.url))
    try:
        await rq.enqueue(env, "emails", "e1", now_ms=T0)
        client = client_for(rq, server_url=private_server.url)
        assert (await client.get("/api/overview")).status_code == 200

        private_server.stop()
        assert_unavailable_page(await client.get("/"), private_server.url)
        assert_unavailable_json(await client.get("/api/overview"), private_server.url)

        private_server.start()  # same port, empty (no persistence)
        back = await client.get("/api/overview")
        assert back.status_code == 200 and back.json()["environments"] == []
        await rq.enqueue(env, "emails", "e2", now_ms=T0)
        page = await client.get(f"/queues/{e(env)}/emails")
        assert page.status_code == 200
        assert '<span class="value" data-field="queued">1</span>' in page.text
    finally:
        await rq.close()


async def test_a_server_that_stops_answering_gets_503_after_the_store_timeout(
    private_server: EmbeddedServer, env: Environment, client_for: Callable[..., httpx.AsyncClient]
) -> None:
    rq = RunQueue(await connect(private_server.url))
    try:
        await rq.enqueue(env, "emails", "e1", now_ms=T0)
        client = client_for(rq, server_url=private_server.url, store_timeout_s=1.0)
        assert (await client.get("/api/overview")).status_code == 200
        assert private_server.process is not None
        pid = private_server.process.pid

        os.kill(pid, signal.SIGSTOP)  # the connection stays open; nothing answers
        try:
            assert_unavailable_json(await client.get("/api/overview"), private_server.url)
            assert_unavailable_page(
                await client.get(f"/queues/{e(env)}/emails"), private_server.url
            )
        finally:
            os.kill(pid, signal.SIGCONT)

        detail = (await client.get(f"/api/queues/{e(env)}/emails")).json()
        assert detail["queue"]["queued"] == 1
    finally:
        await rq.close()


def test_the_app_refuses_nonsense_options(env: Environment) -> None:
    for options in (
        {"store_timeout_s": 0},
        {"store_timeout_s": -1.5},
        {"retry_after_s": 0},
        {"retry_after_s": 2.5},
        {"max_body_bytes": -1},
    ):
        with pytest.raises(ValueError, match=next(iter(options))):
            create_app(None, token=None, **options)  # type: ignore[arg-type]
