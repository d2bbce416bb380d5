"""Which scenario fields a run uses, and how its record's label names the ones the
driver did not apply or applies per base queue (no server)."""

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


def test_the_borrow_option_overrides_the_scenario() -> None:
    s = loads_scenario(EVERYTHING)
    assert "borrow" not in fields_in_use(s, parse_discipline("sfq:borrow=false"))
    skew = resolve_scenario("ckSkew")
    lent = parse_discipline("age:per_key_cap=2,borrow=true")
    assert lent.spec == "age:borrow=true,per_key_cap=2"
    assert lent.borrow(False) and not parse_discipline("age").borrow(False)
    assert fields_in_use(skew, lent) == ["borrow"]
    assert discipline_label(skew, lent) == "age:borrow=true,per_key_cap=2"
    with pytest.raises(ValueError, match="borrow='maybe' must be true or false"):
        parse_discipline("sfq:borrow=maybe")


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
    # a total cap is a real gate now (set_queue_total_concurrency): nothing to flag on
    # one queue
    assert discipline_label(skew, parse_discipline("sfq:total_cap=2")) == "sfq:total_cap=2"


def test_the_driver_applies_every_field() -> None:
    assert driver.NOT_APPLIED == ()
    for s in builtin_scenarios():
        for spec in s.disciplines:
            assert unapplied_fields(s, parse_discipline(spec)) == []


def test_a_label_names_the_fields_the_driver_did_not_apply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queues = resolve_scenario("tenantQueues")
    charge = resolve_scenario("chargeLongShort")
    borrow = resolve_scenario("borrowLoneKey")
    # every field applied: the labels carry nothing
    assert discipline_label(queues, parse_discipline("age")) == "age"
    assert discipline_label(charge, parse_discipline("sfq")) == "sfq"
    assert discipline_label(charge, parse_discipline("sfq:charge=duration")) == (
        "sfq:charge=duration"
    )
    assert discipline_label(borrow, parse_discipline("sfq:total_cap=3")) == "sfq:total_cap=3"
    # a driver that does not apply some fields names those a run uses
    monkeypatch.setattr(driver, "NOT_APPLIED", ("tenant", "queues", "key_cap", "borrow", "charge"))
    assert discipline_label(queues, parse_discipline("age")) == (
        "age (not applied: tenant, queues)"
    )
    assert discipline_label(charge, parse_discipline("sfq")) == "sfq"
    assert discipline_label(charge, parse_discipline("sfq:charge=duration")) == (
        "sfq:charge=duration (not applied: charge)"
    )
    assert discipline_label(borrow, parse_discipline("sfq:total_cap=3")) == (
        "sfq:total_cap=3 (not applied: key_cap, borrow)"
    )


def test_a_label_names_the_limits_the_server_applies_per_queue() -> None:
    # tenant t (capped at 3) has keys on 2 queues x 2 environments: each queue caps it
    s = loads_scenario(EVERYTHING)
    assert discipline_label(s, parse_discipline("sfq")) == "sfq (per queue: tenant_cap)"
    # a total cap over the 9 queues of tenantQueues is each queue's
    queues = resolve_scenario("tenantQueues")
    assert discipline_label(queues, parse_discipline("age:total_cap=2")) == (
        "age:total_cap=2 (per queue: total_cap)"
    )
    # grain queue: a rate of a key owning two queues is each queue's
    owner = loads_scenario(
        """
        grain = "queue"
        [[groups]]
        name = "owner"
        keys = 1
        queues_per_key = 2
        rate = 0.5
        messages_per_key = 4
        arrival = "backlog"
        """
    )
    assert discipline_label(owner, parse_discipline("age")) == "age (per queue: rate)"
    # on one queue nothing is flagged
    rated = resolve_scenario("rateLimited")
    assert discipline_label(rated, parse_discipline("sfq:total_cap=3")) == "sfq:total_cap=3"


def test_a_field_the_driver_applies_leaves_the_label(monkeypatch: pytest.MonkeyPatch) -> None:
    s = loads_scenario(EVERYTHING)
    monkeypatch.setattr(driver, "NOT_APPLIED", ("rate",))
    assert unapplied_fields(s, parse_discipline("sfq")) == ["rate"]
    assert discipline_label(s, parse_discipline("sfq")) == (
        "sfq (per queue: tenant_cap) (not applied: rate)"
    )
    monkeypatch.setattr(driver, "NOT_APPLIED", ())
    assert discipline_label(s, parse_discipline("sfq")) == "sfq (per queue: tenant_cap)"
