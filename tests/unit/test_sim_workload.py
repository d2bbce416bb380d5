"""The simulator's workload: every message knows its tenant, queue and environment (no
server)."""

from __future__ import annotations

import hashlib

import pytest

from fairq.keys import Environment
from fairq.sim.scenario import Rate, builtin_scenarios, loads_scenario
from fairq.sim.workload import CK_QUEUE, SIM_ENV, Workload, ck_queue, generate, sim_env

#: sha256 (first 16 hex digits) of every message's run id, key, group, queue, arrival
#: step, timestamp and hold for seeds 0, 1 and 2, as generated before tenants, queues
#: and environments were added to the workload.
PINNED = {
    "balanced": "92e60af7d5940855",
    "adversarialSkew": "b940fee281e9b3ae",
    "weighted": "e65bfb30acc5bdd6",
    "burst": "bdd7e34f4d39ef74",
    "longHold": "96eeb2d88eebcd51",
    "trickleStale": "eb626de37c3a5bb9",
    "ckSkew": "709c94cf991d3406",
    "ckTrickle": "e141f221e6115e8e",
    "ckSybil": "a8968add38d39a31",
    "ckBalanced": "bb9418d74d391191",
    "ckHeavyIdle": "c00c081bd9e097ff",
    "ckManyKeys": "d22020c7f38b4a61",
    "ckStalledNewcomer": "181bf67c9a6c192c",
    "ckLateLight": "e3887b3d1f9b54de",
    "ckFreshKeyFlood": "83e3e0536c101473",
}


BUILTIN = {s.name: s for s in builtin_scenarios()}


def digest(workloads: list[Workload]) -> str:
    h = hashlib.sha256()
    for w in workloads:
        for m in w.messages:
            h.update(
                f"{m.run_id}|{m.key}|{m.group}|{m.queue}|{m.arrival_step}|{m.score_ms}|"
                f"{m.hold}\n".encode()
            )
    return h.hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_scenarios_without_the_new_fields_generate_what_they_always_did(name: str) -> None:
    scenario = BUILTIN[name]
    workloads = [generate(scenario, seed) for seed in (0, 1, 2)]
    assert digest(workloads) == PINNED[name]
    w = workloads[0]
    # and each key is its own tenant, weighted like the key, in the one environment
    assert all(m.tenant == m.key and m.env == SIM_ENV for m in w.messages)
    assert w.key_tenant == {k: k for k in w.keys}
    assert w.tenants == w.keys
    assert w.tenant_weight == w.key_weight
    assert set(w.key_env.values()) == {SIM_ENV}
    assert (w.key_cap, w.tenant_cap, w.key_rate) == ({}, {}, {})
    if scenario.grain == "ck":
        assert w.env_queues() == {SIM_ENV: [CK_QUEUE]}


SPREAD = """
name = "spread"
grain = "ck"
[[groups]]
name = "acme"
tenant = "corp"
tenant_weight = 3
tenant_cap = 5
keys = 6
queues = 3
envs = 2
key_cap = 2
rate = 0.5
rate_burst = 2
messages_per_key = 4
arrival = { kind = "poisson", rate = 0.7 }
hold_steps = { kind = "uniform", min = 1, max = 9 }
[[groups]]
name = "also"
tenant = "corp"
keys = 1
messages_per_key = 3
arrival = "backlog"
[[groups]]
name = "solo"
keys = 2
weight = 2
messages_per_key = 2
arrival = { kind = "interval", start = 3, every = 2 }
"""


def test_keys_spread_over_environments_then_queues_and_messages_follow_their_key() -> None:
    w = generate(loads_scenario(SPREAD, source="<spread>"), seed=1)
    run, run1 = Environment("sim", "fairness", "run"), Environment("sim", "fairness", "run1")
    assert (sim_env(0), sim_env(1)) == (run, run1)
    assert [ck_queue(i) for i in range(3)] == ["work", "work.q1", "work.q2"]
    expected = {
        "acme-0": (run, "work"), "acme-1": (run1, "work"),
        "acme-2": (run, "work.q1"), "acme-3": (run1, "work.q1"),
        "acme-4": (run, "work.q2"), "acme-5": (run1, "work.q2"),
        "also-0": (run, "work"), "solo-0": (run, "work"), "solo-1": (run, "work"),
    }  # fmt: skip
    assert {k: (w.key_env[k], w.key_queues[k][0]) for k in w.keys} == expected
    assert all(len(w.key_queues[k]) == 1 for k in w.keys)
    for m in w.messages:
        assert (m.env, m.queue) == expected[m.key]
        assert m.tenant == w.key_tenant[m.key]
    assert w.env_queues() == {
        run: ["work", "work.q1", "work.q2"],
        run1: ["work", "work.q1", "work.q2"],
    }


def test_tenants_weights_and_limits_per_key_and_tenant() -> None:
    w = generate(loads_scenario(SPREAD, source="<spread>"), seed=1)
    assert w.tenants == ["corp", "solo-0", "solo-1"]
    assert {m.tenant for m in w.messages if m.group in ("acme", "also")} == {"corp"}
    assert [m.tenant for m in w.messages if m.group == "solo"] == ["solo-0"] * 2 + ["solo-1"] * 2
    # the tenant's weight and cap come from the group that gives them; a key that is its
    # own tenant is weighted like the key
    assert w.tenant_weight == {"corp": 3.0, "solo-0": 2.0, "solo-1": 2.0}
    assert w.tenant_cap == {"corp": 5}
    assert w.key_cap == {f"acme-{i}": 2 for i in range(6)}
    assert w.key_rate == {f"acme-{i}": Rate(0.5, 2) for i in range(6)}
    assert w.key_weight["solo-1"] == 2.0 and w.key_group["also-0"] == "also"


def test_the_new_fields_draw_nothing_from_the_seeded_generator() -> None:
    # Given the same scenario with and without tenants, queues, environments and limits
    plain = SPREAD
    for line in (
        'tenant = "corp"\n', "tenant_weight = 3\n", "tenant_cap = 5\n", "queues = 3\n",
        "envs = 2\n", "key_cap = 2\n", "rate = 0.5\n", "rate_burst = 2\n",
    ):  # fmt: skip
        plain = plain.replace(line, "")
    assert "tenant" not in plain and "queues" not in plain
    for seed in (0, 5):
        rich = generate(loads_scenario(SPREAD), seed)
        bare = generate(loads_scenario(plain), seed)
        # Then the messages arrive at the same steps with the same timestamps and holds
        assert [(m.run_id, m.arrival_step, m.score_ms, m.hold) for m in rich.messages] == [
            (m.run_id, m.arrival_step, m.score_ms, m.hold) for m in bare.messages
        ]
        # and only the tenant, queue and environment differ
        assert {m.tenant for m in bare.messages} == set(bare.keys)
        assert {m.env for m in bare.messages} == {SIM_ENV}
        assert {m.tenant for m in rich.messages} == {"corp", "solo-0", "solo-1"}


def test_generation_is_deterministic_per_seed() -> None:
    s = loads_scenario(SPREAD)
    a, b, c = generate(s, 2), generate(s, 2), generate(s, 3)
    assert a == b
    assert [m.score_ms for m in a.messages] != [m.score_ms for m in c.messages]


def test_environments_at_the_queue_grain() -> None:
    s = loads_scenario(
        """
        grain = "queue"
        [[groups]]
        name = "owner"
        tenant = "big"
        keys = 3
        envs = 3
        queues_per_key = 2
        messages_per_key = 4
        arrival = "backlog"
        """
    )
    w = generate(s, 0)
    assert [w.key_env[k].name for k in w.keys] == ["run", "run1", "run2"]
    assert w.key_queues["owner-1"] == ["owner-1.q0", "owner-1.q1"]
    # a message goes to its key's queues round-robin, in its key's environment
    assert [(m.env.name, m.queue) for m in w.messages if m.key == "owner-2"] == [
        ("run2", "owner-2.q0"), ("run2", "owner-2.q1"),
        ("run2", "owner-2.q0"), ("run2", "owner-2.q1"),
    ]  # fmt: skip
    assert {m.tenant for m in w.messages} == {"big"} and w.tenant_weight == {"big": 1.0}
    assert w.env_queues()[sim_env(2)] == ["owner-2.q0", "owner-2.q1"]


def _builtin(name: str) -> Workload:
    return generate(BUILTIN[name], 0)


def test_the_tenant_and_limit_scenarios_generate_what_they_describe() -> None:
    many = _builtin("tenantManyKeys")
    assert {t: sum(1 for k in many.keys if many.key_tenant[k] == t) for t in many.tenants} == {
        "wide": 40, "narrow": 1,
    }  # fmt: skip
    flood = _builtin("tenantKeyFlood")
    flooders = [m for m in flood.messages if m.group == "flood"]
    assert len({m.key for m in flooders}) == len(flooders) == 300  # a fresh key per message
    assert {m.tenant for m in flooders} == {"flood"}
    assert sorted({m.arrival_step for m in flooders})[:3] == [0, 1, 2]
    assert sum(1 for m in flooders if m.arrival_step == 1) == 2  # two fresh keys a step
    newcomer = [m for m in flood.messages if m.group == "newcomer"]
    assert min(m.arrival_step for m in newcomer) == 60 and newcomer[0].tenant == "newcomer-0"
    queues = _builtin("tenantQueues")
    assert len({m.queue for m in queues.messages if m.tenant == "spread"}) == 9
    assert {m.queue for m in queues.messages if m.tenant == "single"} == {CK_QUEUE}
    ten = _builtin("tenantTenThousandKeys")
    assert sum(1 for k in ten.keys if ten.key_tenant[k] == "busy") == 10_000
    assert ten.tenants == ["busy", "light"]
    weighted = _builtin("tenantWeighted")
    assert weighted.tenant_weight == {"low": 1.0, "high": 3.0}
    assert sorted({m.arrival_step for m in weighted.messages if m.tenant == "high"}) == [10, 80]
    hidden = _builtin("capHiddenKeys")
    capped = [k for k in hidden.keys if k in hidden.key_cap]
    quick = [k for k in hidden.keys if k not in hidden.key_cap]
    assert len(capped) == 80 and set(hidden.key_cap.values()) == {1} and len(quick) == 4
    assert max(capped) < min(quick)  # the quick keys sort after every capped key
    assert BUILTIN["borrowLoneKey"].borrow and _builtin("borrowLoneKey").key_cap == {"lone-0": 2}
    charge = _builtin("chargeLongShort")
    assert {m.group: m.hold for m in charge.messages} == {"long": 20, "short": 1}
    limited = _builtin("rateLimited")
    assert limited.key_rate == {"limited-0": Rate(0.5, 2)}
