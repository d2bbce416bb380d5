"""``fairq dashboard``: serve the live dashboard (see :mod:`fairq.dashboard.app`)."""

from __future__ import annotations

import asyncio
import ipaddress
from urllib.parse import quote

import click

from fairq.commands._common import open_queue, run_async, url_option
from fairq.server import resolve_url

#: Environment variable holding the dashboard's access token.
TOKEN_ENV = "FAIRQ_DASHBOARD_TOKEN"


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the dashboard on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@click.command(name="dashboard")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="Port."
)
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    default=None,
    help=f"Access token every request must carry (?token=... or Authorization: Bearer). "
    f"Required when --host is not a loopback address. Env: {TOKEN_ENV}.",
)
@url_option
def command(host: str, port: int, token: str | None, url: str | None) -> None:
    """Serve the live dashboard: queues, CK variants, dead letters, served share, /metrics."""
    if not is_loopback(host) and not token:
        raise click.UsageError(
            f"--host {host} exposes the dashboard beyond this machine: give it an access "
            f"token with --token or {TOKEN_ENV}."
        )
    try:
        _serve(host, port, token, url)
    except KeyboardInterrupt:
        # uvicorn shuts down gracefully on Ctrl-C, then re-raises the signal: a clean exit.
        click.echo("dashboard stopped")


@run_async
async def _serve(host: str, port: int, token: str | None, url: str | None) -> None:
    from fairq.dashboard.app import create_server

    resolved = await asyncio.to_thread(resolve_url, url)
    rq = await open_queue(resolved)
    try:
        # The URL is named on the page shown while the server does not answer.
        server = create_server(rq, host=host, port=port, token=token, server_url=resolved)
        shown = f"[{host}]" if ":" in host else host
        link = f"http://{shown}:{port}/" + (f"?token={quote(token, safe='')}" if token else "")
        click.echo(f"fairq dashboard on {link}  (metrics: /metrics; Ctrl-C to stop)")
        await server.serve()
    finally:
        await rq.close()
