"""Helpers shared by the CLI commands."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import click

from fairq.config import RunQueueConfig
from fairq.errors import FairqError
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
