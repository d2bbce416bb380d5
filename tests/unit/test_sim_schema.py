"""The simulator's scenario schema and discipline specs (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fairq.sim.disciplines import DisciplineError, parse_discipline, split_discipline_list
from fairq.sim.scenario import (
    ScenarioError,
    builtin_names,
    builtin_scenarios,
    load_scenario_file,
    loads_scenario,
    resolve_scenario,
)
from fairq.sim.workload import BACKLOG_AGE_MS, generate, now_of

GOOD = """
name = "tiny"
grain = "ck"
env_concurrency = 2
max_count = 5
hold_steps = { kind = "uniform", min = 1, max = 3 }
per_key_cap = 1
disciplines = ["age", "sfq:join=behind_leader,arrival_cap=2", "codel:sfq"]

[[groups]]
name = "heavy"
keys = 1
messages_per_key = 20
arrival = "backlog"

[[groups]]
name = "light"
keys = 3
messages_per_key = 4
weight = 2
hold_steps = 2
arrival = { kind = "poisson", rate = 0.5, start = 2, stagger = 1.5 }
"""


def test_a_good_file_loads_with_every_field(tmp_path: Path) -> None:
    # Given a file using every kind of field
    path = tmp_path / "tiny.toml"
    path.write_text(GOOD)
    # When it is loaded
    s = load_scenario_file(path)
    # Then every value is there
    assert (s.name, s.grain, s.env_concurrency, s.max_count, s.per_key_cap) == (
        "tiny",
        "ck",
        2,
        5,
        1,
    )
    assert s.hold.kind == "uniform" and (s.hold.low, s.hold.high) == (1, 3)
    assert [g.name for g in s.groups] == ["heavy", "light"]
    light = s.groups[1]
    assert light.weight == 2.0 and light.arrival.kind == "poisson" and light.arrival.stagger == 1.5
    assert s.disciplines == ("age", "sfq:arrival_cap=2,join=behind_leader", "codel:sfq")
    assert s.total_messages == 32


def test_every_builtin_scenario_is_valid_and_listed() -> None:
    names = builtin_names()
    for required in (
        "balanced", "adversarialSkew", "weighted", "burst", "longHold", "trickleStale",
        "ckSkew", "ckTrickle", "ckSybil", "ckBalanced", "ckHeavyIdle", "ckManyKeys",
        "ckStalledNewcomer", "ckLateLight", "ckFreshKeyFlood",
    ):  # fmt: skip
        assert required in names
    assert {s.grain for s in builtin_scenarios()} == {"ck", "queue"}
    assert resolve_scenario("ckSkew").name == "ckSkew"


BAD = [
    ("colour = 1\n" + GOOD, "colour", "unknown field"),
    (GOOD.replace('grain = "ck"', 'grain = "tenant"'), "grain", 'must be "ck" or "queue"'),
    (GOOD.replace('grain = "ck"\n', ""), "grain", "required"),
    (GOOD.replace("env_concurrency = 2", "env_concurrency = 0"), "env_concurrency", "1..100000"),
    (GOOD.replace("max_count = 5", "max_count = 2.5"), "max_count", "must be an integer"),
    (GOOD.replace("rate = 0.5", "rate = -1"), "groups[1].arrival.rate", "must be in"),
    (GOOD.replace('kind = "poisson"', 'kind = "zipf"'), "groups[1].arrival.kind", "must be one of"),
    (GOOD.replace('arrival = "backlog"', 'arrival = "later"'), "groups[0].arrival", "backlog"),
    (GOOD.replace('arrival = "backlog"\n', ""), "groups[0].arrival", "required"),
    (GOOD.replace('name = "light"', 'name = "heavy"'), "groups[1].name", "duplicate"),
    (GOOD.replace("weight = 2", "weight = 0"), "groups[1].weight", "must be in"),
    (GOOD.replace("weight = 2", "queues_per_key = 3"), "groups[1].queues_per_key", "grain"),
    (GOOD.replace("weight = 2", "tenants = 3"), "groups[1].tenants", "unknown field"),
    (GOOD.replace('"codel:sfq"', '"wfq"'), "disciplines[2]", "unknown discipline"),
    (GOOD.replace("min = 1, max = 3", "min = 3, max = 1"), "hold_steps.max", ">= min"),
    (GOOD.replace("hold_steps = 2", "hold_steps = 0"), "groups[1].hold_steps", "1..1000000"),
    (GOOD.replace("[[groups]]", "[groupz]", 1), "groupz", "unknown field"),
    ('grain = "ck"\n', "groups", "required"),
    ("grain = ", "<toml>", "not valid TOML"),
]


@pytest.mark.parametrize(("text", "field", "reason"), BAD)
def test_a_bad_file_is_rejected_naming_file_field_and_reason(
    tmp_path: Path, text: str, field: str, reason: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario_file(path)
    err = info.value
    assert err.source == str(path)
    assert err.field == field
    assert reason in err.reason
    assert str(err).startswith(f"{path}: {field}: ")


def test_a_missing_file_or_unknown_name_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario_file(tmp_path / "nope.toml")
    with pytest.raises(ScenarioError, match="not a built-in scenario"):
        resolve_scenario("noSuchScenario")


def test_discipline_specs_parse_to_a_canonical_form() -> None:
    assert parse_discipline("age").spec == "age"
    assert parse_discipline("sfq:max_per_key_per_call=10").options == {"max_per_key_per_call": 10}
    d = parse_discipline("codel[target=3]:sfq:join=behind_leader")
    assert d.codel == {"target": 3} and d.name == "sfq"
    assert d.spec == "codel[target=3]:sfq:join=behind_leader"
    assert parse_discipline("codel:age").spec == "codel:age"
    for bad, reason in [
        ("wfq", "unknown discipline"), ("sfq:join=front", "join must be"),
        ("drr:window=3", "unknown option"), ("age:per_key_cap=-1", "non-negative"),
        ("codel", "inner"), ("codel:codel:age", "cannot wrap"), ("sfq:join", "name=value"),
    ]:  # fmt: skip
        with pytest.raises(DisciplineError, match=reason):
            parse_discipline(bad)


def test_a_discipline_list_keeps_options_with_their_spec() -> None:
    assert split_discipline_list(["age,sfq:join=behind_leader,arrival_cap=2", "drr"]) == [
        "age", "sfq:join=behind_leader,arrival_cap=2", "drr",
    ]  # fmt: skip


def test_arrival_shapes_follow_the_spikes() -> None:
    # Given a backlog group and a group arriving over time
    s = loads_scenario(GOOD, source="<test>")
    w = generate(s, seed=3)
    heavy = [m for m in w.messages if m.group == "heavy"]
    light = [m for m in w.messages if m.group == "light"]
    # Then the backlog arrives at step 0 with one shared old timestamp
    assert {m.arrival_step for m in heavy} == {0}
    assert {m.score_ms for m in heavy} == {now_of(0) - BACKLOG_AGE_MS}
    # and later arrivals carry their own later timestamps inside their step, staggered by key
    for m in light:
        assert now_of(m.arrival_step - 1) < m.score_ms <= now_of(m.arrival_step)
    starts = [min(m.arrival_step for m in light if m.key == f"light-{i}") for i in range(3)]
    assert starts == sorted(starts)
    # and the same seed gives the same workload, another seed another one
    assert [
        (m.run_id, m.arrival_step, m.score_ms, m.hold) for m in generate(s, seed=3).messages
    ] == [(m.run_id, m.arrival_step, m.score_ms, m.hold) for m in w.messages]
    assert [m.arrival_step for m in generate(s, seed=4).messages] != [
        m.arrival_step for m in w.messages
    ]
