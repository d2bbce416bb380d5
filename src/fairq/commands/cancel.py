"""``fairq cancel``: cancel runs (queued, dead-lettered, or running: its worker stops it)."""

from __future__ import annotations

import click

from fairq.commands._common import open_queue, run_async, url_option
from fairq.keys import Environment
from fairq.models import CancelOutcome

_SAID = {
    CancelOutcome.CANCELLED: "cancelled (it will not run)",
    CancelOutcome.REMOVED_FROM_DLQ: "removed from the dead-letter queue",
    CancelOutcome.CANCEL_REQUESTED: "running: its worker was asked to stop it",
    CancelOutcome.ALREADY_FINISHED: "already finished: nothing to cancel",
    CancelOutcome.UNKNOWN: "unknown: not queued, running or dead-lettered",
    CancelOutcome.NOT_IN_STATE: "not in the state asked for: nothing changed",
}


@click.command(name="cancel")
@click.argument("env_name", metavar="ENV")
@click.argument("run_ids", nargs=-1, required=True)
@url_option
@run_async
async def command(env_name: str, run_ids: tuple[str, ...], url: str | None) -> None:
    """Cancel runs: `fairq cancel ENV RUN_ID...`. A queued or dead-lettered run is
    removed; a running run's worker is asked to stop it (it ends cancelled).

    Exits with status 1 when any run could not be cancelled.
    """
    env = Environment.parse(env_name)
    rq = await open_queue(url)
    failed = False
    try:
        for run_id in run_ids:
            outcome = await rq.cancel(env, run_id)
            click.echo(f"{run_id}: {_SAID[outcome]}")
            failed |= outcome in (CancelOutcome.ALREADY_FINISHED, CancelOutcome.UNKNOWN)
    finally:
        await rq.close()
    if failed:
        raise SystemExit(1)
