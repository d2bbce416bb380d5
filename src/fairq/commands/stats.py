"""``fairq stats``: a terminal table of environments and queues (CK-aware counts)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from fairq.commands._common import (
    console,
    fmt_time,
    open_queue,
    parse_env,
    run_async,
    url_option,
    warn_if_unknown,
)
from fairq.dashboard.shares import format_amount, format_ratio, load_shares
from fairq.dashboard.views import Overview, QueueView, format_wait, load_overview
from fairq.keys import Environment
from fairq.store import Backlog, RunQueue


def _limit(value: int | None) -> str:
    return "-" if value is None or value >= 1_000_000_000 else str(value)


def _due(q: QueueView, now_ms: int) -> str:
    """Runs not due yet: the backlog's count when it was read (every queued run not due),
    else the queue's (known only while every queued run is), with when the first is due."""
    if q.backlog is not None and q.backlog.delayed and q.next_due_ms is None:
        return str(q.backlog.delayed)
    if not q.delayed:
        return ""
    if q.next_due_ms is None:
        return str(q.delayed)
    due = fmt_time(q.next_due_ms)[11:]
    return f"{q.delayed} (due {due}, in {format_wait((q.next_due_ms - now_ms) / 1000)})"


def _backlog(b: Backlog | None) -> tuple[str, str]:
    """Servable | Held (by gate) cells."""
    if b is None:
        return "", ""
    by = ", ".join(f"{gate} {n}" for gate, n in b.held.items() if n)
    return str(b.servable), f"{b.held_total} ({by})" if by else "0"


def _tag(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(data: Overview, *, breakdown: bool = False) -> Table:
    """The stats table (the same numbers as the dashboard's overview)."""
    table = Table(title="fairq queues", title_justify="left")
    table.add_column("Env", overflow="fold")
    table.add_column("Queue", overflow="fold")
    for name in ("Queued", "Running", "Limit", "Size limit"):  # queue limit: per key
        table.add_column(name, justify="right")
    table.add_column("Servable", justify="right")
    table.add_column("Held", overflow="fold")
    table.add_column("Delayed", overflow="fold")
    table.add_column("Order")
    table.add_column("Paused")
    for e in data.environments:
        table.add_row(
            f"[bold]{e.env}[/]",
            f"[dim](env; dead letters {e.dead_lettered})[/]",
            str(e.queued),
            str(e.running),
            f"{e.concurrency_limit}" + (f" x{e.burst_factor:g}" if e.burst_factor != 1 else ""),
            _limit(e.queue_size_limit),
            *_backlog(e.backlog),
            "",
            e.order,
            "",
        )
        for q in e.queues:
            table.add_row(
                "",
                escape(q.queue),
                str(q.queued),
                str(q.running),
                _limit(q.concurrency_limit),
                _limit(q.queue_size_limit),
                *_backlog(q.backlog),
                _due(q, data.now_ms),
                q.order,
                "[red]paused[/]" if q.paused else "",
            )
            if q.by_level:
                levels = "  ".join(f"{lv}: {n} / {r}" for lv, n, r in q.by_level)
                table.add_row("", f"  [dim]levels (queued / running)[/] {levels}", *[""] * 7)
            if breakdown:
                for v in q.variants:
                    key = f"  [dim]key[/] {escape(v.key or '(none)')}"
                    extra = ""
                    if q.order == "fair":
                        extra = f"tag {_tag(v.virtual_tag)} w {v.weight:g}"
                    cap = "" if v.cap is None else f"cap {v.cap}"
                    table.add_row(
                        "", key, str(v.queued), str(v.running), cap, "", "", "", "", extra, ""
                    )
    if not data.environments:
        table.caption = "no environments yet: trigger a run first"
    return table


def render_shares(env: str, queue: str, panel: dict[str, Any], *, keys: bool = False) -> Table:
    """One queue's shares received vs entitled (the dashboard panel's numbers)."""
    unit = panel["unit"]
    table = Table(title=f"{env} {queue}: received vs entitled ({unit})", title_justify="left")
    table.add_column("Tenant", overflow="fold")
    table.add_column("Received 5m", justify="right")
    table.add_column("Entitled 5m", justify="right")
    for window in panel["windows"]:
        table.add_column(f"Ratio {window // 60}m", justify="right")
    for r in panel["rows"]:
        ratios = [format_ratio(x) for x in r["ratio"]]
        table.add_row(escape(r["label"]), format_amount(r["received"][1]),
                      format_amount(r["entitled"][1]), *ratios)  # fmt: skip
        for k in r["keys"] if keys else ():
            label = f"  [dim]key[/] {escape(k['key'] or '(none)')}"
            table.add_row(label, format_amount(k["received"][1]), format_amount(k["entitled"][1]),
                          *[format_ratio(x) for x in k["ratio"]])  # fmt: skip
    other = panel["other"]
    if other:
        table.add_row(
            f"[dim]other ({other['count']} tenants)[/]",
            format_amount(other["received"][1]),
            format_amount(other["entitled"][1]),
            *[format_ratio(x) for x in other["ratio"]],
        )
    samples, unsampled = panel["samples"][1], panel["unsampled"][1]
    table.caption = f"samples in 5 min: {samples}" + (
        f"; received with no sample: {format_amount(unsampled)}" if unsampled else ""
    )
    if not panel["rows"]:
        table.caption += "; nothing received in the last 15 minutes"
    return table


async def show_tenants(
    rq: RunQueue, env: Environment, queue: str | None, *, keys: bool, as_json_flag: bool
) -> None:
    """``--tenants``: every queue of the environment (or ``queue``), received vs entitled."""
    queues = [queue] if queue else await rq.queues(env)
    panels = {name: await load_shares(rq, env, name) for name in queues}
    if as_json_flag:
        click.echo(json.dumps({"env": env.id, "queues": panels}, indent=2))
        return
    out = console()
    for name, panel in panels.items():
        out.print(render_shares(env.id, name, panel, keys=keys))
    if not panels:
        out.print(f"no queues in {env.id} yet")


def as_json(data: Overview) -> list[dict[str, Any]]:
    """Every environment with its queues and each queue's keys (``"keys"``)."""
    return [e.to_json(keys=True) for e in data.environments]


@click.command(name="stats")
@url_option
@click.option("--env", "env_name", default=None, help="Only this environment (org:project:env).")
@click.option("-k", "--keys", "breakdown", is_flag=True, help="Also list concurrency keys.")
@click.option("--json", "as_json_flag", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--tenants",
    is_flag=True,
    help="Shares received vs entitled per tenant (needs --env), over 1, 5 and 15 minutes.",
)
@click.option("--queue", default=None, help="With --tenants: only this queue.")
@click.option(
    "-w",
    "--watch",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Refresh every N seconds.",
)
@run_async
async def command(
    url: str | None,
    env_name: str | None,
    breakdown: bool,
    as_json_flag: bool,
    tenants: bool,
    queue: str | None,
    watch: float | None,
) -> None:
    """Show every environment's queues: Queued | Running | limit | size limit | servable
    (ready runs more workers could start now) | held (ready runs a cap, rate or pause
    holds, by gate) | delayed (with when the first is due) | order | paused.

    Counts include every concurrency key of a queue (keys busiest first with -k). The env
    row shows the env's own running count, concurrency limit (x burst factor) and default
    size limit; "-" means none. The same numbers as the dashboard's overview.

    With --tenants --env E: per queue of E (or --queue), what each tenant received (runs,
    or slot-seconds with charge = duration) and was entitled to while backlogged (its
    weight's share), and their ratio, over the last 1, 5 and 15 minutes; -k adds keys.
    """
    env = parse_env(env_name) if env_name else None
    if tenants and env is None:
        raise click.UsageError("--tenants needs --env org:project:env")
    if queue is not None and not tenants:
        raise click.UsageError("--queue goes with --tenants")
    rq = await open_queue(url)
    try:
        if env is not None:
            await warn_if_unknown(rq, env)
        if tenants and env is not None:
            await show_tenants(rq, env, queue, keys=breakdown, as_json_flag=as_json_flag)
            return
        if as_json_flag:
            data = await load_overview(rq, env=env, breakdown=True, backlog=True)
            click.echo(json.dumps(as_json(data), indent=2))
            return
        out = console()
        if watch is None:
            data = await load_overview(rq, env=env, breakdown=breakdown, backlog=True)
            out.print(render(data, breakdown=breakdown))
            return
        with Live(console=out, auto_refresh=False) as live:
            while True:
                data = await load_overview(rq, env=env, breakdown=breakdown, backlog=True)
                live.update(render(data, breakdown=breakdown), refresh=True)
                await asyncio.sleep(watch)
    finally:
        await rq.close()
