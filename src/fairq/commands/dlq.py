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


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


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
    for name in ("Run", "Queue", "Key", "Tenant", "Attempts", "Dead-lettered at", "Last error",
                 "Payload"):  # fmt: skip
        table.add_column(name, overflow="fold")
    for r in runs:
        at = dt.datetime.fromtimestamp(r.dead_lettered_at_ms / 1000).strftime("%Y-%m-%d %H:%M:%S")
        error, payload = _short(r.error or "", 80), _short(r.payload_json, 60)
        table.add_row(
            r.run_id, r.queue, escape(r.concurrency_key or ""), escape(r.tenant or ""),
            str(r.attempt), at, escape(error), escape(payload),
        )  # fmt: skip
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
        if redrive_all:
            # every run that is in the dead-letter queue now; one dead-lettered again
            # while this runs (a live worker) is not redriven twice
            seen: set[str] = set()
            while True:
                batch = [
                    d.run_id for d in await rq.dead_letters(env, limit=500) if d.run_id not in seen
                ]
                if not batch:
                    break
                for run_id in batch:
                    seen.add(run_id)
                    try:
                        await rq.redrive(env, run_id)
                        done += 1
                    except RunNotFoundError:
                        pass  # cancelled or redriven by someone else meanwhile
        for run_id in run_ids:
            if redrive_all and run_id in seen:
                continue
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
