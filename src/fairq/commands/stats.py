"""``fairq stats``: a terminal table of environments and queues (CK-aware counts)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from fairq.commands._common import open_queue, run_async, url_option
from fairq.keys import Environment
from fairq.models import EnvStats, QueueStats
from fairq.store import RunQueue


def _limit(value: int | None) -> str:
    return "-" if value is None or value >= 1_000_000_000 else str(value)


async def collect(
    rq: RunQueue, env: Environment | None, *, breakdown: bool = False
) -> list[tuple[EnvStats, list[QueueStats]]]:
    """Every (or one) environment's stats and its queues' stats."""
    envs = [env] if env is not None else await rq.environments()
    out = []
    for e in envs:
        names = await rq.queues(e)
        queues = await rq.queues_stats(e, names, breakdown=breakdown) if names else []
        out.append((await rq.env_stats(e), queues))
    return out


def render(data: list[tuple[EnvStats, list[QueueStats]]], *, breakdown: bool = False) -> Table:
    """The stats table."""
    table = Table(title="fairq queues", title_justify="left")
    for name in ("Env", "Queue"):
        table.add_column(name)
    for name in ("Queued", "Running", "Limit", "Size limit"):  # queue limit: per key
        table.add_column(name, justify="right")
    table.add_column("Paused")
    for env_stats, queues in data:
        table.add_row(
            f"[bold]{env_stats.env}[/]",
            f"[dim](env; dead letters {env_stats.dead_lettered})[/]",
            str(sum(q.queued for q in queues)),
            str(env_stats.running),
            f"{env_stats.concurrency_limit}"
            + (f" x{env_stats.burst_factor:g}" if env_stats.burst_factor != 1 else ""),
            _limit(env_stats.queue_size_limit),
            "",
        )
        for q in queues:
            table.add_row(
                "",
                q.queue,
                str(q.queued),
                str(q.running),
                _limit(q.concurrency_limit),
                _limit(q.queue_size_limit),
                "[red]paused[/]" if q.paused else "",
            )
            if breakdown:
                for v in q.variants:
                    key = f"  [dim]key[/] {escape(v.concurrency_key)}"
                    table.add_row("", key, str(v.queued), str(v.running), "", "", "")
    if not data:
        table.caption = "no environments yet: trigger a run first"
    return table


def as_json(data: list[tuple[EnvStats, list[QueueStats]]]) -> list[dict[str, Any]]:
    return [
        {
            "env": e.env.id,
            "running": e.running,
            "concurrency_limit": e.concurrency_limit,
            "burst_factor": e.burst_factor,
            "queue_size_limit": e.queue_size_limit,
            "dead_lettered": e.dead_lettered,
            "queues": [
                {
                    "queue": q.queue,
                    "queued": q.queued,
                    "running": q.running,
                    "concurrency_limit": q.concurrency_limit,
                    "queue_size_limit": q.queue_size_limit,
                    "paused": q.paused,
                    "keys": [
                        {"key": v.concurrency_key, "queued": v.queued, "running": v.running}
                        for v in q.variants
                    ],
                }
                for q in queues
            ],
        }
        for e, queues in data
    ]


@click.command(name="stats")
@url_option
@click.option("--env", "env_name", default=None, help="Only this environment (org:project:env).")
@click.option("-k", "--keys", "breakdown", is_flag=True, help="Also list concurrency keys.")
@click.option("--json", "as_json_flag", is_flag=True, help="Print JSON instead of a table.")
@click.option("-w", "--watch", type=float, default=None, help="Refresh every N seconds.")
@run_async
async def command(
    url: str | None,
    env_name: str | None,
    breakdown: bool,
    as_json_flag: bool,
    watch: float | None,
) -> None:
    """Show every environment's queues: Queued | Running | limit | size limit | paused.

    Counts include every concurrency key of a queue. The env row shows the env's own
    running count, concurrency limit (x burst factor) and default size limit.
    """
    env = Environment.parse(env_name) if env_name else None
    rq = await open_queue(url)
    try:
        if as_json_flag:
            click.echo(json.dumps(as_json(await collect(rq, env, breakdown=True)), indent=2))
            return
        console = Console(emoji=False, highlight=False)
        if watch is None:
            console.print(render(await collect(rq, env, breakdown=breakdown), breakdown=breakdown))
            return
        with Live(console=console, auto_refresh=False) as live:
            while True:
                data = await collect(rq, env, breakdown=breakdown)
                live.update(render(data, breakdown=breakdown), refresh=True)
                await asyncio.sleep(watch)
    finally:
        await rq.close()
