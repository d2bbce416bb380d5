"""``fairq dlq``: list and redrive dead-lettered runs."""

from __future__ import annotations

from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from fairq.commands._common import (
    console,
    fmt_time,
    open_queue,
    parse_env,
    print_json,
    run_async,
    url_option,
    warn_if_unknown,
)
from fairq.errors import RunNotFoundError
from fairq.models import CancelOutcome, DeadLetter
from fairq.outcomes import RunStatus


@click.group(name="dlq")
def command() -> None:
    """Dead-lettered runs: `fairq dlq list ENV`, `fairq dlq redrive ENV RUN_ID... | --all`,
    `fairq dlq delete ENV RUN_ID...`."""


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def dead_letter_json(d: DeadLetter, traceback: str | None = None) -> dict[str, Any]:
    return {
        "run_id": d.run_id,
        "queue": d.queue,
        "concurrency_key": d.concurrency_key,
        "tenant": d.tenant,
        "attempts": d.attempt,
        "dead_lettered_at_ms": d.dead_lettered_at_ms,
        "error": d.error,
        "traceback": traceback,
        "payload": d.payload_json,
    }


@command.command(name="list")
@click.argument("env_name", metavar="ENV")
@click.option("--limit", default=100, show_default=True, help="Show at most this many.")
@click.option("--queue", default=None, help="Only the dead letters of this queue.")
@click.option(
    "-t", "--traceback", "tracebacks", is_flag=True,
    help="Also print each run's traceback (one read per run).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@url_option
@run_async
async def list_dead_letters(
    env_name: str, limit: int, queue: str | None, tracebacks: bool, as_json: bool, url: str | None
) -> None:
    """List an environment's dead-lettered runs, oldest first, with their last error."""
    env = parse_env(env_name)
    rq = await open_queue(url)
    traces: dict[str, str | None] = {}
    try:
        runs = await rq.dead_letters(env, limit=limit)
        if queue is not None:
            runs = [r for r in runs if r.queue == queue]
        total = (await rq.env_stats(env)).dead_lettered
        if not runs:
            await warn_if_unknown(rq, env, queue)
        if tracebacks or as_json:
            for r in runs:
                info = await rq.get_run(env, r.run_id)
                traces[r.run_id] = None if info is None else info.traceback
    finally:
        await rq.close()
    if as_json:
        print_json([dead_letter_json(r, traces.get(r.run_id)) for r in runs])
        return
    out = console()
    table = Table(title=f"dead letters of {env} ({total})", title_justify="left")
    for name in ("Run", "Queue", "Key", "Tenant", "Attempts", "Dead-lettered at", "Error",
                 "Payload"):  # fmt: skip
        table.add_column(name, overflow="fold", ratio=3 if name in ("Error", "Payload") else 1)
    for r in runs:
        error, payload = _short(r.error or "", 200), _short(r.payload_json, 120)
        table.add_row(
            r.run_id, escape(r.queue), escape(r.concurrency_key or ""), escape(r.tenant or ""),
            str(r.attempt), fmt_time(r.dead_lettered_at_ms), escape(error), escape(payload),
        )  # fmt: skip
    out.print(table)
    if tracebacks:
        for r in runs:
            out.rule(f"{r.run_id} ({r.queue})")
            out.print(escape((traces.get(r.run_id) or "(no traceback kept)").rstrip()),
                      soft_wrap=True)  # fmt: skip
    elif runs:
        click.echo("(tracebacks: fairq dlq list ENV --traceback, or fairq runs show ENV RUN_ID)")


@command.command(name="delete")
@click.argument("env_name", metavar="ENV")
@click.argument("run_ids", nargs=-1, required=True)
@url_option
@run_async
async def delete(env_name: str, run_ids: tuple[str, ...], url: str | None) -> None:
    """Remove dead-lettered runs for good (they end cancelled). Exits 1 when a run was
    not in the dead-letter queue."""
    env = parse_env(env_name)
    rq = await open_queue(url)
    missing = []
    try:
        for run_id in run_ids:
            # one script call that acts only on a dead letter: a run redriven meanwhile
            # (by another operator, say) stays queued
            outcome = await rq.cancel(env, run_id, only_if=RunStatus.DEAD_LETTERED)
            if outcome is not CancelOutcome.REMOVED_FROM_DLQ:
                missing.append(run_id)
    finally:
        await rq.close()
    click.echo(f"deleted {len(run_ids) - len(missing)} dead letter(s)")
    if missing:
        raise click.ClickException(f"not in the dead-letter queue: {', '.join(missing)}")


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
    env = parse_env(env_name)
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
