"""The simulator's metrics on small hand-made traces whose values are worked out by hand
in each test (no server)."""

from __future__ import annotations

import pytest

from fairq.sim.driver import Trace
from fairq.sim.metrics import contention, record, slot_steps
from fairq.sim.workload import CK_QUEUE, SIM_ENV, SimMessage, Workload

# (run id, key, group, arrival step, serve step or None, hold)
Row = tuple[str, str, str, int, int | None, int]


def trace_of(
    rows: list[Row],
    *,
    tenant: dict[str, str] | None = None,
    tenant_weight: dict[str, float] | None = None,
    key_weight: dict[str, float] | None = None,
) -> Trace:
    tenant = tenant or {}
    messages: list[SimMessage] = []
    keys: dict[str, str] = {}
    for run_id, key, group, arrival, _serve, hold in rows:
        keys.setdefault(key, group)
        messages.append(
            SimMessage(
                run_id=run_id,
                key=key,
                group=group,
                queue=CK_QUEUE,
                arrival_step=arrival,
                score_ms=arrival * 1000,
                hold=hold,
                tenant=tenant.get(key, key),
                env=SIM_ENV,
            )
        )
    key_tenant = {k: tenant.get(k, k) for k in keys}
    weights = {k: (key_weight or {}).get(k, 1.0) for k in keys}
    workload = Workload(
        messages=messages,
        keys=list(keys),
        key_group=dict(keys),
        key_weight=weights,
        key_queues={k: [CK_QUEUE] for k in keys},
        key_tenant=key_tenant,
        key_env=dict.fromkeys(keys, SIM_ENV),
        tenant_weight={t: (tenant_weight or {}).get(t, 1.0) for t in key_tenant.values()},
    )
    trace = Trace(workload)
    for run_id, _key, _group, _arrival, serve, hold in rows:
        if serve is not None:
            trace.serve_step[run_id] = serve
            trace.release_step[run_id] = serve + hold
            trace.deliveries += 1
            trace.last_step = max(trace.last_step, serve)
    return trace


def rec(trace: Trace) -> dict[str, object]:
    return record(trace, scenario="hand", discipline="test", seed=0)


def test_long_holds_vs_short_holds_slot_share_differs_from_contention_share() -> None:
    # Two slots. Key a (group A) runs 4-step jobs, key b (group B) 1-step jobs; all
    # arrive at step 0. a0 and b0 start at 0, b1..b3 at 1..3 (one slot stays with a0),
    # a1 at 4 once B is drained.
    trace = trace_of([
        ("a0", "a", "A", 0, 0, 4), ("a1", "a", "A", 0, 4, 4),
        ("b0", "b", "B", 0, 0, 1), ("b1", "b", "B", 0, 1, 1),
        ("b2", "b", "B", 0, 2, 1), ("b3", "b", "B", 0, 3, 1),
    ])  # fmt: skip
    r = rec(trace)
    groups = r["groups"]
    assert isinstance(groups, dict)
    # contention (serves): both contend at steps 0..3 (a1 waits, b3 is served at 3).
    # step 0 serves 2 -> owed 1 + 1, got a 1, b 1; steps 1-3 serve 1 each -> owed
    # 0.5 + 0.5, got b 1. a: 1 / 2.5 = 0.4; b: 4 / 2.5 = 1.6.
    assert groups["A"]["contention_share"] == 0.4
    assert groups["B"]["contention_share"] == 1.6
    assert r["contention_worst_share"] == 0.4
    # slots: on steps 0..3 a0 holds one slot and b one -> 2 slot-steps each step,
    # owed 1 + 1 each step: a 4 / 4 = 1.0, b 4 / 4 = 1.0. Fair in slot time.
    assert groups["A"]["slot_share"] == 1.0
    assert groups["B"]["slot_share"] == 1.0
    # per tenant (each key is its own tenant): the same figures
    tenants = r["tenants"]
    assert isinstance(tenants, dict)
    assert (tenants["a"]["contention_share"], tenants["a"]["slot_share"]) == (0.4, 1.0)
    assert (tenants["b"]["contention_share"], tenants["b"]["slot_share"]) == (1.6, 1.0)


def test_slots_held_after_a_group_stops_contending_count_against_the_others() -> None:
    # Two slots. a0 (5-step hold) and b0 start at 0; b1, b2 at 1, 2; c0 arrives at 1 and
    # starts at 3. Contending: A at step 0, B at 0..2, C at 1..3.
    trace = trace_of([
        ("a0", "a", "A", 0, 0, 5),
        ("b0", "b", "B", 0, 0, 1), ("b1", "b", "B", 0, 1, 1), ("b2", "b", "B", 0, 2, 1),
        ("c0", "c", "C", 1, 3, 1),
    ])  # fmt: skip
    groups = rec(trace)["groups"]
    assert isinstance(groups, dict)
    # contended steps 0, 1, 2 (step 3: C alone). Held: a0 + one of b = 2 slots each step.
    # owed: step 0 A 1, B 1; steps 1, 2 B 1, C 1 (A holds but no longer contends).
    # got: A 3, B 3, C 0 -> A 3 / 1, B 3 / 3, C 0 / 2.
    assert [groups[g]["slot_share"] for g in "ABC"] == [3.0, 1.0, 0.0]
    # serves: step 0 (a, b contend) owed .5 x 2 each, got a 1, b 1; steps 1, 2 (b, c)
    # owed .5 each, got b 1; step 3 c alone. A 1 / 1, B 3 / 2, C 0 / 1.
    assert [groups[g]["contention_share"] for g in "ABC"] == [1.0, 1.5, 0.0]
    # the raw slot-steps behind the shares
    got, owed = slot_steps(trace, {k: k for k in "abc"}, {"a": "A", "b": "B", "c": "C"},
                           dict.fromkeys("abc", 1.0))  # fmt: skip
    assert got == pytest.approx({"A": 3.0, "B": 3.0, "C": 0.0})
    assert owed == pytest.approx({"A": 1.0, "B": 3.0, "C": 2.0})


def test_tenants_use_tenant_weights_and_groups_the_keys_weights() -> None:
    # Four slots, 1-step holds, all at step 0. Tenant t1 (weight 1) owns keys x and y
    # (group g1); tenant t2 (weight 3) owns key z (group g2). x and y are served one run
    # each at steps 0 and 1; z two runs at each of steps 0, 1 and 2.
    rows: list[Row] = [
        ("x0", "x", "g1", 0, 0, 1), ("x1", "x", "g1", 0, 1, 1),
        ("y0", "y", "g1", 0, 0, 1), ("y1", "y", "g1", 0, 1, 1),
    ]  # fmt: skip
    rows += [(f"z{i}", "z", "g2", 0, i // 2, 1) for i in range(6)]
    trace = trace_of(
        rows, tenant={"x": "t1", "y": "t1", "z": "t2"}, tenant_weight={"t1": 1.0, "t2": 3.0}
    )
    r = rec(trace)
    groups, tenants = r["groups"], r["tenants"]
    assert isinstance(groups, dict) and isinstance(tenants, dict)
    # groups: contended steps 0, 1 (g1 done at 1), 4 slots held each. g1 weighs 2 (x, y),
    # g2 1 (z): owed g1 8/3, g2 4/3 a step; got 2 and 2 a step.
    # g1: 4 / (16/3) = 0.75, g2: 4 / (8/3) = 1.5; serves split the same way here.
    assert (groups["g1"]["slot_share"], groups["g2"]["slot_share"]) == (0.75, 1.5)
    assert (groups["g1"]["contention_share"], groups["g2"]["contention_share"]) == (0.75, 1.5)
    # tenants: t1 weighs 1, t2 3: owed 1 and 3 of the 4 slots (serves) at steps 0, 1;
    # got 2 and 2. t1: 4 / 2 = 2.0, t2: 4 / 6 = 0.6667.
    assert (tenants["t1"]["slot_share"], tenants["t2"]["slot_share"]) == (2.0, 0.6667)
    assert (tenants["t1"]["contention_share"], tenants["t2"]["contention_share"]) == (
        2.0,
        0.6667,
    )
    # waits: t1 [0, 0, 1, 1] -> mean 0.5, p95 (rank 4 of 4) 1; t2 [0, 0, 1, 1, 2, 2]
    # -> mean 1.0, p95 (rank 6 of 6) 2
    assert tenants["t1"] == {
        "weight": 1.0, "keys": 2, "mean_wait": 0.5, "p95_wait": 1, "max_wait": 1,
        "first_serve_step": 0, "served": 4, "contention_share": 2.0, "slot_share": 2.0,
    }  # fmt: skip
    assert tenants["t2"]["weight"] == 3.0 and tenants["t2"]["keys"] == 1
    assert (tenants["t2"]["mean_wait"], tenants["t2"]["p95_wait"]) == (1.0, 2)
    assert list(tenants) == ["t1", "t2"]
    # the tenant-level raw figures
    got, owed = contention(trace, trace.workload.key_tenant, trace.workload.tenant_weight)
    assert got == pytest.approx({"t1": 4.0, "t2": 4.0})
    assert owed == pytest.approx({"t1": 2.0, "t2": 6.0})


def test_key_weights_split_a_groups_entitlement() -> None:
    # Two slots, 2-step holds. Key h (weight 3, group H) and key l (weight 1, group L):
    # h0, l0 start at 0 and hold to step 1; h1, l1 start at 2 and hold to step 3.
    trace = trace_of(
        [
            ("h0", "h", "H", 0, 0, 2), ("h1", "h", "H", 0, 2, 2),
            ("l0", "l", "L", 0, 0, 2), ("l1", "l", "L", 0, 2, 2),
        ],
        key_weight={"h": 3.0},
    )  # fmt: skip
    groups = rec(trace)["groups"]
    assert isinstance(groups, dict)
    # both contend at steps 0..2; 2 slots held each step: owed H 1.5, L 0.5 a step, got
    # 1 and 1. H: 3 / 4.5 = 0.6667, L: 3 / 1.5 = 2.0.
    assert (groups["H"]["slot_share"], groups["L"]["slot_share"]) == (0.6667, 2.0)
    # serves: 2 at step 0 and 2 at step 2, owed 1.5 / 0.5 each time: H 2 / 3, L 2 / 1
    assert (groups["H"]["contention_share"], groups["L"]["contention_share"]) == (0.6667, 2.0)


def test_work_never_served_contends_to_the_end() -> None:
    # One slot. a0 arrives at 0 and is never served; b0 holds steps 0-1, b1 step 2.
    trace = trace_of([
        ("a0", "a", "A", 0, None, 1),
        ("b0", "b", "B", 0, 0, 2), ("b1", "b", "B", 0, 2, 1),
    ])  # fmt: skip
    r = rec(trace)
    groups = r["groups"]
    assert isinstance(groups, dict)
    # both contend at steps 0..2 with 1 slot held: owed 0.5 each a step; B got 3, A 0
    assert (groups["A"]["slot_share"], groups["B"]["slot_share"]) == (0.0, 2.0)
    assert (groups["A"]["contention_share"], groups["B"]["contention_share"]) == (0.0, 2.0)
    assert (r["enqueued"], r["served"]) == (3, 2)
    assert groups["A"]["first_serve_step"] is None and groups["A"]["served"] == 0


def test_a_group_that_never_contends_has_no_share() -> None:
    # A is served before B arrives: no step has two contending groups
    trace = trace_of([("a0", "a", "A", 0, 0, 3), ("b0", "b", "B", 1, 3, 1)])
    r = rec(trace)
    groups, tenants = r["groups"], r["tenants"]
    assert isinstance(groups, dict) and isinstance(tenants, dict)
    for g in ("A", "B"):
        assert (groups[g]["contention_share"], groups[g]["slot_share"]) == (None, None)
    assert tenants["b"]["contention_share"] is None and tenants["b"]["slot_share"] is None
    assert r["contention_worst_share"] == 1.0
    assert (groups["B"]["mean_wait"], tenants["b"]["first_serve_step"]) == (2.0, 3)


def test_one_group_of_many_keys_is_not_contended_between_groups() -> None:
    # Keys a and b of one group contend with each other (contention_share counts that)
    # but no second group has work: slot_share is null, contention_share is not.
    trace = trace_of([("a0", "a", "G", 0, 0, 2), ("b0", "b", "G", 0, 1, 2)])
    groups = rec(trace)["groups"]
    assert isinstance(groups, dict)
    assert groups["G"]["slot_share"] is None
    # step 0: a, b contend, 1 served: owed .5 + .5, got 1 (a) -> the group 1 / 1
    assert groups["G"]["contention_share"] == 1.0


def test_worst_key_mean_wait_is_the_worst_single_key() -> None:
    # group G: key a waits 0 and 0, key b waits 4; the group mean (4/3) hides b
    trace = trace_of(
        [("a0", "a", "G", 0, 0, 1), ("a1", "a", "G", 1, 1, 1), ("b0", "b", "G", 0, 4, 1)]
    )
    r = rec(trace)
    groups = r["groups"]
    assert isinstance(groups, dict)
    assert groups["G"]["mean_wait"] == round(4 / 3, 3)
    assert r["worst_key_mean_wait"] == 4.0


def test_record_shape() -> None:
    r = rec(trace_of([("a0", "a", "A", 0, 0, 1), ("b0", "b", "B", 0, 0, 1)]))
    assert list(r) == [
        "scenario", "discipline", "seed", "groups", "tenants", "makespan",
        "contention_worst_share", "worst_key_mean_wait", "enqueued", "served", "duplicates",
        "commands_per_serve",
    ]  # fmt: skip
    groups, tenants = r["groups"], r["tenants"]
    assert isinstance(groups, dict) and isinstance(tenants, dict)
    assert list(groups["A"]) == [
        "mean_wait", "p50_wait", "p99_wait", "max_wait", "first_serve_step", "served",
        "contention_share", "slot_share",
    ]  # fmt: skip
    assert list(tenants["a"]) == [
        "weight", "keys", "mean_wait", "p95_wait", "max_wait", "first_serve_step", "served",
        "contention_share", "slot_share",
    ]  # fmt: skip
