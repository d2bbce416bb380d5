"""The simulator's priority fields: a group's ``priority``, the scenario's ``aging``, their
validation and which disciplines apply them (no server)."""

from __future__ import annotations

import pytest

from fairq.sim.disciplines import parse_discipline
from fairq.sim.driver import fields_in_use, group_levels, queue_levels, unapplied_fields
from fairq.sim.runner import discipline_label
from fairq.sim.scenario import ScenarioError, loads_scenario, resolve_scenario

LEVELS = """
grain = "ck"
aging = 10
[[groups]]
name = "urgent"
keys = 1
priority = 1
messages_per_key = 2
arrival = "backlog"
[[groups]]
name = "bulk"
keys = 2
messages_per_key = 3
arrival = "backlog"
"""


def _swap(old: str, new: str) -> str:
    assert LEVELS.count(old) == 1, old
    return LEVELS.replace(old, new)


def test_priority_and_aging_load_and_default_to_none() -> None:
    s = loads_scenario(LEVELS)
    assert s.aging == 10
    assert [(g.name, g.priority) for g in s.groups] == [("urgent", 1), ("bulk", None)]
    plain = loads_scenario(_swap("aging = 10\n", "").replace("priority = 1\n", ""))
    assert plain.aging is None and all(g.priority is None for g in plain.groups)
    assert fields_in_use(plain, parse_discipline("sfq")) == []


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        (_swap("priority = 1", "priority = 0"), "groups[0].priority", "must be in 1..9, got 0"),
        (_swap("priority = 1", "priority = 10"), "groups[0].priority", "must be in 1..9, got 10"),
        (_swap("priority = 1", 'priority = "x"'), "groups[0].priority",
         "must be an integer, got 'x'"),
        (_swap("priority = 1", "priority = 1.5"), "groups[0].priority", "must be an integer"),
        (_swap("priority = 1", "priority = true"), "groups[0].priority", "must be an integer"),
        (_swap("aging = 10", "aging = 0"), "aging", "must be in 1..10000000, got 0"),
        (_swap("aging = 10", "aging = -3"), "aging", "must be in 1..10000000"),
        (_swap("aging = 10", 'aging = "10s"'), "aging", "must be an integer, got '10s'"),
        (_swap("aging = 10", "aging = 2.5"), "aging", "must be an integer"),
        (_swap("aging = 10", "ageing = 10"), "ageing", "unknown field"),
    ],
)  # fmt: skip
def test_a_bad_priority_or_aging_is_refused(text: str, field: str, reason: str) -> None:
    with pytest.raises(ScenarioError) as info:
        loads_scenario(text, source="levels.toml")
    err = info.value
    assert (err.source, err.field) == ("levels.toml", field)
    assert reason in err.reason
    assert str(err).startswith(f"levels.toml: {field}: ")


def test_the_real_scripts_apply_the_levels_and_the_models_do_not() -> None:
    s = loads_scenario(LEVELS)
    for spec in ("age", "sfq", "codel:sfq", "codel:age"):
        d = parse_discipline(spec)
        assert fields_in_use(s, d) == ["priority", "aging"]
        assert unapplied_fields(s, d) == []
        assert discipline_label(s, d) == d.spec
    # the models serve the base level's runs only (dequeue_variant): not applied, and
    # their runs are enqueued without a level, so the record names no group's level
    for spec in ("drr", "stride", "tsfq", "stride:per_key_cap=1"):
        d = parse_discipline(spec)
        assert unapplied_fields(s, d) == ["priority", "aging"]
        assert discipline_label(s, d) == f"{d.spec} (not applied: priority, aging)"
        assert group_levels(s, d) == {}
    only_priority = loads_scenario(_swap("aging = 10\n", ""))
    assert discipline_label(only_priority, parse_discipline("drr")) == (
        "drr (not applied: priority)"
    )
    only_aging = loads_scenario(_swap("priority = 1\n", ""))
    assert discipline_label(only_aging, parse_discipline("stride")) == (
        "stride (not applied: aging)"
    )


def test_the_levels_a_run_reports_and_the_queues_levels() -> None:
    s = loads_scenario(LEVELS)
    # a group without a priority is at the queues' middle level (3 of the default 5)
    assert queue_levels(s) is None
    assert group_levels(s, parse_discipline("sfq")) == {"urgent": 1, "bulk": 3}
    # a level above 5 needs the queues' 9 levels, whose middle one is 5
    deep = loads_scenario(_swap("priority = 1", "priority = 9"))
    assert queue_levels(deep) == 9
    assert group_levels(deep, parse_discipline("age")) == {"urgent": 9, "bulk": 5}
    # aging alone: every group at the middle level
    aged = loads_scenario(_swap("priority = 1\n", ""))
    assert group_levels(aged, parse_discipline("age")) == {"urgent": 3, "bulk": 3}
    # neither: no level to report
    assert group_levels(resolve_scenario("ckSkew"), parse_discipline("sfq")) == {}


def test_the_builtin_priority_scenarios_set_their_levels() -> None:
    urgent = resolve_scenario("priorityUrgent")
    aging = resolve_scenario("priorityAging")
    levels = {"urgent": 1, "bulk": 3, "batch": 5}
    for s in (urgent, aging):
        assert {g.name: g.priority for g in s.groups} == levels
    assert (urgent.aging, aging.aging) == (None, 10)
    # the same workload: only aging differs
    assert urgent.groups == aging.groups
