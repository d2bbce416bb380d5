"""A driver-side two-level SFQ model with admission rules and fair state per pool.

The design study's candidates for the two holes a plain start-time fair order leaves,
modelled on the simulator's logical clock before any script changes:

* **A flood of fresh flows.** A key that names no tenant is its own tenant, so a client
  that mints a fresh key per message mints a fresh tenant per message, and each one
  joins at the floor (the start tag of the run most recently begun) ahead of every
  tenant already served. The ``admit`` rule decides where a *new* tenant (one without
  a tag) starts:

  ``floor``   at the floor (plain SFQ; what the scripts do today);
  ``clock``   at ``max(floor, C)``, where ``C`` is one newcomer clock advanced by
              ``quantum / newcomer_weight`` per new tenant (the newcomers share one
              class, served in arrival order, whose share is ``newcomer_weight``
              tenants' share);
  ``epoch``   at ``floor + quantum x j / newcomer_weight``, ``j`` = new tenants already
              joined in this floor epoch (the count restarts when the floor crosses a
              multiple of the quantum);
  ``budget``  the chosen rule: the first ``free`` new tenants of each floor epoch join at
              the floor, the others at ``max(floor, C)``; every new tenant, free or not,
              advances ``C`` by ``quantum / newcomer_weight``. So the newcomers together
              get ``newcomer_weight`` tenants' share in the long run, yet one newcomer per
              round is never queued behind other newcomers.

  Every rule but ``floor`` acts only once the state has charged a serve: before that
  nobody has a tag to protect, and new tenants join at the floor, uncounted.

* **Split worker pools.** A pool is the set of queues one consumer serves. With
  ``state=env`` (today) a tenant has one tag per environment, charged by every pool;
  with ``state=pool`` each pool keeps its own tags, floor and newcomer clock, charged
  only by that pool's serves, so a tenant's serves in one pool never cost it its turn in
  another.

Inside a tenant its keys take turns by key tags (a key joins at its tenant's key floor),
as in the scripts. The model picks one key at a time; the driver serves it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ADMIT_RULES = ("floor", "clock", "epoch", "budget")
STATES = ("env", "pool")
#: Tolerance of a floor epoch boundary (virtual times are sums of quanta).
_EPS = 1e-9


@dataclass
class FairState:
    """The fair order's state of one pool (or of the environment, ``state=env``)."""

    floor: float = 0.0
    #: tenant -> tag; a tenant absent here is new
    tags: dict[str, float] = field(default_factory=dict)
    #: tenant -> key -> key tag, and tenant -> key floor
    key_tags: dict[str, dict[str, float]] = field(default_factory=dict)
    key_floor: dict[str, float] = field(default_factory=dict)
    #: tenants with backlog at the last pick (the others rejoin at the floor)
    active: set[str] = field(default_factory=set)
    active_keys: set[str] = field(default_factory=set)
    #: the newcomer clock, the floor epoch of the last new tenant, and how many joined in it
    clock: float = 0.0
    epoch: int = -1
    joined: int = 0
    #: join order of tenants (ties at equal tags go to the earlier join)
    seq: dict[str, int] = field(default_factory=dict)
    next_seq: int = 0
    #: some serve was charged: before the first, nobody is there to protect, so new
    #: tenants join at the floor uncounted (a first burst is served as plain SFQ would)
    charged: bool = False


@dataclass(frozen=True)
class Admission:
    """An admission rule and its parameters."""

    rule: str = "floor"
    free: int = 1
    newcomer_weight: float = 1.0
    quantum: float = 1.0

    def join_tag(self, s: FairState) -> float:
        """The start tag of a new tenant joining now (and the state's update)."""
        q, floor = self.quantum, s.floor
        epoch = math.floor(floor / q + _EPS)
        if epoch != s.epoch:
            s.epoch, s.joined = epoch, 0
        step = q / self.newcomer_weight
        if self.rule == "floor":
            tag = floor
        elif self.rule == "epoch":
            tag = floor + step * s.joined
        elif self.rule == "clock":
            tag = max(floor, s.clock)
            s.clock = tag + step
        else:  # budget
            tag = floor if s.joined < self.free else max(floor, s.clock)
            s.clock = max(floor, s.clock) + step
        s.joined += 1
        return tag


class TwoLevelModel:
    """Two-level SFQ over tenants then keys, with an admission rule for new tenants and
    fair state per environment or per pool (see the module docstring).

    ``pick(ready, backlogged, pool)``: the next key of ``ready`` to serve for ``pool``
    (``backlogged``: every key with queued work that ``pool`` can serve); ``served``
    charges that serve.
    """

    def __init__(
        self,
        key_weight: dict[str, float],
        order: list[str],
        key_tenant: dict[str, str],
        tenant_weight: dict[str, float],
        admission: Admission,
        state: str = "env",
    ) -> None:
        self.key_weight = key_weight
        self.rank = {k: i for i, k in enumerate(order)}
        self.key_tenant = key_tenant
        self.tenant_weight = tenant_weight
        self.admission = admission
        self.per_pool = state == "pool"
        self.states: dict[str, FairState] = {}

    def state_of(self, pool: str) -> FairState:
        name = pool if self.per_pool else "*"
        s = self.states.get(name)
        if s is None:
            s = self.states[name] = FairState()
        return s

    def _activate(self, s: FairState, backlogged: set[str]) -> None:
        """Tenants and keys that got work since the last pick join (new tenants by the
        admission rule, known ones at max(their tag, floor)); the others go idle."""
        tenants = {self.key_tenant[k] for k in backlogged}
        for t in sorted(tenants - s.active, key=lambda t: min(self._ranks(t, backlogged))):
            if t in s.tags:
                s.tags[t] = max(s.tags[t], s.floor)
            elif s.charged:
                s.tags[t] = self.admission.join_tag(s)
            else:
                s.tags[t] = s.floor
            s.seq[t] = s.next_seq
            s.next_seq += 1
        s.active = tenants
        for k in sorted(backlogged - s.active_keys, key=self.rank.__getitem__):
            t = self.key_tenant[k]
            keys = s.key_tags.setdefault(t, {})
            keys[k] = max(keys.get(k, 0.0), s.key_floor.get(t, 0.0))
        s.active_keys = set(backlogged)

    def _ranks(self, tenant: str, keys: set[str]) -> list[int]:
        return [self.rank[k] for k in keys if self.key_tenant[k] == tenant]

    def pick(self, ready: list[str], backlogged: set[str], pool: str = "*") -> str | None:
        s = self.state_of(pool)
        self._activate(s, backlogged | set(ready))
        if not ready:
            return None
        tenants = {self.key_tenant[k] for k in ready}
        t = min(tenants, key=lambda t: (s.tags[t], s.seq[t]))
        keys = s.key_tags[t]
        return min(
            (k for k in ready if self.key_tenant[k] == t),
            key=lambda k: (keys[k], self.rank[k]),
        )

    def served(self, key: str, pool: str = "*") -> None:
        s = self.state_of(pool)
        s.charged = True
        t = self.key_tenant[key]
        q = self.admission.quantum
        start = s.tags[t]
        s.floor = max(s.floor, start)
        s.tags[t] = start + q / self.tenant_weight[t]
        keys = s.key_tags[t]
        kstart = keys[key]
        s.key_floor[t] = max(s.key_floor.get(t, 0.0), kstart)
        keys[key] = kstart + q / self.key_weight[key]
