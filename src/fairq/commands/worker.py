"""``fairq worker module:app``: run an app's tasks until SIGTERM / SIGINT."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
import threading
from typing import Any

import click

from fairq.app import Fairq
from fairq.commands._common import url_option
from fairq.errors import FairqError


def load_app(spec: str) -> Fairq:
    """Import ``module:attribute`` (or ``module``, which must have an ``app``) from the cwd.

    Raises:
        click.BadParameter: the module or attribute is missing, or is not a Fairq app.
    """
    module_name, _, attribute = spec.partition(":")
    attribute = attribute or "app"
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint="APP"
        ) from None
    target: Any = module
    for part in attribute.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise click.BadParameter(f"{module_name!r} has no {attribute!r}", param_hint="APP")
    if not isinstance(target, Fairq):
        raise click.BadParameter(
            f"{spec!r} is a {type(target).__name__}, not a fairq.Fairq app", param_hint="APP"
        )
    return target


@click.command(name="worker")
@click.argument("app_spec", metavar="MODULE:APP")
@url_option
@click.option("-c", "--concurrency", default=10, show_default=True, help="Runs in flight at once.")
@click.option(
    "-q",
    "--queue",
    "queues",
    multiple=True,
    help="Only this task queue (repeatable). Default: all.",
)
@click.option(
    "--grace", default=30.0, show_default=True, help="Seconds in-flight runs get after SIGTERM."
)
@click.option(
    "--linger-ms",
    type=click.FloatRange(0, 1000),
    default=2.0,
    show_default=True,
    help="After a dequeue that got fewer runs than it asked for, wait this long for more "
    "before the next (0 = never).",
)
@click.option("--burst", is_flag=True, help="Exit once nothing is ready and nothing is running.")
@click.option("--max-runs", type=int, default=None, help="Exit after this many runs ended.")
@click.option("-v", "--verbose", is_flag=True, help="Log every run, retry and limit change.")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object per line (with every run's line, even without -v).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics on this port (/metrics). With --processes N, worker i "
    "serves on port + i.",
)
@click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help="Address of --metrics-port."
)
@click.option(
    "-p",
    "--processes",
    default="1",
    show_default=True,
    help="Worker processes to run under a supervisor that restarts one that dies; "
    "'auto' = one per core.",
)
def command(
    app_spec: str,
    url: str | None,
    concurrency: int,
    queues: tuple[str, ...],
    grace: float,
    linger_ms: float,
    burst: bool,
    max_runs: int | None,
    verbose: bool,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
    processes: str,
) -> None:
    """Run the tasks of a fairq app: `fairq worker myproject.tasks:app`.

    Async tasks run on the event loop, plain functions in threads. SIGTERM or Ctrl-C
    stops taking work and lets running tasks finish (up to --grace seconds); the
    rest go back to the queue. A second signal returns them at once.
    """
    from fairq import logs

    fmt: logs.LogFormat = "json" if log_format == "json" else "text"
    logs.configure(logging.INFO if verbose else logging.WARNING, fmt)
    count = _processes(processes)
    # a SIGTERM (a supervisor's, a deploy's) while the worker still starts up (imports,
    # the server's start) stops it gracefully once it runs, instead of killing it
    early: list[int] = []
    if count == 1:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: early.append(signum))
    app = load_app(app_spec)
    if count > 1:
        _supervise(
            count, app_spec, url=url, concurrency=concurrency, queues=queues, grace=grace,
            linger_ms=linger_ms, burst=burst, max_runs=max_runs, verbose=verbose,
            log_format=log_format, metrics_port=metrics_port, metrics_host=metrics_host,
        )  # fmt: skip
        return
    from fairq import metrics
    from fairq.supervisor import watch_parent
    from fairq.worker import Worker

    watch_parent()
    if url:
        app.url = url
    try:
        worker = Worker(
            app, concurrency=concurrency, queues=list(queues) or None, grace_period=grace,
            linger=linger_ms / 1000, burst=burst, max_runs=max_runs,
            install_signal_handlers=True,
        )  # fmt: skip
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

    if metrics_port is not None:
        try:
            metrics.serve(metrics_port, metrics_host)
        except OSError as exc:
            raise click.ClickException(f"--metrics-port {metrics_port}: {exc}") from None

    async def main() -> None:
        resolved = await app.resolved_url()
        logs.say(
            f"fairq worker: env {app.env} | queues {', '.join(worker.queues)} | "
            f"concurrency {concurrency} | server {resolved}"
            + (f" | metrics http://{metrics_host}:{metrics_port}/metrics" if metrics_port else ""),
            fmt,
        )
        if early:  # stopped while starting: take nothing, exit cleanly
            worker.stop()
        try:
            stats = await worker.run()
        finally:
            await app.aclose()
        logs.say(
            f"fairq worker stopped: {stats.completed} completed, {stats.retried} retried, "
            f"{stats.failed} failed, {stats.dead_lettered} dead-lettered, "
            f"{stats.returned} returned to the queue",
            fmt,
        )

    try:
        asyncio.run(main())
    except FairqError as exc:
        raise click.ClickException(str(exc)) from None
    if any(t.name.startswith("fairq-task") and t.is_alive() for t in threading.enumerate()):
        # a sync task still running past the grace period: its run is already back in
        # the queue, so do not wait for the thread at interpreter exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _processes(raw: str) -> int:
    from fairq.supervisor import cpu_count

    if raw.strip().lower() == "auto":
        return cpu_count()
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if not 1 <= count <= 512:
        raise click.BadParameter(f"{raw!r}: give 1..512 or 'auto'", param_hint="--processes")
    return count


def _supervise(
    count: int,
    app_spec: str,
    *,
    url: str | None,
    concurrency: int,
    queues: tuple[str, ...],
    grace: float,
    linger_ms: float,
    burst: bool,
    max_runs: int | None,
    verbose: bool,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run ``count`` workers with the same options under :class:`fairq.supervisor.Supervisor`."""
    from fairq.supervisor import Supervisor

    base = [sys.executable, "-m", "fairq", "worker", app_spec, "--processes", "1"]
    base += ["--concurrency", str(concurrency), "--grace", repr(grace)]
    base += ["--linger-ms", repr(linger_ms)]
    base += ["--log-format", log_format, "--metrics-host", metrics_host]
    for q in queues:
        base += ["--queue", q]
    if burst:
        base.append("--burst")
    if max_runs is not None:
        base += ["--max-runs", str(max_runs)]
    if verbose:
        base.append("--verbose")
    commands = [
        base + ([] if metrics_port is None else ["--metrics-port", str(metrics_port + i)])
        for i in range(count)
    ]
    env = dict(os.environ)
    if url:
        env["FAIRQ_REDIS_URL"] = url
    from fairq import logs

    fmt: logs.LogFormat = "json" if log_format == "json" else "text"
    logs.say(f"fairq supervisor: {count} worker processes of {app_spec}", fmt,
             logger="fairq.supervisor")  # fmt: skip
    supervisor = Supervisor(processes=count, commands=commands, env=env)
    code = supervisor.run()
    restarts = sum(s.restarts for s in supervisor.slots)
    logs.say(f"fairq supervisor stopped: {count} worker(s), {restarts} restart(s)", fmt,
             logger="fairq.supervisor")  # fmt: skip
    if code:
        raise SystemExit(code)
