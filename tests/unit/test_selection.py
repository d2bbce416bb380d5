"""SelectionStrategy.order: which environments and queues one dequeue pass tries first.

The reference strategy (runqueue-semantics.md §3.2): drop environments at their limit
(with burst), shuffle the rest uniformly, and inside each environment try queues
oldest head first.
"""

from __future__ import annotations

import itertools
import random
import statistics
from collections import Counter

from fairq import keys as K
from fairq.keys import Environment
from fairq.store.selection import EnvPlan, SelectionStrategy


def member(env: Environment, queue: str, kind: str = K.KIND_QUEUE) -> str:
    return K.heads_member(kind, env, queue)


def flat(plans: list[EnvPlan]) -> list[tuple[Environment, str]]:
    """A plan as (env, queue) pairs in order."""
    return [(p.env, q) for p in plans for q in p.queues]


def strategy(seed: int = 1) -> SelectionStrategy:
    return SelectionStrategy(random.Random(seed))


ENV_A = Environment("o1", "p1", "a")
ENV_B = Environment("o1", "p1", "b")


def test_single_queue_is_returned() -> None:
    plan = strategy().order([(member(ENV_A, "q1"), 100.0)], {ENV_A: 0}, {ENV_A: 10})
    assert flat(plan) == [(ENV_A, "q1")]


def test_no_members_no_plan() -> None:
    assert strategy().order([], {}, {}) == []


def test_env_at_its_limit_is_dropped() -> None:
    members = [(member(ENV_A, "q1"), 1.0), (member(ENV_A, "q2"), 2.0)]
    assert strategy().order(members, {ENV_A: 2}, {ENV_A: 2}) == []


def test_env_over_its_limit_is_dropped() -> None:
    members = [(member(ENV_A, "q1"), 1.0), (member(ENV_B, "q1"), 2.0)]
    plan = strategy().order(members, {ENV_A: 5, ENV_B: 0}, {ENV_A: 2, ENV_B: 2})
    assert flat(plan) == [(ENV_B, "q1")]


def test_burst_lets_an_env_past_its_base_limit() -> None:
    """3 running, limit 2 x burst 2 = 4: still returned (the caller passes limit x burst)."""
    members = [(member(ENV_A, "q1"), 1.0)]
    assert flat(strategy().order(members, {ENV_A: 3}, {ENV_A: 4})) == [(ENV_A, "q1")]


def test_burst_limit_reached_drops_the_env() -> None:
    members = [(member(ENV_A, "q1"), 1.0)]
    assert strategy().order(members, {ENV_A: 4}, {ENV_A: 4}) == []


def test_queues_are_oldest_first_inside_an_env() -> None:
    members = [
        (member(ENV_A, "newest"), 300.0),
        (member(ENV_A, "oldest"), 100.0),
        (member(ENV_A, "middle"), 200.0),
    ]
    plan = strategy().order(members, {}, {ENV_A: 10})
    assert [queue for _, queue in flat(plan)] == ["oldest", "middle", "newest"]


def test_keyed_and_keyless_members_of_one_queue_plan_the_queue_once_at_its_oldest() -> None:
    """Both members of a queue stand for it; the env's dequeue script serves both kinds."""
    members = [
        (member(ENV_A, "q", K.KIND_CK), 50.0),
        (member(ENV_A, "q", K.KIND_QUEUE), 80.0),
        (member(ENV_A, "r", K.KIND_QUEUE), 60.0),
    ]
    plan = strategy().order(members, {}, {ENV_A: 10})
    assert flat(plan) == [(ENV_A, "q"), (ENV_A, "r")]
    assert plan[0].oldest_ms == 50.0


def _fleet() -> tuple[list[tuple[str, float]], list[Environment]]:
    """3 orgs x 3 envs x 5 queues, like the reference's fairness test."""
    members: list[tuple[str, float]] = []
    envs: list[Environment] = []
    rng = random.Random(99)
    for o in range(3):
        for e in range(3):
            env = Environment(f"org{o}", "proj", f"env{e}")
            envs.append(env)
            for q in range(5):
                members.append((member(env, f"queue{q}"), float(rng.randint(0, 10_000))))
    members.sort(key=lambda m: m[1])
    return members, envs


def test_env_first_position_share_is_uniform_over_1000_draws() -> None:
    members, envs = _fleet()
    s = strategy(seed=2024)
    limits = dict.fromkeys(envs, 100)
    first: Counter[Environment] = Counter()
    positions: dict[Environment, list[int]] = {env: [] for env in envs}
    draws = 1000
    for _ in range(draws):
        plan = s.order(members, {}, limits)
        env_order = [p.env for p in plan]
        assert sorted(env_order) == sorted(envs)
        first[env_order[0]] += 1
        for i, env in enumerate(env_order):
            positions[env].append(i)
    uniform = draws / len(envs)
    for env in envs:
        assert abs(first[env] - uniform) <= 0.3 * uniform, (env, first[env], uniform)
    shares = [first[env] / draws for env in envs]
    assert statistics.pstdev(shares) < 0.05
    mean_positions = [statistics.mean(positions[env]) for env in envs]
    assert statistics.pstdev(mean_positions) < 1


def test_envs_are_shuffled_but_each_keeps_its_queues_oldest_first() -> None:
    members, envs = _fleet()
    scores = {m: sc for m, sc in members}
    s = strategy(seed=3)
    firsts = set()
    for _ in range(50):
        plan = s.order(members, {}, dict.fromkeys(envs, 100))
        firsts.add(plan[0].env)
        for env in envs:
            own = [scores[member(env, q)] for e, q in flat(plan) if e == env]
            assert own == sorted(own)
            assert len(own) == 5
        # an env's queues are contiguous in the plan
        env_runs = [env for env, _ in flat(plan)]
        assert len(list(dict.fromkeys(env_runs))) == len(envs)
        assert sum(1 for a, b in itertools.pairwise(env_runs) if a != b) == 8
    assert len(firsts) > 1


def test_same_seed_same_plan_regardless_of_member_order() -> None:
    members, envs = _fleet()
    limits = dict.fromkeys(envs, 100)
    a = strategy(seed=11).order(members, {}, limits)
    b = strategy(seed=11).order(list(reversed(members)), {}, limits)
    assert a == b


def test_env_missing_from_the_limit_map_is_treated_as_limit_one() -> None:
    """A defensive default: an env whose limit could not be read is tried only when idle."""
    members = [(member(ENV_A, "q"), 1.0)]
    assert flat(strategy().order(members, {}, {})) == [(ENV_A, "q")]
    assert strategy().order(members, {ENV_A: 1}, {}) == []


def test_fair_order_takes_envs_lowest_tag_first_ties_to_the_oldest_head() -> None:
    members = [
        (member(ENV_A, "q1"), 10.0),
        (member(ENV_B, "q1"), 20.0),
        (member(Environment("o1", "p1", "c"), "q1"), 5.0),
    ]
    env_c = Environment("o1", "p1", "c")
    tags = {ENV_A: 3.0, ENV_B: 1.0, env_c: 3.0}
    plan = strategy().order(members, {}, dict.fromkeys(tags, 10), tags)
    assert [p.env for p in plan] == [ENV_B, env_c, ENV_A]


def test_fair_order_still_drops_an_env_at_its_limit() -> None:
    members = [(member(ENV_A, "q1"), 10.0), (member(ENV_B, "q1"), 20.0)]
    plan = strategy().order(members, {ENV_A: 2}, {ENV_A: 2, ENV_B: 2}, {ENV_A: 0.0, ENV_B: 9.0})
    assert [p.env for p in plan] == [ENV_B]
