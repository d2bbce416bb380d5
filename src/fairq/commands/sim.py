"""``fairq sim``: run fairness scenarios through the real scripts (see docs/simulator.md)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fairq.commands._common import run_async, url_option

if TYPE_CHECKING:
    from rich.console import Console

    from fairq.sim.driver import Trace
    from fairq.sim.metrics import Record
    from fairq.sim.runner import RunSpec
    from fairq.sim.scenario import Scenario


def _summary_rows(records: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Mean over seeds per (scenario, discipline): makespan, worst share, group waits."""
    acc: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        acc.setdefault((str(r["scenario"]), str(r["discipline"])), []).append(r)
    rows: list[tuple[str, ...]] = []
    for (scenario, discipline), rs in acc.items():
        n = len(rs)
        makespan = sum(r["makespan"] for r in rs) / n
        worst = sum(r["contention_worst_share"] for r in rs) / n
        waits = ", ".join(
            f"{g} {sum(r['groups'][g]['mean_wait'] for r in rs) / n:.1f}" for g in rs[0]["groups"]
        )
        lost = sum(r["enqueued"] - r["served"] for r in rs)
        dups = sum(r["duplicates"] for r in rs)
        rows.append(
            (scenario, discipline, f"{makespan:.0f}", f"{worst:.3f}", waits, f"{lost}/{dups}")
        )
    return rows


def _shards(text: str | None) -> list[int] | None:
    """``--shards 1,3,6`` as partition counts (each 1..64)."""
    if text is None:
        return None
    from fairq.sim.scenario import MAX_SHARDS

    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or not all(1 <= n <= MAX_SHARDS for n in counts):
        raise click.BadParameter(
            f"a comma-separated list of integers in 1..{MAX_SHARDS}", param_hint="--shards"
        )
    return counts


@click.command("sim")
@click.argument("scenarios", nargs=-1)
@click.option(
    "--discipline", "-d", "disciplines", multiple=True,
    help="Comma-separated specs: age, sfq[:opt=val,...], drr, stride, tsfq[:opt=val,...], "
    "codel:INNER. "
    "'table' = each scenario's own table. Default: age,sfq.",
)  # fmt: skip
@click.option("--seeds", default=1, show_default=True, type=click.IntRange(1, 1000),
              help="Run seeds 0..N-1.")  # fmt: skip
@click.option("--json", "json_path", type=click.Path(dir_okay=False, allow_dash=True),
              help="Write the records (a JSON list) to FILE ('-' = stdout).")  # fmt: skip
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False),
              help="Write one PNG per scenario (seed 0) into DIR.")  # fmt: skip
@click.option("--shards", "shards_text", default=None, metavar="S[,S...]",
              help="Run each scenario with its environments spread over each partition "
              "count (e.g. 1,3,6), to compare the shares. Default: the scenario's own.",
              )  # fmt: skip
@click.option("--list", "list_only", is_flag=True, help="List the built-in scenarios.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary table.")
@url_option
@run_async
async def command(
    scenarios: tuple[str, ...],
    disciplines: tuple[str, ...],
    seeds: int,
    json_path: str | None,
    plot_dir: str | None,
    list_only: bool,
    quiet: bool,
    url: str | None,
    shards_text: str | None,
) -> None:
    """Run SCENARIO... (built-in names or .toml files) under each discipline and seed.

    Without --url / FAIRQ_REDIS_URL the simulator starts its own private embedded Valkey,
    so runs are isolated and their JSON is reproducible. 'all' runs every built-in.
    """
    from rich.console import Console

    from fairq.sim.runner import plan

    console = Console(stderr=True)
    out = Console()
    if list_only:
        _list_scenarios(out)
        return
    if not scenarios:
        raise click.UsageError("name at least one SCENARIO (or 'all'), or use --list")
    chosen = _chosen_scenarios(scenarios)
    specs = _discipline_specs(disciplines)
    runs = plan(chosen, specs, seeds, _shards(shards_text))

    def keep(spec: RunSpec) -> bool:
        return plot_dir is not None and spec.seed == 0

    show = (not quiet and sys.stderr.isatty()) or (not quiet and len(runs) > 1)
    records, traces = await _run(url, runs, keep, console if show else None)
    if json_path:
        await _write_json(json_path, records)
    if plot_dir:
        _write_plots(traces, Path(plot_dir), console, quiet=quiet)
    if not quiet and json_path != "-":
        _print_summary(records, seeds, out)


def _list_scenarios(out: Console) -> None:
    """Print the built-in scenarios: name, grain, description and discipline table."""
    from fairq.sim.scenario import builtin_scenarios

    listed = builtin_scenarios()
    width = max(18, *(len(s.name) for s in listed))
    for s in listed:
        out.print(f"[bold]{s.name:<{width}}[/bold] {s.grain:<5} {s.description}", highlight=False)
        out.print(
            f"{'':<{width}} table: {' '.join(s.disciplines)}", highlight=False, soft_wrap=True
        )


def _chosen_scenarios(names: tuple[str, ...]) -> list[Scenario]:
    """The scenarios named (built-in names or .toml files; 'all' = every built-in)."""
    from fairq.sim.scenario import builtin_scenarios, resolve_scenario

    chosen: list[Scenario] = []
    for name in names:
        chosen.extend(builtin_scenarios() if name == "all" else [resolve_scenario(name)])
    return chosen


def _discipline_specs(disciplines: tuple[str, ...]) -> list[str] | None:
    """The ``--discipline`` specs, canonical; None for 'table' (each scenario's own)."""
    from fairq.sim.disciplines import DisciplineError, parse_discipline, split_discipline_list

    specs = split_discipline_list(list(disciplines) or ["age,sfq"])
    if specs == ["table"]:
        return None
    try:
        return [parse_discipline(s).spec for s in specs]
    except DisciplineError as exc:
        raise click.BadParameter(str(exc), param_hint="--discipline") from None


async def _run(
    url: str | None,
    runs: list[RunSpec],
    keep: Callable[[RunSpec], bool],
    console: Console | None,
) -> tuple[list[Record], dict[tuple[str, str, int], Trace]]:
    """Run every spec, with a progress bar on ``console`` when one is given."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fairq.sim.runner import run_all

    if console is None:
        return await run_all(url, runs, keep_traces=keep)
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console, transient=True,
    ) as progress:  # fmt: skip
        task = progress.add_task("simulating", total=len(runs))

        def done(spec: RunSpec, record: Record) -> None:
            progress.update(
                task, advance=1,
                description=f"{spec.scenario.name} {spec.discipline.spec} seed {spec.seed}",
            )  # fmt: skip

        return await run_all(url, runs, on_done=done, keep_traces=keep)


async def _write_json(json_path: str, records: list[dict[str, Any]]) -> None:
    """Write the records as a JSON list to ``json_path`` ('-' = stdout)."""
    text = json.dumps(records, indent=2, sort_keys=False) + "\n"
    if json_path == "-":
        sys.stdout.write(text)
    else:
        await asyncio.to_thread(Path(json_path).write_text, text, encoding="utf-8")


def _write_plots(
    traces: dict[tuple[str, str, int], Trace], plot_dir: Path, console: Console, *, quiet: bool
) -> None:
    """One PNG per scenario, of the traces kept (seed 0), into ``plot_dir``."""
    from fairq.sim.plots import plot_scenario

    by_scenario: dict[str, dict[str, Trace]] = {}
    for (scenario, label, _seed), trace in traces.items():
        by_scenario.setdefault(scenario, {})[label] = trace
    for scenario, per_label in by_scenario.items():
        path = plot_scenario(scenario, per_label, plot_dir)
        if not quiet:
            console.print(f"wrote {path}")


def _print_summary(records: list[dict[str, Any]], seeds: int, out: Console) -> None:
    """The summary table: means over seeds per scenario and discipline."""
    from rich.table import Table

    table = Table("scenario", "discipline", "makespan", "worst S/W", "mean wait per group",
                  "lost/dup", title=f"mean over {seeds} seed(s); waits in steps")  # fmt: skip
    for row in _summary_rows(records):
        table.add_row(*row)
    out.print(table)
