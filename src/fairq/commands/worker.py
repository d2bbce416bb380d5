"""``fairq worker module:app``: run an app's tasks until SIGTERM / SIGINT."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from fairq.app import Fairq
from fairq.commands._common import url_option
from fairq.errors import FairqError

if TYPE_CHECKING:
    from fairq.logs import LogFormat
    from fairq.worker import Worker


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

    options = _WorkerOptions(
        app_spec=app_spec, url=url, concurrency=concurrency, queues=queues, grace=grace,
        linger_ms=linger_ms, burst=burst, max_runs=max_runs, verbose=verbose,
        log_format=log_format, metrics_port=metrics_port, metrics_host=metrics_host,
    )  # fmt: skip
    logs.configure(logging.INFO if verbose else logging.WARNING, options.fmt)
    count = _processes(processes)
    # a SIGTERM (a supervisor's, a deploy's) while the worker still starts up (imports,
    # the server's start) stops it gracefully once it runs, instead of killing it
    early = _note_early_signals() if count == 1 else []
    app = load_app(app_spec)
    if count > 1:
        _supervise(count, options)
        return
    _run_worker(app, options, early)


@dataclass(frozen=True, slots=True)
class _WorkerOptions:
    """The options of ``fairq worker`` that each worker process runs with."""

    app_spec: str
    url: str | None
    concurrency: int
    queues: tuple[str, ...]
    grace: float
    linger_ms: float
    burst: bool
    max_runs: int | None
    verbose: bool
    log_format: str
    metrics_port: int | None
    metrics_host: str

    @property
    def fmt(self) -> LogFormat:
        """The log format, as :mod:`fairq.logs` names it."""
        return "json" if self.log_format == "json" else "text"


def _note_early_signals() -> list[int]:
    """Record SIGTERM / SIGINT instead of dying on them; returns the list they land in."""
    early: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: early.append(signum))
    return early


def _run_worker(app: Fairq, options: _WorkerOptions, early: list[int]) -> None:
    """Run one worker in this process until it stops."""
    from fairq import metrics
    from fairq.supervisor import watch_parent

    watch_parent()
    if options.url:
        app.url = options.url
    worker = _make_worker(app, options)
    if options.metrics_port is not None:
        try:
            metrics.serve(options.metrics_port, options.metrics_host)
        except OSError as exc:
            raise click.ClickException(f"--metrics-port {options.metrics_port}: {exc}") from None
    try:
        asyncio.run(_work(app, worker, options, early))
    except FairqError as exc:
        raise click.ClickException(str(exc)) from None
    if any(t.name.startswith("fairq-task") and t.is_alive() for t in threading.enumerate()):
        # a sync task still running past the grace period: its run is already back in
        # the queue, so do not wait for the thread at interpreter exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _make_worker(app: Fairq, options: _WorkerOptions) -> Worker:
    """The worker of ``app`` with the command's options; a bad option is a usage error."""
    from fairq.worker import Worker

    try:
        return Worker(
            app, concurrency=options.concurrency, queues=list(options.queues) or None,
            grace_period=options.grace, linger=options.linger_ms / 1000, burst=options.burst,
            max_runs=options.max_runs, install_signal_handlers=True,
        )  # fmt: skip
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


async def _work(app: Fairq, worker: Worker, options: _WorkerOptions, early: list[int]) -> None:
    """Say what runs, run the worker until it stops, close the app and say how it went."""
    from fairq import logs

    resolved = await app.resolved_url()
    port, host = options.metrics_port, options.metrics_host
    logs.say(
        f"fairq worker: env {app.env} | queues {', '.join(worker.queues)} | "
        f"concurrency {options.concurrency} | server {resolved}"
        + (f" | metrics http://{host}:{port}/metrics" if port else ""),
        options.fmt,
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
        options.fmt,
    )


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


def _supervise(count: int, options: _WorkerOptions) -> None:
    """Run ``count`` workers with the same options under :class:`fairq.supervisor.Supervisor`."""
    from fairq import logs
    from fairq.supervisor import Supervisor

    commands = _worker_commands(count, options)
    env = dict(os.environ)
    if options.url:
        env["FAIRQ_REDIS_URL"] = options.url
    logs.say(f"fairq supervisor: {count} worker processes of {options.app_spec}", options.fmt,
             logger="fairq.supervisor")  # fmt: skip
    supervisor = Supervisor(processes=count, commands=commands, env=env)
    code = supervisor.run()
    restarts = sum(s.restarts for s in supervisor.slots)
    logs.say(f"fairq supervisor stopped: {count} worker(s), {restarts} restart(s)", options.fmt,
             logger="fairq.supervisor")  # fmt: skip
    if code:
        raise SystemExit(code)


def _worker_commands(count: int, options: _WorkerOptions) -> list[list[str]]:
    """The command line of each of ``count`` single-process workers (worker i serves
    metrics on ``--metrics-port`` + i)."""
    base = [sys.executable, "-m", "fairq", "worker", options.app_spec, "--processes", "1"]
    base += ["--concurrency", str(options.concurrency), "--grace", repr(options.grace)]
    base += ["--linger-ms", repr(options.linger_ms)]
    base += ["--log-format", options.log_format, "--metrics-host", options.metrics_host]
    for q in options.queues:
        base += ["--queue", q]
    if options.burst:
        base.append("--burst")
    if options.max_runs is not None:
        base += ["--max-runs", str(options.max_runs)]
    if options.verbose:
        base.append("--verbose")
    port = options.metrics_port
    return [
        base + ([] if port is None else ["--metrics-port", str(port + i)]) for i in range(count)
    ]
