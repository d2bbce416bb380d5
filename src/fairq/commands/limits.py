"""``fairq limits``: get or set environment and queue limits; pause and resume queues."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from fairq.commands._common import open_queue, run_async, url_option
from fairq.errors import FairqError
from fairq.keys import Environment
from fairq.store.admin import Change, env_option, queue_option


def _env(value: str) -> Environment:
    try:
        return Environment.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ENV") from None


def _optional_int(value: str | None, name: str) -> tuple[bool, int | None]:
    """(given, value): 'none' removes the setting."""
    if value is None:
        return False, None
    if value.lower() in ("none", "unset", "default"):
        return True, None
    try:
        return True, int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a number or 'none'", param_hint=name) from None


@click.group(name="limits")
def command() -> None:
    """Get or set limits: `fairq limits get ENV`, `fairq limits set ENV [QUEUE] ...`,
    `fairq limits pause ENV QUEUE`, `fairq limits resume ENV QUEUE`.

    ENV is org:project:env. Env limits: concurrency (runs in flight across its queues),
    burst factor (one queue may use concurrency x burst), default queue size limit.
    Queue limits: concurrency (per concurrency key when runs have keys) and size limit.
    """


@command.command(name="get")
@click.argument("env_name", metavar="ENV")
@click.argument("queue", required=False)
@url_option
@run_async
async def get_limits(env_name: str, queue: str | None, url: str | None) -> None:
    """Show an environment's limits and its queues' (or one queue's) limits."""
    env = _env(env_name)
    rq = await open_queue(url)
    try:
        e = await rq.env_stats(env)
        names = [queue] if queue else await rq.queues(env)
        stats = await rq.queues_stats(env, names) if names else []
    finally:
        await rq.close()
    table = Table(title=f"limits of {env}", title_justify="left")
    table.add_column("Scope")
    for name in ("Concurrency", "Burst", "Size limit", "Running"):
        table.add_column(name, justify="right")
    table.add_column("Paused")
    table.add_row(
        "env", str(e.concurrency_limit), f"{e.burst_factor:g}",
        "-" if e.queue_size_limit is None else str(e.queue_size_limit), str(e.running), "",
    )  # fmt: skip
    for q in stats:
        table.add_row(
            f"queue {q.queue}",
            "-" if q.concurrency_limit is None else str(q.concurrency_limit),
            "",
            "-" if q.queue_size_limit is None else str(q.queue_size_limit),
            str(q.running),
            "paused" if q.paused else "",
        )
    Console(emoji=False, highlight=False).print(table)


@command.command(name="set")
@click.argument("env_name", metavar="ENV")
@click.argument("queue", required=False)
@click.option("--concurrency", default=None, help="Concurrency limit ('none' removes it).")
@click.option("--burst", type=float, default=None, help="Env burst factor (1..100).")
@click.option("--size-limit", default=None, help="Queue size limit ('none' removes it).")
@url_option
@run_async
async def set_limits(
    env_name: str,
    queue: str | None,
    concurrency: str | None,
    burst: float | None,
    size_limit: str | None,
    url: str | None,
) -> None:
    """Set env limits (no QUEUE) or a queue's limits.

    \b
    fairq limits set acme:shop:prod --concurrency 50 --burst 2 --size-limit 10000
    fairq limits set acme:shop:prod emails --concurrency 5 --size-limit 500
    """
    env = _env(env_name)
    has_conc, conc = _optional_int(concurrency, "--concurrency")
    has_size, size = _optional_int(size_limit, "--size-limit")
    if not (has_conc or has_size or burst is not None):
        raise click.UsageError("nothing to set: give --concurrency, --size-limit or --burst")
    # the whole command is validated before anything is written, then applied at once
    changes: list[Change] = []
    try:
        if queue is None:
            if has_conc:
                changes.append(env_option("concurrency", conc))
            if burst is not None:
                changes.append(env_option("burst_factor", burst))
            if has_size:
                changes.append(env_option("max_queue_size", size))
        else:
            if burst is not None:
                raise click.UsageError("--burst applies to an environment, not a queue")
            if has_conc:
                changes.append(queue_option(queue, "concurrency", conc))
            if has_size:
                changes.append(queue_option(queue, "max_size", size))
    except FairqError as exc:
        raise click.BadParameter(str(exc)) from None
    rq = await open_queue(url)
    try:
        await rq.configure(env, changes)
    finally:
        await rq.close()
    parts = [
        f"concurrency {conc if conc is not None else 'removed'}" if has_conc else "",
        f"burst {burst:g}" if burst is not None else "",
        f"size limit {size if size is not None else 'removed'}" if has_size else "",
    ]
    click.echo(f"{env}{' ' + queue if queue else ''}: " + ", ".join(p for p in parts if p))


@command.command(name="pause")
@click.argument("env_name", metavar="ENV")
@click.argument("queue")
@url_option
@run_async
async def pause(env_name: str, queue: str, url: str | None) -> None:
    """Pause a queue: its runs stay queued, none starts (running ones finish)."""
    env = _env(env_name)
    rq = await open_queue(url)
    try:
        await rq.pause_queue(env, queue)
    finally:
        await rq.close()
    click.echo(f"{env} {queue}: paused")


@command.command(name="resume")
@click.argument("env_name", metavar="ENV")
@click.argument("queue")
@click.option("--concurrency", type=int, default=None, help="Also set this limit.")
@url_option
@run_async
async def resume(env_name: str, queue: str, concurrency: int | None, url: str | None) -> None:
    """Resume a paused queue (it keeps its concurrency limit unless --concurrency)."""
    env = _env(env_name)
    try:
        changes = [queue_option(queue, "paused", None)]
        if concurrency is not None:
            changes.append(queue_option(queue, "concurrency", concurrency))
    except FairqError as exc:
        raise click.BadParameter(str(exc)) from None
    rq = await open_queue(url)
    try:
        await rq.configure(env, changes)
    finally:
        await rq.close()
    click.echo(f"{env} {queue}: resumed")


@command.command(name="weight")
@click.argument("env_name", metavar="ENV")
@click.argument("queue")
@click.argument("key")
@click.argument("weight", required=False)
@url_option
@run_async
async def weight(env_name: str, queue: str, key: str, weight: str | None, url: str | None) -> None:
    """Weight a concurrency key in the fair order (2 = twice the share); omit to reset."""
    env = _env(env_name)
    try:
        value = None if weight is None or weight.lower() == "none" else float(weight)
    except ValueError:
        raise click.BadParameter(
            f"{weight!r} is not a number or 'none'", param_hint="WEIGHT"
        ) from None
    rq = await open_queue(url)
    try:
        await rq.set_concurrency_key_weight(env, queue, key, value)
    finally:
        await rq.close()
    click.echo(f"{env} {queue} key {key!r}: weight {value if value is not None else 1}")
