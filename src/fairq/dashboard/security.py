"""What the dashboard does to every request before a route sees it.

Outermost first:

* :class:`SecurityHeadersMiddleware`: every response (pages, JSON, static files, errors)
  carries :data:`SECURITY_HEADERS`: no framing by any site (``X-Frame-Options: DENY``,
  CSP ``frame-ancestors 'none'``), scripts, styles and fetches from the dashboard itself
  only (no inline script, no CDN), no MIME sniffing, no referrer sent to other sites.
* Host check (Starlette's ``TrustedHostMiddleware``, set up by the app): without a token
  the dashboard answers loopback host names only, so a page on another site that rebinds
  its DNS name to 127.0.0.1 cannot read it.
* :class:`BodyLimitMiddleware`: a request body over :data:`MAX_BODY_BYTES` is refused with
  413, without reading it to the end.
* :class:`CrossSiteMiddleware`: a state-changing request (POST...) that a browser says
  comes from another site (``Sec-Fetch-Site`` other than ``same-origin``/``none``, or an
  ``Origin`` that is not this host) is refused with 403.
* :class:`TokenMiddleware` (when a token is set): every request must carry it:
  ``?token=...`` once (it is then kept in an HttpOnly, SameSite=Strict cookie) or an
  ``Authorization: Bearer ...`` header. Without a token the app is meant for 127.0.0.1
  only (``fairq dashboard`` refuses to bind elsewhere without one).
"""

from __future__ import annotations

import hmac
from typing import Final
from urllib.parse import quote, urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Cookie that keeps the access token after ``?token=``.
TOKEN_COOKIE: Final = "fairq_dashboard_token"

#: Host headers a token-less dashboard answers (loopback only: a page on another site
#: that rebinds its DNS name to 127.0.0.1 must not read the JSON).
LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "[::1]")

#: Largest request body accepted (bytes); the dashboard's own forms are a few hundred.
MAX_BODY_BYTES: Final = 64 * 1024

#: Everything the pages load comes from the dashboard itself; nothing may frame them.
CONTENT_SECURITY_POLICY: Final = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

#: Headers every response carries.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

#: Methods that change nothing (never checked for cross-site origin).
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
#: ``Sec-Fetch-Site`` values of a request this site made, or the user typed.
FETCH_SITES_ALLOWED: Final = frozenset({"same-origin", "none"})


def local_path(target: str) -> str | None:
    """``target`` if it is a path on this site (``/...``), else None.

    Refuses what a browser would take to another host: ``//host``, ``/\\host``, a scheme,
    and control characters (browsers drop tabs and newlines from URLs).
    """
    if not target.startswith("/") or target[1:2] in ("/", "\\"):
        return None
    if any(c < " " or c in "\x7f\\" for c in target):
        return None
    return target


def cross_site_reason(method: str, headers: Headers) -> str | None:
    """Why a request must be refused as cross-site, or None when it may go on."""
    if method.upper() in SAFE_METHODS:
        return None
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site.strip().lower() not in FETCH_SITES_ALLOWED:
        return f"Sec-Fetch-Site is {fetch_site!r}"
    origin = headers.get("origin")
    if origin is not None:
        host = headers.get("host", "").lower()
        if not host or urlsplit(origin.strip()).netloc.lower() != host:
            return f"Origin {origin!r} is not this dashboard"
    return None


def _refusal(status: int, text: str, headers: dict[str, str] | None = None) -> Response:
    return PlainTextResponse(f"{status}: {text}", status_code=status, headers=headers)


class SecurityHeadersMiddleware:
    """Add :data:`SECURITY_HEADERS` to every response (unless the app set one itself)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in headers:
                        headers.append(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)


class _BodyTooLarge(Exception):
    """Raised from ``receive`` once a body goes over the cap."""


class BodyLimitMiddleware:
    """Refuse a request body over ``max_bytes`` with 413, reading no more of it.

    A declared ``Content-Length`` over the cap is refused before anything is read; a body
    without one (chunked) is counted as it arrives and refused as soon as it goes over.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> Response:
        return _refusal(413, f"request body larger than {self.max_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                await _refusal(400, "bad Content-Length")(scope, receive, send)
                return
            if int(declared) > self.max_bytes:
                await self._too_large()(scope, receive, send)
                return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _BodyTooLarge
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except _BodyTooLarge:
            if started:  # pragma: no cover - the routes read the body before answering
                raise
            await self._too_large()(scope, receive, send)


class CrossSiteMiddleware:
    """Refuse (403) a state-changing request that a browser sent on another site's behalf.

    Browsers say where a request comes from (``Sec-Fetch-Site``, ``Origin``) and a page
    cannot forge either; a request without them (curl, scripts) is not a browser's and
    goes on (to the token check, when there is a token).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            reason = cross_site_reason(scope["method"], Headers(scope=scope))
            if reason is not None:
                refusal = _refusal(403, f"cross-site request refused ({reason})")
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _path_as_sent(scope: Scope) -> str:
    """The request path still percent-encoded (``a%2F..%2Fjobs`` stays one segment)."""
    raw = scope.get("raw_path")
    if raw:
        return bytes(raw).decode("latin-1").split("?", 1)[0]
    return quote(scope.get("root_path", "") + scope["path"])


class TokenMiddleware:
    """Refuse every request that does not carry the token (query, cookie or Bearer)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    def _ok(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        header = request.headers.get("authorization", "")
        bearer = header[7:].strip() if header.lower().startswith("bearer ") else None
        from_query = request.query_params.get("token")
        if self._ok(bearer) or self._ok(request.cookies.get(TOKEN_COOKIE)):
            await self.app(scope, receive, send)
            return
        if self._ok(from_query):
            # Keep it in a cookie and drop it from the address bar.
            query = request.url.remove_query_params("token").query
            location = local_path(_path_as_sent(scope)) or "/"
            redirect = RedirectResponse(location + (f"?{query}" if query else ""), 303)
            redirect.set_cookie(TOKEN_COOKIE, self.token.decode(), httponly=True, samesite="strict")
            await redirect(scope, receive, send)
            return
        refusal = _refusal(
            401,
            "this dashboard needs its access token: open it with ?token=... "
            "or send 'Authorization: Bearer ...'.",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await refusal(scope, receive, send)


__all__ = [
    "CONTENT_SECURITY_POLICY",
    "LOOPBACK_HOSTS",
    "MAX_BODY_BYTES",
    "SECURITY_HEADERS",
    "TOKEN_COOKIE",
    "BodyLimitMiddleware",
    "CrossSiteMiddleware",
    "SecurityHeadersMiddleware",
    "TokenMiddleware",
    "cross_site_reason",
    "local_path",
]
