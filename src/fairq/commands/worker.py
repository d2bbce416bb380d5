"""``fairq worker module:app``: run an app's tasks until SIGTERM / SIGINT."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
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
@click.option("--burst", is_flag=True, help="Exit once nothing is ready and nothing is running.")
@click.option("--max-runs", type=int, default=None, help="Exit after this many runs ended.")
@click.option("-v", "--verbose", is_flag=True, help="Log every retry and limit change.")
def command(
    app_spec: str,
    url: str | None,
    concurrency: int,
    queues: tuple[str, ...],
    grace: float,
    burst: bool,
    max_runs: int | None,
    verbose: bool,
) -> None:
    """Run the tasks of a fairq app: `fairq worker myproject.tasks:app`.

    Async tasks run on the event loop, plain functions in threads. SIGTERM or Ctrl-C
    stops taking work and lets running tasks finish (up to --grace seconds); the
    rest go back to the queue. A second signal returns them at once.
    """
    from fairq.worker import Worker

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    app = load_app(app_spec)
    if url:
        app.url = url
    try:
        worker = Worker(
            app, concurrency=concurrency, queues=list(queues) or None, grace_period=grace,
            burst=burst, max_runs=max_runs, install_signal_handlers=True,
        )  # fmt: skip
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

    async def main() -> None:
        resolved = await app.resolved_url()
        click.echo(
            f"fairq worker: env {app.env} | queues {', '.join(worker.queues)} | "
            f"concurrency {concurrency} | server {resolved}",
            err=True,
        )
        try:
            stats = await worker.run()
        finally:
            await app.aclose()
        click.echo(
            f"fairq worker stopped: {stats.completed} completed, {stats.retried} retried, "
            f"{stats.failed} failed, {stats.dead_lettered} dead-lettered, "
            f"{stats.returned} returned to the queue",
            err=True,
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
