"""Which environments a dequeue over a whole shard tries first.

The age order keeps the reference strategy: read the shard's ready heads-index members
(oldest first, at most ``parent_queue_limit``), drop every environment already at its
concurrency limit (with burst), and shuffle the rest uniformly. When the fair order is
in use on the shard (an environment has a virtual tag there, or it is this process's
default), environments are instead taken in weighted fair order: lowest virtual tag
first (a tag below the shard's floor counts as the floor; an environment's tag grows by
runs served / weight), ties to the oldest head. Inside an environment the dequeue
script orders its queues (oldest head first, or fair, per queue).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

from fairq import keys as K
from fairq.keys import Environment


@dataclass(frozen=True, slots=True)
class EnvPlan:
    """One environment to try (one partition of it), and its ready queues (oldest head
    first)."""

    env: Environment
    queues: list[str]
    oldest_ms: float
    partition: int = 0


class SelectionStrategy:
    """Orders a shard's environments for one dequeue pass."""

    def __init__(self, rng: random.Random, parent_queue_limit: int = 1000) -> None:
        self.rng = rng
        self.parent_queue_limit = parent_queue_limit

    def group(self, members: list[tuple[str, float]]) -> list[EnvPlan]:
        """Ready members (oldest first) grouped by environment, each env's queues oldest
        first, envs in name order (deterministic before any shuffle)."""
        by_env: dict[Environment, list[tuple[float, str]]] = defaultdict(list)
        for member, score in members:
            _kind, env, queue = K.parse_heads_member(member)
            by_env[env].append((score, queue))
        plans = []
        for env in sorted(by_env):
            seen: dict[str, float] = {}
            for score, queue in sorted(by_env[env]):
                seen.setdefault(queue, score)
            plans.append(EnvPlan(env, list(seen), min(seen.values())))
        return plans

    def order(
        self,
        members: list[tuple[str, float]],
        env_busy: dict[Environment, int],
        env_limit_with_burst: dict[Environment, int],
        env_tags: dict[Environment, float] | None = None,
    ) -> list[EnvPlan]:
        """Pure part of the strategy: ready members to an ordered plan.

        Args:
            members: the shard's ready heads-index members with their scores.
            env_busy: slots each environment holds.
            env_limit_with_burst: each environment's limit x burst (missing: 1).
            env_tags: the weighted fair order's tags (floor already applied); None =
                the age order's uniform shuffle.
        """
        plans = [
            p
            for p in self.group(members)
            if env_busy.get(p.env, 0) < env_limit_with_burst.get(p.env, 1)
        ]
        if env_tags is None:
            self.rng.shuffle(plans)
        else:
            plans.sort(key=lambda p: (env_tags.get(p.env, 0.0), p.oldest_ms, p.env.id))
        return plans
