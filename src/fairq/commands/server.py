"""``fairq server``: run the embedded Valkey (one node or a local cluster) in the foreground,
or start, inspect and stop the shared per-user server that other commands use by default."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from types import FrameType

import click

from fairq.errors import FairqError
from fairq.server import (
    EmbeddedServer,
    SharedServerReport,
    shared_server_report,
    shared_server_url,
    stop_shared,
)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _alive(servers: list[EmbeddedServer]) -> bool:
    return all(s.process is not None and s.process.poll() is None for s in servers)


def _serve_until_interrupted(url: str, servers: list[EmbeddedServer], what: str) -> None:
    click.echo(url)
    click.echo(f"# {what}; stop with Ctrl-C. Point fairq at it with:", err=True)
    click.echo(f"#   export FAIRQ_REDIS_URL='{url}'", err=True)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        while _alive(servers):
            time.sleep(0.2)
        raise click.ClickException("the server exited unexpectedly")
    except KeyboardInterrupt:
        click.echo("# stopping", err=True)
    finally:
        signal.signal(signal.SIGTERM, previous)


@click.group(name="server", invoke_without_command=True)
@click.option(
    "--cluster",
    "masters",
    type=click.IntRange(0, 64),
    default=0,
    metavar="N",
    help="Run an N-master Redis/Valkey Cluster instead of one node (prints a "
    "redis+cluster:// URL).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    help="Port of a single node (default: a free one).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep data here (append-only file) instead of a temporary directory.",
)
@click.pass_context
def command(ctx: click.Context, masters: int, port: int, data_dir: Path | None) -> None:
    """Run the embedded Valkey server in the foreground and print its URL until Ctrl-C.

    \b
    fairq server              one node on a free loopback port
    fairq server --cluster 3  a 3-master cluster (redis+cluster:// URL)
    fairq server start        start the shared per-user server (detached) and print its URL
    fairq server status       show the shared server (exit code 1 when it is not running)
    fairq server stop         stop the shared server

    The shared server listens on a unix socket in the state directory (FAIRQ_STATE_DIR,
    default $XDG_STATE_HOME/fairq) that only you can reach; FAIRQ_FSYNC=always|everysec|no
    sets how often its append-only file is fsynced (default everysec); a running server
    with a weaker policy gets it raised.
    """
    if ctx.invoked_subcommand is not None:
        return
    try:
        if masters:
            if port:
                raise click.UsageError("--port applies to a single node; a cluster uses free ports")
            from fairq.cluster import EmbeddedCluster

            if data_dir is not None and data_dir.exists() and any(data_dir.iterdir()):
                raise click.UsageError(
                    f"--data-dir {data_dir} is not empty: a new cluster needs an empty directory"
                )
            with EmbeddedCluster(masters, data_dir=data_dir) as cluster:
                ports = ", ".join(str(p) for p in cluster.ports)
                _serve_until_interrupted(
                    cluster.url, cluster.nodes, f"{masters}-master cluster on ports {ports}"
                )
        else:
            server = EmbeddedServer(
                port=port or None, data_dir=data_dir, appendonly=data_dir is not None
            )
            with server:
                _serve_until_interrupted(server.url, [server], f"Valkey on port {server.port}")
    except FairqError as exc:
        raise click.ClickException(str(exc)) from None


@command.command(name="start")
def start() -> None:
    """Start the shared per-user server (if needed) and print its URL."""
    try:
        click.echo(shared_server_url(start=True))
    except FairqError as exc:
        raise click.ClickException(str(exc)) from None


@command.command(name="status")
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
def status(as_json: bool) -> None:
    """Show whether the shared server runs (exit code 1 when it does not)."""
    try:
        report = shared_server_report()
    except FairqError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        state = report.state.as_dict() if report.state else {}
        click.echo(
            json.dumps(
                {
                    "running": report.running,
                    **state,
                    "fsync": report.fsync or state.get("fsync"),
                    "socket": report.socket,
                    "data_dir": report.data_dir,
                    "state_file_problem": report.problem,
                    "unrecorded_pid": report.unrecorded_pid,
                }
            )
        )
    else:
        click.echo(_describe(report))
    if not report.running:
        raise SystemExit(1)


def _describe(report: SharedServerReport) -> str:
    if report.running and report.state is not None:
        state = report.state
        rows = [
            ("url", state.url),
            ("socket", state.socket),
            ("pid", str(state.pid)),
            ("run_id", state.run_id),
            ("fsync", f"{report.fsync or state.fsync} (appendfsync in force)"),
            ("data dir", report.data_dir),
            ("started", state.started_at),
        ]
        return "running\n" + "\n".join(f"  {name + ':':<10}{value}" for name, value in rows)
    lines = ["not running"]
    if report.problem is not None:
        lines.append(
            f"  the state file is corrupt or unusable ({report.problem}); "
            "it is replaced when the server next starts (fairq server start)"
        )
    elif report.state is not None:
        lines.append(f"  the state file names pid {report.state.pid}, which no longer answers")
    if report.unrecorded_pid is not None:
        lines.append(
            f"  a server (pid {report.unrecorded_pid}) answers on {report.socket} but is not "
            "the recorded one: `fairq server start` records it if fairq started it"
        )
    lines.append(f"  socket:   {report.socket}")
    lines.append(f"  data dir: {report.data_dir}")
    return "\n".join(lines)


@command.command(name="stop")
def stop() -> None:
    """Stop the shared per-user server (SHUTDOWN over its socket; its data is kept).

    A state file that names any process other than the shared server is never acted on:
    nothing is signalled."""
    try:
        outcome = stop_shared()
    except FairqError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo("stopped" if outcome.stopped else "not running")
    if outcome.message not in ("stopped", "not running"):
        click.echo(f"# {outcome.message}", err=True)
