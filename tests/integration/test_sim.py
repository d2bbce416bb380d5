"""The fairness simulator end to end on the real scripts (scaled-down scenarios; the
full tables are the benchmark, bench/fairness.py)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from fairq.sim.disciplines import parse_discipline
from fairq.sim.driver import Trace
from fairq.sim.metrics import Record
from fairq.sim.runner import RunSpec, run_one
from fairq.sim.scenario import Scenario, builtin_names, loads_scenario, resolve_scenario
from fairq.sim.workload import SimMessage

SKEW = loads_scenario(
    """
    name = "ckSkewSmall"
    grain = "ck"
    env_concurrency = 4
    hold_steps = 3
    [[groups]]
    name = "heavy"
    keys = 1
    messages_per_key = 60
    arrival = "backlog"
    [[groups]]
    name = "light"
    keys = 3
    messages_per_key = 5
    arrival = { kind = "poisson", rate = 0.3, start = 2 }
    """,
    source="<ckSkewSmall>",
)

SYBIL = loads_scenario(
    """
    name = "ckSybilSmall"
    grain = "ck"
    env_concurrency = 4
    hold_steps = 3
    [[groups]]
    name = "attacker"
    keys = 10
    messages_per_key = 5
    arrival = "backlog"
    [[groups]]
    name = "light"
    keys = 1
    messages_per_key = 6
    arrival = { kind = "poisson", rate = 0.3, start = 3 }
    """,
    source="<ckSybilSmall>",
)

TENANTS = loads_scenario(
    """
    name = "adversarialSkewSmall"
    grain = "queue"
    env_concurrency = 3
    hold_steps = 2
    [[groups]]
    name = "heavy"
    keys = 1
    queues_per_key = 5
    messages_per_key = 40
    arrival = "backlog"
    [[groups]]
    name = "light"
    keys = 2
    weight = 2
    messages_per_key = 6
    arrival = { kind = "interval", start = 1, every = 3, stagger = 1 }
    """,
    source="<adversarialSkewSmall>",
)


async def run(url: str, scenario: Scenario, discipline: str, seed: int = 0) -> Record:
    record, _trace = await run_one(url, RunSpec(scenario, parse_discipline(discipline), seed))
    return record


async def traced(
    url: str, scenario: Scenario, discipline: str, seed: int = 0
) -> tuple[Record, Trace]:
    return await run_one(url, RunSpec(scenario, parse_discipline(discipline), seed))


def assert_conserved(record: Record) -> None:
    assert record["served"] == record["enqueued"], record
    assert record["duplicates"] == 0, record
    assert sum(g["served"] for g in record["groups"].values()) == record["enqueued"]


def max_in_flight(trace: Trace, which: Callable[[SimMessage], bool] = lambda m: True) -> int:
    """The most runs (of those ``which`` picks) holding a slot on any one step."""
    change: Counter[int] = Counter()
    for m in trace.workload.messages:
        if which(m) and m.run_id in trace.serve_step:
            change[trace.serve_step[m.run_id]] += 1
            change[trace.release_step[m.run_id]] -= 1
    level = peak = 0
    for step in sorted(change):  # a release at a step frees its slot before that step's serve
        level += change[step]
        peak = max(peak, level)
    return peak


async def test_same_seed_gives_identical_json(redis_url: str) -> None:
    first = await run(redis_url, SKEW, "sfq", seed=5)
    second = await run(redis_url, SKEW, "sfq", seed=5)
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    other = await run(redis_url, SKEW, "sfq", seed=6)
    assert other["groups"] != first["groups"]


@pytest.mark.parametrize(
    "discipline",
    ["age", "sfq", "drr", "stride", "codel:age", "codel:sfq", "sfq:max_per_key_per_call=10",
     "age:per_key_cap=1", "sfq:per_key_cap=2,total_cap=2", "sfq:join=behind_leader"],
)  # fmt: skip
async def test_every_discipline_serves_every_message_exactly_once(
    redis_url: str, discipline: str
) -> None:
    record, trace = await traced(redis_url, SKEW, discipline)
    assert_conserved(record)
    assert record["commands_per_serve"] > 0
    if "total_cap" in discipline:
        # the total cap is the server's gate now (set_queue_total_concurrency), not the
        # driver's: the label says only what was set, and never were more than 2 running
        assert record["discipline"] == "sfq:per_key_cap=2,total_cap=2"
        assert max_in_flight(trace) == 2
    if "per_key_cap" in discipline:
        cap = 2 if "per_key_cap=2" in discipline else 1
        heavy = trace.workload.keys[0]
        assert max_in_flight(trace, lambda m: m.key == heavy) == cap


@pytest.mark.parametrize("discipline", ["age", "sfq", "drr", "stride", "codel:age"])
async def test_the_queue_grain_conserves_messages(redis_url: str, discipline: str) -> None:
    assert_conserved(await run(redis_url, TENANTS, discipline))


async def test_ck_skew_sfq_cuts_the_light_keys_wait_as_the_seed_reports(redis_url: str) -> None:
    # seed (spike 2): starved key's wait 1321 -> 16, contWorstS/W 0.187 -> 0.723
    for seed in (0, 1):
        age = await run(redis_url, SKEW, "age", seed)
        sfq = await run(redis_url, SKEW, "sfq", seed)
        assert sfq["groups"]["light"]["mean_wait"] <= 0.3 * age["groups"]["light"]["mean_wait"]
        assert sfq["contention_worst_share"] > age["contention_worst_share"]
        # the backlog key waits its turn instead of jumping the queue
        assert sfq["groups"]["heavy"]["mean_wait"] >= age["groups"]["heavy"]["mean_wait"]


async def test_ck_sybil_sfq_reaches_the_light_key_as_the_seed_reports(redis_url: str) -> None:
    # seed (spike 3): light wait 1765 -> 1009, contWorstS/W 0.000 -> 1.000
    for seed in (0, 1):
        age = await run(redis_url, SYBIL, "age", seed)
        sfq = await run(redis_url, SYBIL, "sfq", seed)
        assert sfq["groups"]["light"]["mean_wait"] <= 0.7 * age["groups"]["light"]["mean_wait"]
        assert sfq["groups"]["light"]["contention_share"] >= 0.5
        assert sfq["contention_worst_share"] > age["contention_worst_share"]
        assert (
            sfq["groups"]["light"]["first_serve_step"] < age["groups"]["light"]["first_serve_step"]
        )
        # a per-key cap does not fix the sharded case (spike 3: 1765 -> 1776)
        capped = await run(redis_url, SYBIL, "age:per_key_cap=2", seed)
        assert capped["groups"]["light"]["mean_wait"] > sfq["groups"]["light"]["mean_wait"]


async def test_reference_models_honour_weights_at_the_queue_grain(redis_url: str) -> None:
    age = await run(redis_url, TENANTS, "age")
    stride = await run(redis_url, TENANTS, "stride")
    assert stride["groups"]["light"]["mean_wait"] < age["groups"]["light"]["mean_wait"]
    assert stride["contention_worst_share"] > age["contention_worst_share"]


def test_the_cli_lists_runs_and_writes_json_and_plots(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fairq.commands.sim import command

    monkeypatch.setenv("FAIRQ_REDIS_URL", redis_url)
    runner = CliRunner()
    listed = runner.invoke(command, ["--list"])
    assert listed.exit_code == 0, listed.output
    assert "ckSybil" in listed.output and "trickleStale" in listed.output
    scenario = tmp_path / "mini.toml"
    scenario.write_text(
        'grain = "ck"\nenv_concurrency = 2\n'
        '[[groups]]\nname = "a"\nkeys = 1\nmessages_per_key = 6\narrival = "backlog"\n'
        '[[groups]]\nname = "b"\nkeys = 2\nmessages_per_key = 3\n'
        'arrival = { kind = "interval", start = 1, every = 2 }\n'
    )
    out = tmp_path / "out.json"
    result = runner.invoke(
        command,
        [str(scenario), "--discipline", "age,sfq:join=behind_leader,arrival_cap=2", "--seeds", "2",
         "--json", str(out), "--plot", str(tmp_path / "plots"), "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())
    assert [(r["scenario"], r["discipline"], r["seed"]) for r in records] == [
        ("mini", "age", 0), ("mini", "age", 1),
        ("mini", "sfq:arrival_cap=2,join=behind_leader", 0),
        ("mini", "sfq:arrival_cap=2,join=behind_leader", 1),
    ]  # fmt: skip
    assert set(records[0]) == {
        "scenario", "discipline", "seed", "groups", "tenants", "makespan",
        "contention_worst_share", "worst_key_mean_wait", "enqueued", "served", "duplicates",
        "commands_per_serve",
    }  # fmt: skip
    assert set(records[0]["groups"]["a"]) == {
        "mean_wait", "p50_wait", "p99_wait", "max_wait", "first_serve_step", "served",
        "contention_share", "slot_share",
    }  # fmt: skip
    assert (tmp_path / "plots" / "mini.png").stat().st_size > 1000
    bad = runner.invoke(command, [str(scenario), "--discipline", "wfq"])
    assert bad.exit_code != 0 and "unknown discipline" in bad.output
    broken = tmp_path / "broken.toml"
    broken.write_text(
        'grain = "ck"\n[[groups]]\nname = "a"\nkeys = 0\n'
        'messages_per_key = 1\narrival = "backlog"\n'
    )
    bad = runner.invoke(command, [str(broken)])
    assert bad.exit_code != 0 and "groups[0].keys" in bad.output


# ------------------------------------------------------------------ the fields the driver applies

TENANTS_WIDE = loads_scenario(
    """
    name = "tenantManyKeysSmall"
    grain = "ck"
    env_concurrency = 4
    hold_steps = 3
    [[groups]]
    name = "wide"
    tenant = "wide"
    keys = 12
    messages_per_key = 5
    arrival = "backlog"
    [[groups]]
    name = "narrow"
    tenant = "narrow"
    keys = 1
    messages_per_key = 30
    arrival = "backlog"
    """,
    source="<tenantManyKeysSmall>",
)


async def test_tenants_make_a_many_key_tenant_one_share(redis_url: str) -> None:
    # the same old timestamp everywhere: the age order serves by key, the one-key tenant
    # gets at most one run per call; the fair order halves the slots between tenants
    age, age_trace = await traced(redis_url, TENANTS_WIDE, "age")
    sfq, sfq_trace = await traced(redis_url, TENANTS_WIDE, "sfq")
    for record in (age, sfq):
        assert_conserved(record)
    narrow_age, narrow_sfq = age["tenants"]["narrow"], sfq["tenants"]["narrow"]
    assert narrow_sfq["slot_share"] >= 0.9
    assert narrow_age["slot_share"] <= 0.6
    assert narrow_sfq["mean_wait"] <= 0.7 * narrow_age["mean_wait"]
    # the run carried its tenant: half of the 4 slots while both tenants contend
    assert max_in_flight(sfq_trace, lambda m: m.tenant == "narrow") == 2
    assert max_in_flight(age_trace, lambda m: m.tenant == "narrow") == 3  # 1 per call, held 3


WEIGHTED_TENANTS = loads_scenario(
    """
    name = "tenantWeightedSmall"
    grain = "ck"
    env_concurrency = 4
    hold_steps = 2
    [[groups]]
    name = "low"
    tenant = "low"
    tenant_weight = 1
    keys = 2
    messages_per_key = 30
    arrival = "backlog"
    [[groups]]
    name = "high"
    tenant = "high"
    tenant_weight = 3
    keys = 2
    messages_per_key = 30
    arrival = "backlog"
    """,
    source="<tenantWeightedSmall>",
)


async def test_tenant_weights_reach_the_fair_order(redis_url: str) -> None:
    sfq, trace = await traced(redis_url, WEIGHTED_TENANTS, "sfq")
    assert_conserved(sfq)
    high, low = sfq["tenants"]["high"], sfq["tenants"]["low"]
    assert (high["weight"], low["weight"]) == (3.0, 1.0)
    # entitled to 3/4 of the slots while both contend: it gets that (and drains first)
    assert 0.9 <= high["slot_share"] <= 1.1
    assert max_in_flight(trace, lambda m: m.tenant == "high") == 3
    assert high["mean_wait"] < low["mean_wait"]
    age = await run(redis_url, WEIGHTED_TENANTS, "age")
    assert age["tenants"]["high"]["slot_share"] < 0.8


SPREAD = loads_scenario(
    """
    name = "spreadSmall"
    grain = "ck"
    env_concurrency = 4
    hold_steps = 3
    [[groups]]
    name = "spread"
    tenant = "spread"
    keys = 6
    queues = 3
    messages_per_key = 8
    arrival = "backlog"
    [[groups]]
    name = "single"
    tenant = "single"
    keys = 1
    messages_per_key = 24
    arrival = { kind = "interval", start = 1, every = 1 }
    """,
    source="<spreadSmall>",
)


async def test_runs_go_to_their_queues_and_the_fair_order_spans_them(redis_url: str) -> None:
    for discipline in ("age", "sfq", "drr"):
        record, trace = await traced(redis_url, SPREAD, discipline)
        assert_conserved(record)
        # every message was enqueued to, and served from, its own environment and queue
        assert {m.run_id: (m.env.id, m.queue) for m in trace.workload.messages} == (
            trace.served_from
        )
        assert len(set(trace.served_from.values())) == 3
    age = await run(redis_url, SPREAD, "age")
    sfq = await run(redis_url, SPREAD, "sfq")
    # spreading over three queues buys the spread tenant nothing under the fair order
    assert sfq["tenants"]["single"]["slot_share"] >= 0.9
    assert sfq["tenants"]["single"]["mean_wait"] < age["tenants"]["single"]["mean_wait"]


ENVS = loads_scenario(
    """
    name = "envsSmall"
    grain = "ck"
    env_concurrency = 2
    hold_steps = 2
    [[groups]]
    name = "a"
    keys = 4
    envs = 2
    messages_per_key = 6
    arrival = "backlog"
    [[groups]]
    name = "b"
    keys = 2
    envs = 2
    queues = 1
    messages_per_key = 5
    arrival = { kind = "poisson", rate = 0.5, start = 1 }
    """,
    source="<envsSmall>",
)


@pytest.mark.parametrize("discipline", ["age", "sfq", "stride"])
async def test_several_environments_are_dequeued_together(redis_url: str, discipline: str) -> None:
    record, trace = await traced(redis_url, ENVS, discipline)
    assert_conserved(record)
    assert {m.run_id: (m.env.id, m.queue) for m in trace.workload.messages} == trace.served_from
    envs = {m.env for m in trace.workload.messages}
    assert len(envs) == 2
    # each environment has its own limit of 2: together 4 run at once, never more
    for env in envs:
        assert max_in_flight(trace, lambda m, env=env: m.env == env) == 2
    assert max_in_flight(trace) == 4


CAPS = loads_scenario(
    """
    name = "capsSmall"
    grain = "ck"
    env_concurrency = 20
    hold_steps = 1
    per_key_cap = 3
    [[groups]]
    name = "capped"
    keys = 6
    key_cap = 1
    messages_per_key = 4
    hold_steps = 6
    arrival = "backlog"
    [[groups]]
    name = "free"
    keys = 1
    key_cap = 0
    messages_per_key = 20
    arrival = "backlog"
    [[groups]]
    name = "zquick"
    keys = 2
    messages_per_key = 6
    arrival = { kind = "poisson", rate = 0.5, start = 2 }
    """,
    source="<capsSmall>",
)


@pytest.mark.parametrize("discipline", ["age:max_per_key_per_call=10", "sfq", "drr"])
async def test_key_caps_are_the_servers(redis_url: str, discipline: str) -> None:
    record, trace = await traced(redis_url, CAPS, discipline)
    assert_conserved(record)
    capped = [k for k in trace.workload.keys if k.startswith("capped")]
    for key in capped:
        assert max_in_flight(trace, lambda m, key=key: m.key == key) == 1
    # the others keep per_key_cap
    assert max_in_flight(trace, lambda m: m.key == "free-0") >= 3
    for key in ("zquick-0", "zquick-1"):
        assert max_in_flight(trace, lambda m, key=key: m.key == key) <= 3
    # the capped keys' long runs do not hold the quick keys back
    assert record["groups"]["zquick"]["max_wait"] <= 2


@pytest.mark.parametrize("discipline", ["age:max_per_key_per_call=10", "sfq"])
async def test_a_key_cap_of_0_lifts_the_per_key_cap(redis_url: str, discipline: str) -> None:
    record, trace = await traced(redis_url, CAPS, discipline)
    assert_conserved(record)
    # key_cap 0: no cap for that key, above the scenario's per_key_cap of 3
    assert max_in_flight(trace, lambda m: m.key == "free-0") > 3


TENANT_CAP = loads_scenario(
    """
    name = "tenantCapSmall"
    grain = "ck"
    env_concurrency = 8
    hold_steps = 3
    [[groups]]
    name = "acme"
    tenant = "acme"
    tenant_cap = 2
    keys = 5
    messages_per_key = 6
    arrival = "backlog"
    [[groups]]
    name = "other"
    keys = 2
    messages_per_key = 6
    arrival = "backlog"
    """,
    source="<tenantCapSmall>",
)


@pytest.mark.parametrize("discipline", ["age", "sfq", "stride"])
async def test_a_tenant_cap_bounds_all_its_keys(redis_url: str, discipline: str) -> None:
    record, trace = await traced(redis_url, TENANT_CAP, discipline)
    assert_conserved(record)
    assert record["discipline"] == discipline  # one queue: the cap is exactly the tenant's
    assert max_in_flight(trace, lambda m: m.tenant == "acme") == 2
    # the slots it cannot use go to the others
    assert max_in_flight(trace) > 2


RATE = loads_scenario(
    """
    name = "rateSmall"
    grain = "ck"
    env_concurrency = 4
    hold_steps = 1
    [[groups]]
    name = "limited"
    keys = 1
    rate = 0.5
    rate_burst = 2
    messages_per_key = 20
    arrival = "backlog"
    [[groups]]
    name = "free"
    keys = 1
    messages_per_key = 20
    arrival = "backlog"
    """,
    source="<rateSmall>",
)


@pytest.mark.parametrize("discipline", ["age", "sfq"])
async def test_a_rate_limit_bounds_how_fast_a_key_starts(redis_url: str, discipline: str) -> None:
    record, trace = await traced(redis_url, RATE, discipline)
    assert_conserved(record)
    starts = Counter(
        trace.serve_step[m.run_id] for m in trace.workload.messages if m.group == "limited"
    )
    steps = sorted(starts)
    # a token bucket of 2 refilled at 0.5 per step (one step = 1 s of the server's clock)
    for i, a in enumerate(steps):
        for b in steps[i:]:
            assert sum(starts[s] for s in steps if a <= s <= b) <= 2 + 0.5 * (b - a)
    assert starts[0] + starts[1] == 2  # the burst was used (the rate alone allows 1.5)
    # 20 runs at half a run per step take about 36 steps; the free key is done long before
    assert steps[-1] >= 35
    free_done = max(
        trace.serve_step[m.run_id] for m in trace.workload.messages if m.group == "free"
    )
    assert free_done + 10 < steps[-1]


BORROW = """
name = "borrowSmall"
grain = "ck"
env_concurrency = 4
hold_steps = 3
borrow = {borrow}
[[groups]]
name = "lone"
keys = 1
key_cap = 2
messages_per_key = 24
arrival = "backlog"
"""


async def test_borrowing_lets_a_lone_capped_key_use_idle_slots(redis_url: str) -> None:
    strict, strict_trace = await traced(
        redis_url, loads_scenario(BORROW.format(borrow="false")), "sfq"
    )
    lent, lent_trace = await traced(redis_url, loads_scenario(BORROW.format(borrow="true")), "sfq")
    for record in (strict, lent):
        assert_conserved(record)
    assert max_in_flight(strict_trace) == 2
    assert max_in_flight(lent_trace) == 4
    assert lent["makespan"] < 0.7 * strict["makespan"]


CHARGE_TOML = """
    name = "chargeSmall"
    grain = "ck"
    env_concurrency = 4
    hold_steps = 1
    {charge}
    [[groups]]
    name = "long"
    keys = 1
    messages_per_key = 12
    hold_steps = 10
    arrival = "backlog"
    [[groups]]
    name = "short"
    keys = 3
    messages_per_key = 40
    arrival = "backlog"
    """
CHARGE = loads_scenario(CHARGE_TOML.format(charge=""), source="<chargeSmall>")


async def test_duration_charging_shares_slot_time(redis_url: str) -> None:
    count = await run(redis_url, CHARGE, "sfq")
    duration = await run(redis_url, CHARGE, "sfq:charge=duration")
    scenario_wide = await run(
        redis_url, loads_scenario(CHARGE_TOML.format(charge='charge = "duration"')), "sfq"
    )
    for record in (count, duration, scenario_wide):
        assert_conserved(record)
    long_count, long_duration = count["groups"]["long"], duration["groups"]["long"]
    # charged per run, the long key holds far more than its share of slot time; charged
    # by run time, much closer to it (and it waits longer for its runs)
    assert long_count["slot_share"] > 2.0
    assert long_duration["slot_share"] < 0.6 * long_count["slot_share"]
    assert long_duration["mean_wait"] > long_count["mean_wait"]
    assert duration["groups"]["short"]["mean_wait"] < count["groups"]["short"]["mean_wait"]
    # the scenario's charge does the same as the discipline's option
    assert scenario_wide["groups"] == duration["groups"]
    # and the age order charges nothing: the field does not change it
    aged = await run(
        redis_url, loads_scenario(CHARGE_TOML.format(charge='charge = "duration"')), "age"
    )
    assert aged["groups"] == (await run(redis_url, CHARGE, "age"))["groups"]


@pytest.mark.slow
@pytest.mark.single_server
@pytest.mark.parametrize("name", builtin_names())
async def test_every_builtin_scenario_serves_every_message_once_under_its_table(
    redis_url: str, name: str
) -> None:
    """What ``fairq sim all -d table`` runs (seed 0): nothing lost, nothing twice, no
    field left unapplied."""
    scenario = resolve_scenario(name)
    for spec in scenario.disciplines:
        record, trace = await traced(redis_url, scenario, spec)
        assert_conserved(record)
        assert not trace.truncated
        assert "not applied" not in record["discipline"]
        assert trace.served_from == {m.run_id: (m.env.id, m.queue) for m in trace.workload.messages}
