"""Run many simulations (scenarios x disciplines x seeds) on one server.

Without a URL the runner starts its own private :class:`fairq.server.EmbeddedServer`, so
a run shares the server with nothing else: its command counts are exact and its JSON is
reproducible byte for byte.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from fairq.server import EmbeddedServer, connect
from fairq.sim.disciplines import Discipline, parse_discipline
from fairq.sim.driver import Simulation, Trace, per_queue_fields, unapplied_fields
from fairq.sim.metrics import Record, record
from fairq.sim.scenario import Scenario
from fairq.sim.workload import Workload, generate

_run_counter = itertools.count()


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One run to do."""

    scenario: Scenario
    discipline: Discipline
    seed: int


def discipline_label(
    scenario: Scenario, discipline: Discipline, workload: Workload | None = None
) -> str:
    """The record's ``discipline``: the canonical spec plus the caps in force (every one
    a real gate on the server), the limits the server applies per base queue where the
    scenario's unit spans several (``(per queue: tenant_cap)``, see
    :func:`fairq.sim.driver.per_queue_fields`), and the scenario fields the driver did
    not apply (``(not applied: rate)``). ``workload``: the run's (default: seed 0's;
    where keys live does not depend on the seed)."""
    label = discipline.spec
    extra = []
    if scenario.per_key_cap and "per_key_cap" not in discipline.options:
        extra.append(f"per_key_cap={scenario.per_key_cap}")
    if scenario.total_cap and "total_cap" not in discipline.options:
        extra.append(f"total_cap={scenario.total_cap}")
    if extra:
        label += ("," if ":" in label.split("codel:")[-1] else ":") + ",".join(extra)
    per_queue = per_queue_fields(scenario, discipline, workload or generate(scenario, 0))
    if per_queue:
        label += f" (per queue: {', '.join(per_queue)})"
    unapplied = unapplied_fields(scenario, discipline)
    if unapplied:
        label += f" (not applied: {', '.join(unapplied)})"
    if scenario.shards > 1:
        label += f" (shards {scenario.shards})"
    return label


def plan(
    scenarios: Sequence[Scenario],
    disciplines: Sequence[str] | None,
    seeds: int,
    shards: Sequence[int] | None = None,
) -> list[RunSpec]:
    """Every run, in a stable order. ``disciplines`` None = each scenario's own table;
    ``shards``: run each scenario once per partition count (None: its own ``shards``)."""
    runs = []
    if shards:
        scenarios = [replace(scenario, shards=s) for scenario in scenarios for s in shards]
    for scenario in scenarios:
        specs = scenario.disciplines if disciplines is None else disciplines
        for spec in specs:
            d = parse_discipline(spec)
            for seed in range(seeds):
                runs.append(RunSpec(scenario, d, seed))
    return runs


async def run_one(url: str, spec: RunSpec) -> tuple[Record, Trace]:
    """One run on a fresh key prefix (deleted afterwards)."""
    client = await connect(url)
    prefix = f"sim{os.getpid()}x{next(_run_counter)}"
    try:
        sim = Simulation(client, spec.scenario, spec.discipline, spec.seed, prefix=prefix)
    except BaseException:
        await client.aclose()
        raise
    try:
        trace = await sim.run()
        await sim.cleanup()
    finally:
        await sim.rq.close()  # the client, and the store's own script connection
    rec = record(
        trace,
        scenario=spec.scenario.name,
        discipline=discipline_label(spec.scenario, spec.discipline, trace.workload),
        seed=spec.seed,
    )
    return rec, trace


async def run_all(
    url: str | None,
    runs: Sequence[RunSpec],
    *,
    on_done: Callable[[RunSpec, Record], None] | None = None,
    keep_traces: Callable[[RunSpec], bool] | None = None,
) -> tuple[list[Record], dict[tuple[str, str, int], Trace]]:
    """Run everything sequentially (on a private embedded server when ``url`` is None).

    Returns the records in run order and the traces ``keep_traces`` asked to keep.
    """
    if url is None:
        # started on this (the loop's) thread: the server is tied to the thread that
        # starts it (PR_SET_PDEATHSIG), and must live as long as the loop
        server = EmbeddedServer().start()  # a ~20 ms wait for PING
        try:
            return await run_all(server.url, runs, on_done=on_done, keep_traces=keep_traces)
        finally:
            await asyncio.to_thread(server.stop)
    records: list[Record] = []
    traces: dict[tuple[str, str, int], Trace] = {}
    for spec in runs:
        rec, trace = await run_one(url, spec)
        records.append(rec)
        if keep_traces is not None and keep_traces(spec):
            traces[(spec.scenario.name, rec["discipline"], spec.seed)] = trace
        if on_done is not None:
            on_done(spec, rec)
    return records, traces
