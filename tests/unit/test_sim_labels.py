"""Which scenario fields a run uses, and how its record's label names the ones the
driver did not apply (no server)."""

from __future__ import annotations

import pytest

from fairq.sim import driver
from fairq.sim.disciplines import parse_discipline
from fairq.sim.driver import fields_in_use, unapplied_fields
from fairq.sim.runner import discipline_label
from fairq.sim.scenario import builtin_scenarios, loads_scenario, resolve_scenario

EVERYTHING = """
grain = "ck"
borrow = true
charge = "duration"
[[groups]]
name = "a"
tenant = "t"
tenant_weight = 2
tenant_cap = 3
keys = 4
queues = 2
envs = 2
key_cap = 1
rate = 1.5
messages_per_key = 1
arrival = "backlog"
"""


def test_every_new_field_is_reported_in_schema_order() -> None:
    s = loads_scenario(EVERYTHING)
    names = [
        "tenant", "tenant_weight", "queues", "envs", "key_cap", "tenant_cap", "rate",
        "borrow", "charge",
    ]  # fmt: skip
    assert fields_in_use(s, parse_discipline("sfq")) == names
    # charging is the fair order's: age is not charged, and the option overrides
    assert fields_in_use(s, parse_discipline("age")) == names[:-1]
    assert fields_in_use(s, parse_discipline("sfq:charge=count")) == names[:-1]


def test_scenarios_without_the_new_fields_keep_their_labels() -> None:
    old = {
        "balanced", "adversarialSkew", "weighted", "burst", "longHold", "trickleStale",
        "ckSkew", "ckTrickle", "ckSybil", "ckBalanced", "ckHeavyIdle", "ckManyKeys",
        "ckStalledNewcomer", "ckLateLight", "ckFreshKeyFlood",
    }  # fmt: skip
    checked = 0
    for s in builtin_scenarios():
        if s.name not in old:
            # every newer scenario uses a new field under one of its disciplines
            assert any(fields_in_use(s, parse_discipline(d)) for d in s.disciplines)
            continue
        checked += 1
        for spec in s.disciplines:
            d = parse_discipline(spec)
            assert unapplied_fields(s, d) == []
            assert "not applied" not in discipline_label(s, d)
    assert checked == len(old)
    skew = resolve_scenario("ckSkew")
    assert discipline_label(skew, parse_discipline("age:per_key_cap=2")) == "age:per_key_cap=2"
    assert discipline_label(skew, parse_discipline("sfq:total_cap=2")) == (
        "sfq:total_cap=2 (total_cap driver-modelled)"
    )


def test_a_label_names_the_fields_the_driver_did_not_apply() -> None:
    queues = resolve_scenario("tenantQueues")
    assert discipline_label(queues, parse_discipline("age")) == (
        "age (not applied: tenant, queues)"
    )
    charge = resolve_scenario("chargeLongShort")
    assert discipline_label(charge, parse_discipline("sfq")) == "sfq"
    assert discipline_label(charge, parse_discipline("sfq:charge=duration")) == (
        "sfq:charge=duration (not applied: charge)"
    )
    borrow = resolve_scenario("borrowLoneKey")
    assert discipline_label(borrow, parse_discipline("sfq:total_cap=3")) == (
        "sfq:total_cap=3 (total_cap driver-modelled) (not applied: key_cap, borrow)"
    )


def test_a_field_the_driver_applies_leaves_the_label(monkeypatch: pytest.MonkeyPatch) -> None:
    s = loads_scenario(EVERYTHING)
    monkeypatch.setattr(driver, "NOT_APPLIED", ("rate",))
    assert unapplied_fields(s, parse_discipline("sfq")) == ["rate"]
    assert discipline_label(s, parse_discipline("sfq")) == "sfq (not applied: rate)"
    monkeypatch.setattr(driver, "NOT_APPLIED", ())
    assert discipline_label(s, parse_discipline("sfq")) == "sfq"
