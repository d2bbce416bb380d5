"""``fairq runs``: one run in detail (``show``) and a queue's recently finished runs
(``recent``)."""

from __future__ import annotations

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
from fairq.dashboard.views import recent_to_json, run_to_json
from fairq.outcomes import RunStatus
from fairq.store import RunPosition


def position_rows(p: RunPosition) -> list[tuple[str, str]]:
    """A queued run's place, as rows of `runs show`."""
    rank = "-" if p.rank is None else f"{p.rank} of {p.ranked_among}"
    basis = "tenants by virtual tag" if p.order == "fair" else "flows by head age"
    higher = p.ahead_at_higher_levels or 0
    rows = [
        (
            "level",
            f"{p.level}" + (f" ({higher} ready runs of higher levels go first)" if higher else ""),
        ),
        ("ahead in flow", f"{p.ahead_in_flow} of {p.flow_queued} queued in its flow"),
        ("rank", f"{rank} ({basis})"),
        ("held by", "; ".join(_gate_text(g.describe(), g.until_ms) for g in p.gates) or "-"),
    ]
    if p.estimate is None:
        why = "paused" if any(g.name == "paused" for g in p.gates) else "no recent throughput"
        rows.append(("estimated start", f"- ({why})"))
    else:
        e = p.estimate
        rows.append((
            "estimated start",
            f"~{fmt_time(e.at_ms)} (estimate: {e.runs_before} "
            f"run{'' if e.runs_before == 1 else 's'} before it at "
            f"{e.throughput_per_s:.2f}/s over the last {e.window_ms // 1000} s)",
        ))  # fmt: skip
    return rows


def _gate_text(text: str, until_ms: int | None) -> str:
    return text if until_ms is None else f"{text} until {fmt_time(until_ms)}"


@click.group(name="runs")
def command() -> None:
    """Runs: `fairq runs show ENV RUN_ID`, `fairq runs recent ENV QUEUE`."""


@command.command(name="show")
@click.argument("env_name", metavar="ENV")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@url_option
@run_async
async def show(env_name: str, run_id: str, as_json: bool, url: str | None) -> None:
    """A run's status, payload, attempts, timings, key, tenant and last error with its
    traceback; a queued run's place: runs ahead of it in its flow, its tenant's rank, the
    gates holding it and an estimated start. Exits 1 when fairq knows nothing of the run."""
    env = parse_env(env_name)
    rq = await open_queue(url)
    position: RunPosition | None = None
    try:
        info = await rq.get_run(env, run_id)
        if info is None:
            await warn_if_unknown(rq, env)
        elif info.status is RunStatus.QUEUED:
            position = await rq.run_position(env, run_id)
    finally:
        await rq.close()
    if info is None:
        if as_json:
            print_json(None)
        raise click.ClickException(
            f"no run {run_id!r} in {env.id} (never enqueued, completed without a kept "
            "result, or its outcome's retention passed)"
        )
    if as_json:
        print_json({**run_to_json(info), "position": position and position.to_json()})
        return
    out = console()
    rows = [
        ("run", info.run_id), ("status", info.status.value), ("queue", info.queue or "-"),
        ("key", info.concurrency_key or "-"), ("tenant", info.tenant or "-"),
        ("attempts", str(info.attempts)), ("enqueued", fmt_time(info.enqueued_at_ms)),
        ("due", fmt_time(info.due_at_ms)), ("started", fmt_time(info.started_at_ms)),
        ("finished", fmt_time(info.finished_at_ms)),
        ("duration", "-" if info.duration_ms is None else f"{info.duration_ms} ms"),
    ]  # fmt: skip
    if info.cancel_requested:
        rows.append(("cancel", "requested"))
    if info.progress is not None:
        rows.append(("progress", f"{info.progress[0]:.0%} {info.progress[1]}".strip()))
    if info.payload_json is not None:
        rows.append(("payload", info.payload_json))
    if info.result is not None:
        rows.append(("result", repr(info.result)))
    if info.error:
        rows.append(("error", info.error))
    if position is not None and position.status is RunStatus.QUEUED:
        rows += position_rows(position)
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for name, value in rows:
        table.add_row(name, escape(value))
    out.print(table)
    if info.traceback:
        out.print("[bold]traceback[/]")
        out.print(escape(info.traceback.rstrip()), soft_wrap=True)


@command.command(name="recent")
@click.argument("env_name", metavar="ENV")
@click.argument("queue")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@url_option
@run_async
async def recent(env_name: str, queue: str, limit: int, as_json: bool, url: str | None) -> None:
    """A queue's most recently finished runs, newest first."""
    env = parse_env(env_name)
    rq = await open_queue(url)
    try:
        runs = await rq.recent_runs(env, queue, limit=limit)
        if not runs:
            await warn_if_unknown(rq, env, queue)
    finally:
        await rq.close()
    if as_json:
        print_json([recent_to_json(r) for r in runs])
        return
    table = Table(title=f"recent runs of {env.id} {queue}", title_justify="left")
    for name in ("Run", "Status", "Finished", "Attempts", "Duration", "Key", "Tenant"):
        table.add_column(name, overflow="fold", justify="right" if name == "Attempts" else "left")
    for r in runs:
        table.add_row(
            r.run_id, r.status.value, fmt_time(r.finished_at_ms), str(r.attempts),
            "-" if r.duration_ms is None else f"{r.duration_ms} ms",
            escape(r.concurrency_key or ""), escape(r.tenant or ""),
        )  # fmt: skip
    if not runs:
        table.caption = "no finished runs kept"
    console().print(table)
