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
        "ckStalledNewcomer", "ckLateLight", "ckFreshKeyFlood", "tenantManyKeys",
        "tenantKeyFlood", "tenantQueues", "tenantTenThousandKeys", "tenantWeighted",
        "tenantJoinPolicy", "capHiddenKeys", "borrowLoneKey", "chargeLongShort", "rateLimited",
    ):  # fmt: skip
        assert required in names
    assert len(names) == len(set(names))
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


# --------------------------------------------------------------------------- tenants, limits

TENANTS = """
name = "tenants"
grain = "ck"
borrow = true
charge = "duration"
disciplines = ["age", "sfq:charge=duration"]

[[groups]]
name = "wide"
tenant = "acme"
tenant_weight = 3
tenant_cap = 4
keys = 6
queues = 3
envs = 2
key_cap = 1
rate = 0.5
rate_burst = 3
messages_per_key = 2
arrival = "backlog"

[[groups]]
name = "more"
tenant = "acme"
keys = 1
messages_per_key = 1
arrival = "backlog"

[[groups]]
name = "solo"
keys = 2
tenant_weight = 2
key_cap = 0
rate = 2
messages_per_key = 1
arrival = "backlog"
"""


def test_tenant_spread_limit_and_charge_fields_load() -> None:
    s = loads_scenario(TENANTS, source="<t>")
    wide, more, solo = s.groups
    assert (wide.tenant, wide.tenant_weight, wide.tenant_cap) == ("acme", 3.0, 4)
    assert (wide.queues, wide.envs, wide.key_cap) == (3, 2, 1)
    assert wide.rate is not None and (wide.rate.per_step, wide.rate.burst) == (0.5, 3)
    # a tenant's other groups inherit its weight and cap; rate_burst defaults to 1
    assert (more.tenant_weight, more.tenant_cap) == (None, None)
    assert (s.tenant_weight_of(more), s.tenant_cap_of(more)) == (3.0, 4)
    # a group without a tenant: a tenant per key, weighted tenant_weight (else weight)
    assert solo.tenant is None and s.tenant_weight_of(solo) == 2.0
    assert s.tenant_cap_of(solo) is None
    assert solo.key_cap == 0 and solo.rate is not None and solo.rate.burst == 1
    assert (s.borrow, s.charge) == (True, "duration")
    assert s.disciplines == ("age", "sfq:charge=duration")


def test_the_new_fields_default_to_todays_meaning() -> None:
    s = loads_scenario(GOOD, source="<good>")
    assert (s.borrow, s.charge) == (False, "count")
    for g in s.groups:
        assert (g.tenant, g.tenant_weight, g.key_cap, g.tenant_cap, g.rate) == (None,) * 5
        assert (g.queues, g.envs) == (1, 1)
    heavy, light = s.groups
    # a key that is its own tenant is weighted like the key
    assert (s.tenant_weight_of(heavy), s.tenant_weight_of(light)) == (1.0, 2.0)


def _swap(old: str, new: str, *, count: int = 1) -> str:
    assert TENANTS.count(old) >= count, old
    return TENANTS.replace(old, new, count)


BAD_TENANTS = [
    (_swap('tenant = "acme"', "tenant = 5"), "groups[0].tenant", "must be a string"),
    (_swap('tenant = "acme"', 'tenant = "a b"'), "groups[0].tenant", "is not a name"),
    (_swap('tenant = "acme"', 'tenant = "solo-1"'), "groups[0].tenant", "also a key"),
    (_swap("tenant_weight = 3", "tenant_weight = 0"), "groups[0].tenant_weight", "must be in"),
    (_swap("tenant_weight = 3", 'tenant_weight = "x"'), "groups[0].tenant_weight", "a number"),
    (
        _swap('tenant = "acme"\nkeys = 1', 'tenant = "acme"\ntenant_weight = 2\nkeys = 1'),
        "groups[1].tenant_weight", "same tenant_weight",
    ),
    (
        _swap('tenant = "acme"\nkeys = 1', 'tenant = "acme"\ntenant_cap = 5\nkeys = 1'),
        "groups[1].tenant_cap", "same tenant_cap",
    ),
    (_swap("tenant_cap = 4", "tenant_cap = -1"), "groups[0].tenant_cap", "0..1000000"),
    (_swap("queues = 3", "queues = 0"), "groups[0].queues", "1..1000"),
    (_swap("queues = 3", "queues = 4"), "groups[0].queues", "need at least 8 keys"),
    (_swap("envs = 2", "envs = 0"), "groups[0].envs", "1..1000"),
    (_swap("queues = 3", "queues = 1").replace("envs = 2", "envs = 7"), "groups[0].envs",
     "need at least 7 keys"),
    (_swap('grain = "ck"', 'grain = "queue"'), "groups[0].queues", "queues_per_key"),
    (_swap("key_cap = 1", "key_cap = -1"), "groups[0].key_cap", "0..1000000"),
    (_swap("key_cap = 1", "key_cap = 1.5"), "groups[0].key_cap", "must be an integer"),
    (_swap("rate = 0.5", "rate = 0"), "groups[0].rate", "must be in (0.0, 1000.0]"),
    (_swap("rate = 0.5", 'rate = "fast"'), "groups[0].rate", "must be a number"),
    (_swap("rate_burst = 3", "rate_burst = 0"), "groups[0].rate_burst", "1..1000000"),
    (_swap("rate = 0.5\n", ""), "groups[0].rate_burst", "needs rate"),
    (_swap("borrow = true", 'borrow = "yes"'), "borrow", "true or false"),
    (_swap("borrow = true", "borrow = 1"), "borrow", "true or false"),
    (_swap('charge = "duration"', 'charge = "time"'), "charge", '"count" or "duration"'),
    (_swap('"sfq:charge=duration"', '"sfq:charge=time"'), "disciplines[1]", "charge must be"),
    (_swap('"sfq:charge=duration"', '"age:charge=duration"'), "disciplines[1]",
     "unknown option"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "field", "reason"), BAD_TENANTS)
def test_a_bad_tenant_or_limit_field_is_rejected(text: str, field: str, reason: str) -> None:
    with pytest.raises(ScenarioError) as info:
        loads_scenario(text, source="tenants.toml")
    err = info.value
    assert (err.source, err.field) == ("tenants.toml", field)
    assert reason in err.reason


def test_a_tenant_named_like_a_key_beyond_the_groups_keys_is_fine() -> None:
    # solo has keys solo-0 and solo-1: "solo-2" and "solo-01" are no key's name
    for name in ("solo-2", "solo-01", "solo"):
        s = loads_scenario(TENANTS.replace('tenant = "acme"', f'tenant = "{name}"', 1))
        assert s.groups[0].tenant == name


def test_the_charge_option_overrides_the_scenarios_charge() -> None:
    assert parse_discipline("sfq:charge=duration").charge("count") == "duration"
    assert parse_discipline("sfq:charge=count").charge("duration") == "count"
    assert parse_discipline("sfq").charge("duration") == "duration"
    assert parse_discipline("codel:sfq:charge=duration").spec == "codel:sfq:charge=duration"
    assert split_discipline_list(["age,sfq:charge=duration,join=behind_leader"]) == [
        "age", "sfq:charge=duration,join=behind_leader",
    ]  # fmt: skip


POOLED = """
grain = "ck"
[[pools]]
name = "p1"
queues = [0]
slots = 1
[[pools]]
name = "p2"
queues = [1, 1]
slots = 2
[[groups]]
name = "a"
keys = 1
messages_per_key = 2
arrival = "backlog"
[[groups]]
name = "b"
keys = 2
queue = 1
messages_per_key = 2
arrival = "backlog"
"""


def test_pools_and_a_groups_queue_load() -> None:
    s = loads_scenario(POOLED)
    assert [(p.name, p.queues, p.slots) for p in s.pools] == [("p1", (0,), 1), ("p2", (1,), 2)]
    w = generate(s, 0)
    assert w.key_queues == {"a-0": ["work"], "b-0": ["work.q1"], "b-1": ["work.q1"]}
    assert loads_scenario(GOOD).pools == ()  # no pools: one consumer of every queue


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        (POOLED.replace("queues = [0]", "queues = [2]"), "pools", "no pool serves them"),
        (POOLED.replace('name = "p2"', 'name = "p1"'), "pools[1].name", "duplicate"),
        (POOLED.replace("slots = 1", "slots = 0"), "pools[0].slots", "1..100000"),
        (POOLED.replace("queues = [0]", "queues = []"), "pools[0].queues", "non-empty"),
        (POOLED.replace("slots = 1", "slots = 1\nqueue = 3"), "pools[0].queue", "unknown field"),
        (POOLED.replace("queue = 1", "queue = 1\nqueues = 2"), "groups[1].queue", "not both"),
        (POOLED.replace("keys = 1\n", "keys = 2\nenvs = 2\n", 1), "pools", "one environment"),
    ],
)
def test_a_bad_pool_or_queue_is_rejected(text: str, field: str, reason: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        loads_scenario(text)
    assert exc.value.field == field and reason in exc.value.reason


def test_the_two_level_model_takes_its_admission_and_pool_options() -> None:
    d = parse_discipline("tsfq:state=pool,admit=budget,free=2,newcomer_weight=0.5")
    assert d.spec == "tsfq:admit=budget,free=2,newcomer_weight=0.5,state=pool"
    for bad, reason in [
        ("tsfq:admit=later", "admit must be one of"), ("tsfq:state=queue", "state must be"),
        ("tsfq:newcomer_weight=0", "positive"), ("tsfq:join=floor", "unknown option"),
    ]:  # fmt: skip
        with pytest.raises(DisciplineError, match=reason):
            parse_discipline(bad)
