"""The simulator's priority levels on the real scripts: a group's ``priority`` is the level
its runs are enqueued at, the scenario's ``aging`` the queues' ``max_wait_promote``; the
reference models apply neither (and still serve every run)."""

from __future__ import annotations

import pytest

from fairq.sim.disciplines import parse_discipline
from fairq.sim.metrics import Record
from fairq.sim.runner import RunSpec, run_one
from fairq.sim.scenario import loads_scenario, resolve_scenario

# two groups with the same shape of work, both backlogged from step 0: without levels the
# fair order shares the slots between their four keys, so their waits are alike
CONTENDED = """
name = "levelsSmall"
grain = "ck"
env_concurrency = 2
hold_steps = 1
[[groups]]
name = "urgent"
keys = 2
{urgent}
messages_per_key = 20
arrival = {{ kind = "burst", start = 0 }}
[[groups]]
name = "bulk"
keys = 2
{bulk}
messages_per_key = 20
arrival = {{ kind = "burst", start = 0 }}
"""

# a level-3 stream that takes both slots on every step for 60 steps (each of its runs is
# served on arrival, so none waits long enough to move up), and a small level-5 group
STARVED = """
name = "agingSmall"
grain = "ck"
env_concurrency = 2
hold_steps = 1
{aging}
[[groups]]
name = "bulk"
keys = 2
messages_per_key = 60
arrival = {{ kind = "interval", start = 0, every = 1 }}
[[groups]]
name = "starved"
keys = 1
priority = 5
messages_per_key = 4
arrival = {{ kind = "burst", start = 1 }}
"""
AGING = 5


async def run(url: str, toml: str, discipline: str, seed: int = 0) -> Record:
    scenario = loads_scenario(toml, source="<levels>")
    record, trace = await run_one(url, RunSpec(scenario, parse_discipline(discipline), seed))
    assert record["served"] == record["enqueued"] and record["duplicates"] == 0, record
    assert not trace.truncated
    return record


@pytest.mark.parametrize("discipline", ["age", "sfq"])
async def test_a_level_1_group_waits_far_less_than_a_level_3_group(
    redis_url: str, discipline: str
) -> None:
    leveled = await run(
        redis_url, CONTENDED.format(urgent="priority = 1", bulk="priority = 3"), discipline
    )
    urgent, bulk = leveled["groups"]["urgent"], leveled["groups"]["bulk"]
    assert (urgent["priority"], bulk["priority"]) == (1, 3)
    # strict across levels: the 40 urgent runs take both slots for the first 20 steps
    assert urgent["max_wait"] < bulk["first_serve_step"] + 1
    assert urgent["mean_wait"] < 0.4 * bulk["mean_wait"]


async def test_without_levels_the_same_groups_wait_alike(redis_url: str) -> None:
    for seed in (0, 1):
        plain = await run(redis_url, CONTENDED.format(urgent="", bulk=""), "sfq", seed)
        urgent, bulk = plain["groups"]["urgent"], plain["groups"]["bulk"]
        assert "priority" not in urgent and "priority" not in bulk
        assert 0.8 < urgent["mean_wait"] / bulk["mean_wait"] < 1.25


@pytest.mark.parametrize("discipline", ["age", "sfq"])
async def test_aging_bounds_a_starved_level_5_groups_wait(redis_url: str, discipline: str) -> None:
    # without aging the level-5 group waits until the level-3 stream stops
    strict = await run(redis_url, STARVED.format(aging=""), discipline)
    assert strict["groups"]["starved"]["first_serve_step"] == 60
    assert strict["groups"]["starved"]["max_wait"] >= 59
    assert strict["groups"]["bulk"]["max_wait"] == 0
    # with aging its runs move up a level every AGING steps: they reach the stream's
    # level 3 after 2 x AGING and take their turn there (older than the stream's runs in
    # the age order, a new flow of the level in the fair order)
    aged = await run(redis_url, STARVED.format(aging=f"aging = {AGING}"), discipline)
    starved = aged["groups"]["starved"]
    assert starved["priority"] == 5 and aged["groups"]["bulk"]["priority"] == 3
    assert starved["first_serve_step"] == 1 + 2 * AGING
    assert starved["max_wait"] <= 2 * AGING + 4  # its 4 runs, one a step at least


@pytest.mark.parametrize("discipline", ["drr", "stride", "tsfq"])
async def test_a_model_enqueues_without_levels_and_says_so(redis_url: str, discipline: str) -> None:
    # the models serve the base level only: were their runs enqueued at levels 1 and 5
    # (or promoted), they would never be served and the run would report them lost
    record = await run(redis_url, STARVED.format(aging=f"aging = {AGING}"), discipline)
    assert record["discipline"] == f"{discipline} (not applied: priority, aging)"
    assert all("priority" not in g for g in record["groups"].values())
    # no level: the starved group is served beside the backlog from the start
    assert record["groups"]["starved"]["first_serve_step"] < 4 * AGING


async def test_the_builtin_priority_scenarios_show_the_levels_and_the_bound(
    redis_url: str,
) -> None:
    async def builtin(name: str, discipline: str) -> Record:
        spec = RunSpec(resolve_scenario(name), parse_discipline(discipline), 0)
        return (await run_one(redis_url, spec))[0]

    for discipline in ("age", "sfq"):
        urgent = await builtin("priorityUrgent", discipline)
        aging = await builtin("priorityAging", discipline)
        u = urgent["groups"]
        assert u["urgent"]["max_wait"] <= 1
        # strict: the batch starts once the bulk has nearly drained (the age order serves
        # a key once per call, so its last key's backlog leaves a slot to level 5)
        assert u["batch"]["first_serve_step"] >= 75
        a = aging["groups"]
        # the level-5 batch reaches level 1 after 4 bounds of 10 steps, and not before
        assert a["batch"]["first_serve_step"] == 40
        assert a["batch"]["max_wait"] < u["batch"]["max_wait"] - 25
