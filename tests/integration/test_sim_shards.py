"""The simulator's ``shards`` field: each environment of a scenario spread over S
partitions, through the real scripts, so the share deviation S brings shows beside S = 1.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from fairq.cli import main
from fairq.sim.disciplines import parse_discipline
from fairq.sim.runner import RunSpec, plan, run_one
from fairq.sim.scenario import ScenarioError, loads_scenario

WEIGHTED = loads_scenario(
    """
    name = "weightedSmall"
    grain = "ck"
    env_concurrency = 4
    hold_steps = 2
    [[groups]]
    name = "w1"
    keys = 2
    messages_per_key = 40
    arrival = "backlog"
    [[groups]]
    name = "w2"
    keys = 2
    weight = 2.0
    messages_per_key = 40
    arrival = "backlog"
    [[groups]]
    name = "w4"
    keys = 2
    weight = 4.0
    messages_per_key = 40
    arrival = "backlog"
    """,
    source="<weightedSmall>",
)


async def test_shares_with_shards_stay_near_the_single_partition_shares(redis_url: str) -> None:
    records = {}
    for shards in (1, 3, 6):
        spec = RunSpec(replace(WEIGHTED, shards=shards), parse_discipline("sfq"), 0)
        records[shards], _ = await run_one(redis_url, spec)
    assert records[3]["discipline"] == "sfq (shards 3)"
    for shards in (3, 6):
        assert records[shards]["served"] == records[1]["served"]  # nothing lost
        assert records[shards]["duplicates"] == 0
        for group in ("w1", "w2", "w4"):
            single = records[1]["groups"][group]["contention_share"]
            spread = records[shards]["groups"][group]["contention_share"]
            assert abs(spread - single) <= 0.05, (shards, group, single, spread)


def test_shards_is_validated() -> None:
    base = (
        'grain = "ck"\n[[groups]]\nname = "a"\nkeys = 1\nmessages_per_key = 1\n'
        'arrival = "backlog"\n'
    )
    assert loads_scenario(base, source="<ok>").shards == 1
    assert loads_scenario("shards = 6\n" + base, source="<ok>").shards == 6
    for bad in ("0", "65", "1.5", '"3"'):
        with pytest.raises(ScenarioError, match="shards"):
            loads_scenario(f"shards = {bad}\n" + base, source="<bad>")


def test_plan_runs_each_scenario_once_per_shard_count() -> None:
    runs = plan([WEIGHTED], ["sfq"], 1, [1, 3])
    assert [r.scenario.shards for r in runs] == [1, 3]


def test_the_cli_takes_a_list_of_shard_counts() -> None:
    bad = CliRunner().invoke(main, ["sim", "weighted", "--shards", "0,3"])
    assert bad.exit_code != 0 and "--shards" in bad.output
