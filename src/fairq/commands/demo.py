"""``fairq demo``: one noisy tenant, a few light ones, one queue — age order vs fair order.

The workload (all on ONE task queue, concurrency key = tenant, environment concurrency
limit 8, each run a short async sleep):

* ``big-corp`` has a large backlog, already queued (its runs carry old timestamps);
* five light tenants trigger a few runs each, arriving over the first second or so.

It runs twice through real :class:`fairq.worker.Worker` s on a private embedded Valkey
server (or ``--url``): first in age order (oldest run first, the fair-order flag off),
then in fair order (start-time fair queueing across keys). Each run measures its own wait
(start - trigger). In age order the light tenants wait behind the whole backlog; in fair
order they are served as soon as a slot frees.

Workers lease batches of 8 runs, and one call may take up to 8 runs of one key
(``max_per_key_per_call=8``; the fair order's default is the whole call anyway): each
batch then follows the order exactly, oldest heads first in age order, lowest virtual
tags first in fair order. (With the age order's default of one run per key per call, a
batch already mixes keys, which softens its starvation of a *few* keys; it still starves
a light key once keys outnumber the scan window, the "sybil" case ``fairq sim ckSybil``
shows.) The order is stored as each pass's environment's order on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import statistics
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fairq.app import Fairq
from fairq.config import RunQueueConfig
from fairq.errors import FairqError
from fairq.keys import Environment
from fairq.server import EmbeddedServer, connect
from fairq.store import RunQueue, wall_clock_ms
from fairq.tasks import Task, TriggerItem
from fairq.worker import Worker

#: The heavy tenant's name.
HEAVY = "big-corp"
#: The demo's task queue.
QUEUE = "reports"
#: Runs per dequeue call, and the most of them one key may take.
BATCH = 8


@dataclass(frozen=True, slots=True)
class Workload:
    """What the demo runs (the defaults are what the README shows)."""

    heavy_runs: int = 600
    light_tenants: int = 5
    light_runs: int = 20
    arrival_seconds: float = 1.0
    task_ms: int = 20
    env_concurrency: int = 8
    workers: int = 2
    seed: int = 7

    def light_names(self) -> list[str]:
        return [f"tenant-{chr(ord('a') + i)}" for i in range(self.light_tenants)]

    def arrivals(self) -> list[tuple[float, str]]:
        """(seconds after the start, tenant) of every light run, in time order (seeded)."""
        rng = random.Random(self.seed)
        out = [
            (rng.uniform(0.05, self.arrival_seconds), tenant)
            for tenant in self.light_names()
            for _ in range(self.light_runs)
        ]
        return sorted(out)


#: The README's workload.
DEFAULT_WORKLOAD = Workload()


@dataclass(slots=True)
class PassResult:
    """One pass: every run's wait (ms) by tenant, and how long the pass took."""

    order: str
    waits: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    runtime_s: float = 0.0


def p95(values: list[int]) -> float:
    """95th percentile (nearest rank)."""
    ordered = sorted(values)
    return float(ordered[max(0, round(0.95 * len(ordered)) - 1)]) if ordered else 0.0


def light_mean(result: PassResult) -> float:
    """Mean wait (ms) over every light tenant's runs."""
    values = [w for tenant, ws in result.waits.items() if tenant != HEAVY for w in ws]
    return statistics.fmean(values) if values else 0.0


async def run_pass(
    url: str,
    prefix: str,
    *,
    fair: bool,
    workload: Workload,
    progress: Progress | None,
) -> PassResult:
    """Queue the workload on a fresh environment and run it through real workers."""
    order = "fair" if fair else "age"
    env = Environment("demo", "saas", f"{order}-order")
    config = RunQueueConfig(prefix=prefix, shard_count=1, max_per_key_per_call=BATCH).with_vtime(
        enabled=fair
    )
    app = Fairq(env, url=url, config=config)
    tally = _Tally(
        PassResult(order),
        total=workload.heavy_runs + workload.light_tenants * workload.light_runs,
        progress=progress,
        bars=_progress_bars(progress, "fair order" if fair else "age order ", workload),
    )

    @app.task(queue=QUEUE)
    async def build_report(payload: dict[str, Any]) -> None:
        tally.started(payload["tenant"], wall_clock_ms() - int(payload["t"]))
        await asyncio.sleep(workload.task_ms / 1000)
        tally.finish()

    rq: RunQueue = await app.queue()
    await rq.set_env_limits(env, concurrency=workload.env_concurrency)
    # the order is the environment's, on the server: every process (a dashboard too) sees it
    await rq.set_env_options(env, order=order)
    started = time.monotonic()
    await _queue_backlog(build_report, workload)
    workers = _workers(app, workload)
    running = [asyncio.create_task(w.run()) for w in workers]
    producer = asyncio.create_task(_light_arrivals(build_report, workload, started))
    try:
        await producer
        await tally.all_done.wait()
        tally.result.runtime_s = time.monotonic() - started
    finally:
        producer.cancel()
        for w in workers:
            w.stop()
        await asyncio.gather(*running, return_exceptions=True)
        await app.aclose()
    return tally.result


@dataclass(slots=True)
class _Tally:
    """What one pass's runs record as they run: waits, progress, and when all are done."""

    result: PassResult
    total: int
    progress: Progress | None
    bars: dict[str, Any]
    finished: int = 0
    all_done: asyncio.Event = field(default_factory=asyncio.Event)

    def started(self, tenant: str, wait_ms: int) -> None:
        """A run of ``tenant`` started ``wait_ms`` after its trigger."""
        self.result.waits[tenant].append(wait_ms)
        if self.progress is not None:
            self.progress.advance(self.bars[HEAVY if tenant == HEAVY else "light"])

    def finish(self) -> None:
        """A run ended; the last one sets :attr:`all_done`."""
        self.finished += 1
        if self.finished >= self.total:
            self.all_done.set()


def _progress_bars(progress: Progress | None, label: str, workload: Workload) -> dict[str, Any]:
    """One bar for the heavy tenant and one for the light ones (none without ``progress``)."""
    bars: dict[str, Any] = {}
    if progress is not None:
        bars[HEAVY] = progress.add_task(f"{label} {HEAVY:<14}", total=workload.heavy_runs)
        bars["light"] = progress.add_task(
            f"{label} {workload.light_tenants} light tenants",
            total=workload.light_tenants * workload.light_runs,
        )
    return bars


async def _queue_backlog(build_report: Task[Any, None], workload: Workload) -> None:
    """Queue the heavy tenant's backlog: queued a minute ago, as far as the order is
    concerned."""
    t0 = wall_clock_ms()
    await build_report.trigger_many(
        [
            TriggerItem({"tenant": HEAVY, "t": t0}, concurrency_key=HEAVY, head_start=60)
            for _ in range(workload.heavy_runs)
        ]
    )


def _workers(app: Fairq, workload: Workload) -> list[Worker]:
    """The pass's workers (not yet running)."""
    # batches of BATCH runs, up to BATCH of one key: each batch follows the order exactly
    return [
        Worker(
            app,
            concurrency=workload.env_concurrency,
            max_count=BATCH,
            idle_timeout=0.25,
            grace_period=5,
        )
        for _ in range(workload.workers)
    ]


async def _light_arrivals(
    build_report: Task[Any, None], workload: Workload, started: float
) -> None:
    """Trigger the light tenants' runs at their arrival times (seconds after ``started``)."""
    for at, tenant in workload.arrivals():
        delay = started + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await build_report.trigger({"tenant": tenant, "t": wall_clock_ms()}, concurrency_key=tenant)


def summary_table(age: PassResult, fair: PassResult, workload: Workload) -> Table:
    """Per-tenant mean / p95 wait in both passes, and the ratio."""
    table = Table(title="wait before a run starts, ms", title_justify="left")
    table.add_column("Tenant", no_wrap=True)
    table.add_column("Runs", justify="right")
    for name in ("Age mean", "p95", "Fair mean", "p95", "Age/fair"):
        table.add_column(name, justify="right", no_wrap=True)

    def row(name: str, a: list[int], f: list[int], style: str = "") -> None:
        ma, mf = statistics.fmean(a), statistics.fmean(f)
        ratio = ma / mf if mf > 0 else float("inf")
        table.add_row(
            name, str(len(a)), f"{ma:.0f}", f"{p95(a):.0f}", f"{mf:.0f}", f"{p95(f):.0f}",
            f"{ratio:.1f}x", style=style,
        )  # fmt: skip

    row(HEAVY, age.waits[HEAVY], fair.waits[HEAVY])
    for tenant in workload.light_names():
        row(tenant, age.waits[tenant], fair.waits[tenant])
    light_a = [w for t in workload.light_names() for w in age.waits[t]]
    light_f = [w for t in workload.light_names() for w in fair.waits[t]]
    row("light (all)", light_a, light_f, style="bold")
    return table


def figures(
    age: PassResult, fair: PassResult, workload: Workload, runtime_s: float
) -> dict[str, Any]:
    """The demo's numbers, as written by ``--json``."""

    def per_tenant(r: PassResult) -> dict[str, Any]:
        return {
            t: {"runs": len(ws), "mean_wait_ms": statistics.fmean(ws), "p95_wait_ms": p95(ws)}
            for t, ws in sorted(r.waits.items())
        }

    age_light, fair_light = light_mean(age), light_mean(fair)
    return {
        "workload": asdict(workload),
        "age_order": {"runtime_s": age.runtime_s, "tenants": per_tenant(age)},
        "fair_order": {"runtime_s": fair.runtime_s, "tenants": per_tenant(fair)},
        "light_mean_wait_ms": {"age_order": age_light, "fair_order": fair_light},
        "light_mean_wait_ratio": age_light / fair_light if fair_light > 0 else None,
        "runtime_s": runtime_s,
    }


async def _cleanup(url: str, prefix: str) -> None:
    rq = RunQueue(await connect(url), RunQueueConfig(prefix=prefix, shard_count=1))
    try:
        await rq.purge()
    finally:
        await rq.close()


async def _serve_dashboard(url: str, prefix: str, port: int, console: Console) -> Any:
    """Start the dashboard on the demo's keys; None when it is not available."""
    try:
        from fairq.dashboard.app import create_server
    except ImportError as exc:
        console.print(f"[yellow]the dashboard is not available ({exc}); running without it[/]")
        return None
    rq = RunQueue(
        await connect(url), RunQueueConfig(prefix=prefix, shard_count=1).with_vtime(enabled=True)
    )
    server = create_server(rq, host="127.0.0.1", port=port, token=None)
    # Ctrl-C belongs to the demo (it stops the workers and the embedded server), not uvicorn
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    task = asyncio.create_task(server.serve())
    console.print(
        f"dashboard: [bold]http://127.0.0.1:{port}/[/] "
        "(environments demo:saas:age-order and demo:saas:fair-order)"
    )
    return server, task, rq


async def run_demo(
    url: str, workload: Workload, *, console: Console, dashboard_port: int | None, keep: bool
) -> dict[str, Any]:
    """Both passes, the table, and the figures."""
    prefix = f"fairqdemo{os.getpid()}x{random.randrange(1 << 30):x}"
    started = time.monotonic()
    served = (
        await _serve_dashboard(url, prefix, dashboard_port, console) if dashboard_port else None
    )
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            age = await run_pass(url, prefix, fair=False, workload=workload, progress=progress)
            fair = await run_pass(url, prefix, fair=True, workload=workload, progress=progress)
        runtime = time.monotonic() - started
        console.print(summary_table(age, fair, workload))
        data = figures(age, fair, workload, runtime)
        ratio = data["light_mean_wait_ratio"]
        console.print(
            f"Light tenants waited [bold]{light_mean(age):.0f} ms[/] on average in age order and "
            f"[bold]{light_mean(fair):.0f} ms[/] in fair order: "
            f"[bold green]{ratio:.1f}x[/] less, while {HEAVY}'s backlog still drained "
            f"({age.runtime_s:.1f} s vs {fair.runtime_s:.1f} s). Total {runtime:.1f} s."
        )
        if served is not None and keep:
            console.print("dashboard still running: press Ctrl-C to exit")
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()
        return data
    finally:
        if served is not None:
            server, task, rq = served
            server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 5)
            await rq.close()
        with contextlib.suppress(Exception):
            await _cleanup(url, prefix)


@click.command(name="demo")
@click.option(
    "--url",
    envvar="FAIRQ_REDIS_URL",
    default=None,
    help="Run on this server instead of a private embedded one (keys are removed after).",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures to this JSON file.")  # fmt: skip
@click.option("--dashboard", "with_dashboard", is_flag=True,
              help="Serve the dashboard while the demo runs (then until Ctrl-C).")  # fmt: skip
@click.option("--port", default=8765, show_default=True, help="Dashboard port.")
@click.option("--heavy-runs", default=DEFAULT_WORKLOAD.heavy_runs, show_default=True,
              help="Backlog of the heavy tenant.")  # fmt: skip
@click.option("--light-tenants", default=DEFAULT_WORKLOAD.light_tenants, show_default=True)
@click.option("--light-runs", default=DEFAULT_WORKLOAD.light_runs, show_default=True,
              help="Runs per light tenant.")  # fmt: skip
@click.option(
    "--task-ms", default=DEFAULT_WORKLOAD.task_ms, show_default=True, help="Duration of a run."
)
@click.option("--concurrency", default=DEFAULT_WORKLOAD.env_concurrency, show_default=True,
              help="Environment concurrency limit.")  # fmt: skip
def command(
    url: str | None,
    json_path: Path | None,
    with_dashboard: bool,
    port: int,
    heavy_runs: int,
    light_tenants: int,
    light_runs: int,
    task_ms: int,
    concurrency: int,
) -> None:
    """Show fair queueing in one minute, with no configuration.

    One tenant has a backlog of 600 runs; five light tenants trigger 20 runs each while
    it drains. All share one queue (concurrency key = tenant) under an environment
    limit of 8. The workload runs through real workers twice — age order, then fair
    order — and the table compares how long each tenant's runs waited.
    """
    workload = Workload(
        heavy_runs=heavy_runs, light_tenants=light_tenants, light_runs=light_runs,
        task_ms=task_ms, env_concurrency=concurrency,
    )  # fmt: skip
    console = Console(emoji=False, highlight=False)
    server: EmbeddedServer | None = None
    try:
        if url is None:
            console.print("starting a private embedded Valkey server…")
            server = EmbeddedServer().start()
            url = server.url
        data = asyncio.run(
            run_demo(
                url, workload, console=console,
                dashboard_port=port if with_dashboard else None, keep=with_dashboard,
            )
        )  # fmt: skip
    except FairqError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        raise click.Abort() from None
    finally:
        if server is not None:
            server.stop()
    if json_path is not None:
        json_path.write_text(json.dumps(data, indent=2) + "\n")
        console.print(f"figures written to {json_path}")
