"""``fairq dlq``: list and redrive dead-lettered runs."""

from __future__ import annotations

import datetime as dt

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fairq.commands._common import open_queue, run_async, url_option
from fairq.errors import RunNotFoundError
from fairq.keys import Environment


@click.group(name="dlq")
def command() -> None:
    """Dead-lettered runs: `fairq dlq list ENV`, `fairq dlq redrive ENV RUN_ID... | --all`."""


@command.command(name="list")
@click.argument("env_name", metavar="ENV")
@click.option("--limit", default=100, show_default=True, help="Show at most this many.")
@url_option
@run_async
async def list_dead_letters(env_name: str, limit: int, url: str | None) -> None:
    """List an environment's dead-lettered runs, oldest first."""
    env = Environment.parse(env_name)
    rq = await open_queue(url)
    try:
        runs = await rq.dead_letters(env, limit=limit)
        total = (await rq.env_stats(env)).dead_lettered
    finally:
        await rq.close()
    table = Table(title=f"dead letters of {env} ({total})", title_justify="left")
    for name in ("Run", "Queue", "Key", "Attempts", "Dead-lettered at", "Payload"):
        table.add_column(name, overflow="fold")
    for r in runs:
        at = dt.datetime.fromtimestamp(r.dead_lettered_at_ms / 1000).strftime("%Y-%m-%d %H:%M:%S")
        payload = r.payload_json if len(r.payload_json) <= 60 else r.payload_json[:57] + "..."
        table.add_row(
            r.run_id, r.queue, escape(r.concurrency_key or ""), str(r.attempt), at, escape(payload)
        )
    Console(emoji=False, highlight=False, width=max(Console().width, 120)).print(table)


@command.command(name="redrive")
@click.argument("env_name", metavar="ENV")
@click.argument("run_ids", nargs=-1)
@click.option("--all", "redrive_all", is_flag=True, help="Redrive every dead-lettered run.")
@url_option
@run_async
async def redrive(
    env_name: str, run_ids: tuple[str, ...], redrive_all: bool, url: str | None
) -> None:
    """Move dead-lettered runs back to their queues (attempts reset to 0)."""
    if not run_ids and not redrive_all:
        raise click.UsageError("give RUN_ID... or --all")
    env = Environment.parse(env_name)
    rq = await open_queue(url)
    done, missing = 0, []
    try:
        ids = list(run_ids)
        if redrive_all:
            while True:
                batch = [r.run_id for r in await rq.dead_letters(env, limit=500)]
                batch = [r for r in batch if r not in ids]
                if not batch:
                    break
                for run_id in batch:
                    ids.append(run_id)
                    await rq.redrive(env, run_id)
                    done += 1
            ids = list(run_ids)
        for run_id in ids:
            try:
                await rq.redrive(env, run_id)
                done += 1
            except RunNotFoundError:
                missing.append(run_id)
    finally:
        await rq.close()
    click.echo(f"redrove {done} run(s)")
    if missing:
        raise click.ClickException(f"not in the dead-letter queue: {', '.join(missing)}")
