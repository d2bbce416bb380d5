"""Helpers shared by the CLI commands."""

from __future__ import annotations

import asyncio
import datetime as dt
import difflib
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import click
from rich.console import Console

from fairq.config import RunQueueConfig
from fairq.errors import FairqError
from fairq.keys import Environment
from fairq.server import connect, resolve_url
from fairq.store import RunQueue

P = ParamSpec("P")
T = TypeVar("T")

url_option = click.option(
    "--url",
    envvar="FAIRQ_REDIS_URL",
    default=None,
    help="Server URL (redis://, rediss://, unix://, redis+cluster://). "
    "Default: the shared embedded server.",
)


async def open_queue(url: str | None, config: RunQueueConfig | None = None) -> RunQueue:
    """A RunQueue on ``url`` (or FAIRQ_REDIS_URL, or the shared embedded server)."""
    resolved = await asyncio.to_thread(resolve_url, url)
    return RunQueue(await connect(resolved), config or RunQueueConfig.from_env())


def run_async(fn: Callable[P, Awaitable[T]]) -> Callable[P, T]:
    """Run an async click callback; fairq errors become one clear message, exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return asyncio.run(fn(*args, **kwargs))  # type: ignore[arg-type]
        except FairqError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


def parse_env(value: str) -> Environment:
    """``org:project:env``, or a usage error that names the argument."""
    try:
        return Environment.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ENV") from None


def console() -> Console:
    """A console as wide as the terminal (tables fold or wrap to fit it)."""
    return Console(emoji=False, highlight=False)


def fmt_time(ms: int | None) -> str:
    """A local time ``YYYY-MM-DD HH:MM:SS`` of ms since the epoch; ``-`` for none."""
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


async def warn_if_unknown(rq: RunQueue, env: Environment, queue: str | None = None) -> bool:
    """Warn (on stderr) about an environment or queue that never had a run, suggesting the
    closest known names. Returns whether the names are known. Off the hot path: one read
    of the environment (and queue) sets."""
    envs = await rq.environments()
    if env not in envs:
        names = [e.id for e in envs]
        close = difflib.get_close_matches(env.id, names, n=3, cutoff=0.5)
        hint = (
            f"; did you mean {', '.join(close)}?"
            if close
            else (f"; known: {', '.join(names[:10])}" if names else "; none has a run yet")
        )
        click.secho(f"warning: no environment {env.id} on this server{hint}", err=True,
                    fg="yellow")  # fmt: skip
        return False
    if queue is None:
        return True
    queues = await rq.queues(env)
    if queue in queues:
        return True
    close = difflib.get_close_matches(queue, queues, n=3, cutoff=0.5)
    hint = (
        f"; did you mean {', '.join(close)}?"
        if close
        else (f"; its queues: {', '.join(queues[:10])}" if queues else "")
    )
    click.secho(f"warning: {env.id} has no queue {queue!r}{hint}", err=True, fg="yellow")
    return False
