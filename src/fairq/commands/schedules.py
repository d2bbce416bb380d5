"""``fairq schedules module:app``: an app's schedules, their last tick and next runs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import click

from fairq.commands._common import run_async, url_option
from fairq.commands.worker import load_app


def _when(ms: int, zone: str) -> str:
    moment = datetime.fromtimestamp(ms / 1000, UTC).astimezone(ZoneInfo(zone))
    return moment.isoformat(sep=" ", timespec="seconds")


@click.command(name="schedules")
@click.argument("app_spec", metavar="MODULE:APP")
@url_option
@click.option("-n", "--next", "count", default=3, show_default=True, help="Next runs to show.")
@click.option(
    "--offline", is_flag=True, help="Do not ask the server (next runs by this machine's clock)."
)
@run_async
async def command(app_spec: str, url: str | None, count: int, offline: bool) -> None:
    """List the schedules of a fairq app and when they run next:
    `fairq schedules myproject.tasks:app`.

    Times are shown in each schedule's time zone; `last` is the last tick a worker
    enqueued (from the server).
    """
    from fairq.schedules import Scheduler

    if not 1 <= count <= 100:
        raise click.BadParameter("must be in 1..100", param_hint="--next")
    app = load_app(app_spec)
    if url:
        app.use_server(url)
    schedules = list(app.schedules.values())
    if not schedules:
        click.echo(f"{app_spec}: no schedules")
        return
    last: dict[str, int] = {}
    if offline:
        now = round(datetime.now(UTC).timestamp() * 1000)
    else:
        rq = await app.queue()
        try:
            now = await rq.server_time_ms()
            last = await rq.schedule_ticks(app.env, [s.name for s in schedules])
        finally:
            await app.aclose()
    upcoming = await asyncio.to_thread(Scheduler(app).upcoming, now, count=count)
    for s in schedules:
        rule = (
            f"cron {s.cron!r} ({s.timezone})" if s.cron else f"every {(s.every_ms or 0) / 1000:g}s"
        )
        click.echo(f"{s.name}: task {s.task.name} (queue {s.task.queue}), {rule}")
        click.echo(
            f"  catch-up {s.catch_up}" + (f" (max {s.max_catch_up})" if s.catch_up == "all" else "")
        )
        if not offline:
            click.echo(
                "  last: " + (_when(last[s.name], s.timezone) if s.name in last else "never")
            )
        for tick in upcoming[s.name]:
            click.echo(f"  next: {_when(tick, s.timezone)}")
