"""Simulator scenarios: the TOML schema, its loader and its validation.

A scenario describes a workload on one environment, on a logical clock of steps:

* ``grain = "ck"``: every key is a concurrency-key variant of one base queue.
* ``grain = "queue"``: every key is a tenant owning ``queues_per_key`` base queues of one
  environment (a message goes to its tenant's queues round-robin).

Above the keys are tenants: a group with ``tenant = "NAME"`` puts every one of its keys
in that tenant (groups naming the same tenant share it); a group without one makes each
of its keys a tenant of its own, named after the key.

Top-level fields (defaults in brackets)::

    name            string   [file stem]        description   string [""]
    grain           "ck" | "queue"  (required)
    env_concurrency int >= 1 [4]                burst_factor  float 1..100 [1.0]
    max_count       int 1..1000 [10]            steps_limit   int >= 1 [100000]
    hold_steps      HOLD [1]                    per_key_cap   int >= 0 [0 = none]
    total_cap       int >= 0 [0 = none]         disciplines   [string] [["age", "sfq"]]
    borrow          bool [false]                charge        "count" | "duration" ["count"]
    shards          int 1..64 [1]   partitions each environment is spread over (its
                    tenants by a hash of their name; see docs/cluster.md)
    aging           int >= 1 [none]  steps a run waits before it moves up one priority
                    level (the queues' ``max_wait_promote``, aging x 1 s)
    [[groups]]      one or more GROUP tables
    [[pools]]       POOL tables [none: one consumer serves every queue]

    POOL: name (string, unique), queues (list of base queue indexes, grain ck:
          0 = ``work``, N = ``work.qN``), slots (int >= 1, the pool's workers).
          With pools, every step each pool makes its own dequeue call over its queues,
          for what its free slots allow (the environment limit still applies); every
          queue in use must be in some pool; one environment only.

    GROUP: name (string, unique), keys (int >= 1), messages_per_key (int >= 1),
           weight (float > 0) [1.0], arrival (ARRIVAL, required),
           hold_steps (HOLD) [scenario's], queues_per_key (int >= 1, grain queue) [1],
           tenant (name) [none: a tenant per key],
           tenant_weight (float > 0) [1.0 for a named tenant, else the key's weight],
           queues (int >= 1, grain ck) [1], envs (int >= 1) [1],
           key_cap (int >= 0) [per_key_cap], tenant_cap (int >= 0) [none],
           rate (float > 0, runs started per step per key) [none],
           rate_burst (int >= 1, needs rate) [1],
           queue (int >= 0, grain ck: every key on base queue ``queue``, instead of
           spreading over ``queues``) [none],
           priority (int 1..9, 1 the highest: the level every message of the group is
           enqueued at) [none: the queues' middle level]
    A tenant's groups must agree on tenant_weight and tenant_cap (a group that leaves one
    out takes the value its tenant's other groups give). The keys of a group spread
    round-robin over its environments, then over its queues: key i is in environment
    i mod envs and on queue (i div envs) mod queues, so queues x envs <= keys.
    ARRIVAL: "backlog"
           | {kind = "backlog"}                         all at step 0, one shared old timestamp
           | {kind = "burst", start = S}                all at step S
           | {kind = "interval", start = S, every = K}  one message every K steps from S
           | {kind = "poisson", rate = R, start = S}    Poisson process, R messages per step
           each may add ``stagger = D``: key i of the group starts D x i steps later.
    HOLD:  N (steps) | {kind = "uniform", min = A, max = B} | {kind = "exponential", mean = M}

Every unknown field or bad value raises :class:`ScenarioError` naming the file, the
field and the reason.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from fairq.errors import FairqError
from fairq.keys import MAX_LEVELS

Grain = Literal["ck", "queue"]
Charge = Literal["count", "duration"]

#: Largest number of messages one scenario may generate.
MAX_MESSAGES = 2_000_000
#: Largest number of keys one scenario may declare.
MAX_KEYS = 100_000
#: Most partitions a scenario may spread an environment over.
MAX_SHARDS = 64
#: Largest number of steps a scenario may run for.
MAX_STEPS = 10_000_000
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class ScenarioError(FairqError, ValueError):
    """A scenario file (or table) is invalid.

    Attributes:
        source: the file (or ``<name>`` for an in-memory table).
        field: the dotted path of the offending field, e.g. ``groups[1].arrival.rate``.
        reason: what is wrong and what is accepted.
    """

    def __init__(self, source: str, field_path: str, reason: str) -> None:
        self.source = source
        self.field = field_path
        self.reason = reason
        super().__init__(f"{source}: {field_path}: {reason}")


@dataclass(frozen=True, slots=True)
class Hold:
    """How many steps a served message keeps its slot before it is acked."""

    kind: Literal["fixed", "uniform", "exponential"] = "fixed"
    steps: int = 1
    low: int = 1
    high: int = 1
    mean: float = 1.0


@dataclass(frozen=True, slots=True)
class Arrival:
    """When a group's messages arrive (see the module docstring)."""

    kind: Literal["backlog", "burst", "interval", "poisson"]
    start: int = 0
    every: int = 1
    rate: float = 1.0
    stagger: float = 0.0


@dataclass(frozen=True, slots=True)
class Rate:
    """A token bucket: ``per_step`` runs started per step on average, at most ``burst`` at
    once (the bucket's size)."""

    per_step: float
    burst: int = 1


@dataclass(frozen=True, slots=True)
class Group:
    """A set of keys with the same shape of work.

    ``tenant`` None: each key is a tenant of its own. ``tenant_weight``, ``key_cap``,
    ``tenant_cap`` None: not set by this group (see :meth:`Scenario.tenant_weight_of`).
    """

    name: str
    keys: int
    messages_per_key: int
    arrival: Arrival
    weight: float = 1.0
    hold: Hold | None = None
    queues_per_key: int = 1
    tenant: str | None = None
    tenant_weight: float | None = None
    queues: int = 1
    envs: int = 1
    key_cap: int | None = None
    tenant_cap: int | None = None
    rate: Rate | None = None
    #: grain ck: the base queue index every key of the group is on (None: ``queues``)
    queue: int | None = None
    #: The priority level of the group's messages (None: the queues' middle level).
    priority: int | None = None

    def key_name(self, i: int) -> str:
        """The name of the group's key ``i`` (0-based)."""
        return f"{self.name}-{i}"


@dataclass(frozen=True, slots=True)
class Pool:
    """A consumer pool: the base queues (grain ck indexes) it serves and its slots."""

    name: str
    queues: tuple[int, ...]
    slots: int


@dataclass(frozen=True, slots=True)
class Scenario:
    """A validated scenario."""

    name: str
    grain: Grain
    groups: tuple[Group, ...]
    description: str = ""
    env_concurrency: int = 4
    burst_factor: float = 1.0
    max_count: int = 10
    hold: Hold = field(default_factory=Hold)
    per_key_cap: int = 0
    total_cap: int = 0
    steps_limit: int = 100_000
    disciplines: tuple[str, ...] = ("age", "sfq")
    source: str = ""
    borrow: bool = False
    charge: Charge = "count"
    #: Partitions each environment is spread over (1: its shard alone).
    shards: int = 1
    #: Consumer pools (none: one consumer serves every queue).
    pools: tuple[Pool, ...] = ()
    #: Steps a waiting run takes to move up one priority level (None: no aging).
    aging: int | None = None

    @property
    def total_messages(self) -> int:
        return sum(g.keys * g.messages_per_key for g in self.groups)

    def tenant_weight_of(self, group: Group) -> float:
        """The weight of the tenant(s) of ``group``'s keys: the tenant's ``tenant_weight``
        (given by any of its groups), else 1.0 for a named tenant and the key's weight for
        a key that is its own tenant."""
        if group.tenant is None:
            return group.tenant_weight if group.tenant_weight is not None else group.weight
        for g in self.groups:
            if g.tenant == group.tenant and g.tenant_weight is not None:
                return g.tenant_weight
        return 1.0

    def tenant_cap_of(self, group: Group) -> int | None:
        """The cap of the tenant(s) of ``group``'s keys (None: no tenant cap)."""
        if group.tenant is None:
            return group.tenant_cap
        for g in self.groups:
            if g.tenant == group.tenant and g.tenant_cap is not None:
                return g.tenant_cap
        return None


# --------------------------------------------------------------------------- validation


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, reason: str) -> ScenarioError:
        return ScenarioError(self.source, path, reason)

    def table(self, value: object, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a table, got {type(value).__name__}")
        return value

    def known(self, table: dict[str, Any], path: str, allowed: set[str]) -> None:
        for name in table:
            if name not in allowed:
                where = f"{path}.{name}" if path else name
                raise self.fail(where, f"unknown field (allowed: {', '.join(sorted(allowed))})")

    def integer(self, value: object, path: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"must be an integer, got {value!r}")
        if not low <= value <= high:
            raise self.fail(path, f"must be in {low}..{high}, got {value}")
        return value

    def number(
        self, value: object, path: str, low: float, high: float, *, open_low: bool = False
    ) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(path, f"must be a number, got {value!r}")
        v = float(value)
        if v != v or (v <= low if open_low else v < low) or v > high:
            bound = f"({low}, {high}]" if open_low else f"[{low}, {high}]"
            raise self.fail(path, f"must be in {bound}, got {value}")
        return v

    def string(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            raise self.fail(path, f"must be a string, got {value!r}")
        return value

    def name(self, value: object, path: str) -> str:
        text = self.string(value, path)
        if not _NAME_RE.match(text):
            raise self.fail(path, f"{text!r} is not a name (1-64 letters, digits, '_', '.', '-')")
        return text

    def hold(self, value: object, path: str) -> Hold:
        if isinstance(value, int) and not isinstance(value, bool):
            return Hold("fixed", steps=self.integer(value, path, 1, 1_000_000))
        t = self.table(value, path)
        kind = t.get("kind")
        if kind == "uniform":
            self.known(t, path, {"kind", "min", "max"})
            if "min" not in t or "max" not in t:
                raise self.fail(path, "a uniform hold needs min and max")
            low = self.integer(t["min"], f"{path}.min", 1, 1_000_000)
            high = self.integer(t["max"], f"{path}.max", 1, 1_000_000)
            if high < low:
                raise self.fail(f"{path}.max", f"must be >= min ({low}), got {high}")
            return Hold("uniform", low=low, high=high)
        if kind == "exponential":
            self.known(t, path, {"kind", "mean"})
            if "mean" not in t:
                raise self.fail(path, "an exponential hold needs mean")
            return Hold("exponential", mean=self.number(t["mean"], f"{path}.mean", 1.0, 1e6))
        raise self.fail(
            f"{path}.kind" if "kind" in t else path,
            f"must be an integer number of steps or a table with kind 'uniform' or "
            f"'exponential', got {kind!r}",
        )

    def arrival(self, value: object, path: str) -> Arrival:
        if value == "backlog":
            return Arrival("backlog")
        if isinstance(value, str):
            raise self.fail(path, f'must be "backlog" or a table with a kind, got {value!r}')
        t = self.table(value, path)
        kind = t.get("kind")
        common = {"kind", "stagger"}
        if kind == "backlog":
            self.known(t, path, common)
            arrival = Arrival("backlog")
        elif kind == "burst":
            self.known(t, path, common | {"start"})
            arrival = Arrival("burst", start=self._start(t, path, required=True))
        elif kind == "interval":
            self.known(t, path, common | {"start", "every"})
            if "every" not in t:
                raise self.fail(path, "an interval arrival needs every (steps between messages)")
            every = self.integer(t["every"], f"{path}.every", 1, 1_000_000)
            arrival = Arrival("interval", start=self._start(t, path), every=every)
        elif kind == "poisson":
            self.known(t, path, common | {"start", "rate"})
            if "rate" not in t:
                raise self.fail(path, "a poisson arrival needs rate (messages per step)")
            rate = self.number(t["rate"], f"{path}.rate", 0.0, 1000.0, open_low=True)
            arrival = Arrival("poisson", start=self._start(t, path), rate=rate)
        else:
            raise self.fail(
                f"{path}.kind" if "kind" in t else path,
                f"must be one of 'backlog', 'burst', 'interval', 'poisson', got {kind!r}",
            )
        if "stagger" in t:
            stagger = self.number(t["stagger"], f"{path}.stagger", 0.0, 1_000_000.0)
            arrival = Arrival(arrival.kind, arrival.start, arrival.every, arrival.rate, stagger)
        return arrival

    def boolean(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(path, f"must be true or false, got {value!r}")
        return value

    def group(self, raw: object, path: str, grain: Grain) -> Group:
        g = self.table(raw, path)
        self.known(g, path, _GROUP_FIELDS)
        for required in ("name", "keys", "messages_per_key", "arrival"):
            if required not in g:
                raise self.fail(f"{path}.{required}", "required")
        name = self.name(g["name"], f"{path}.name")
        keys = self.integer(g["keys"], f"{path}.keys", 1, MAX_KEYS)
        queues_per_key = self.integer(g.get("queues_per_key", 1), f"{path}.queues_per_key", 1, 1000)
        if grain == "ck" and queues_per_key != 1:
            raise self.fail(f"{path}.queues_per_key", 'only meaningful at grain "queue"')
        queues = self.integer(g.get("queues", 1), f"{path}.queues", 1, MAX_SPREAD)
        if grain == "queue" and queues != 1:
            raise self.fail(
                f"{path}.queues",
                'only meaningful at grain "ck" (at grain "queue" use queues_per_key)',
            )
        envs = self.integer(g.get("envs", 1), f"{path}.envs", 1, MAX_SPREAD)
        if queues * envs > keys:
            where = f"{path}.queues" if queues > 1 else f"{path}.envs"
            raise self.fail(
                where,
                f"{queues} queue(s) x {envs} environment(s) need at least {queues * envs} "
                f"keys (each key lives on one queue of one environment), got {keys}",
            )
        queue: int | None = None
        if "queue" in g:
            if grain != "ck":
                raise self.fail(f"{path}.queue", 'only meaningful at grain "ck"')
            if queues != 1:
                raise self.fail(f"{path}.queue", "give queue or queues, not both")
            queue = self.integer(g["queue"], f"{path}.queue", 0, MAX_SPREAD - 1)
        rate: Rate | None = None
        if "rate" in g:
            per_step = self.number(g["rate"], f"{path}.rate", 0.0, 1000.0, open_low=True)
            burst = self.integer(g.get("rate_burst", 1), f"{path}.rate_burst", 1, 1_000_000)
            rate = Rate(per_step, burst)
        elif "rate_burst" in g:
            raise self.fail(f"{path}.rate_burst", "needs rate (runs started per step)")
        return Group(
            name=name,
            keys=keys,
            messages_per_key=self.integer(
                g["messages_per_key"], f"{path}.messages_per_key", 1, MAX_MESSAGES
            ),
            arrival=self.arrival(g["arrival"], f"{path}.arrival"),
            weight=self.number(g.get("weight", 1.0), f"{path}.weight", 0.001, 1000.0),
            hold=self.hold(g["hold_steps"], f"{path}.hold_steps") if "hold_steps" in g else None,
            queues_per_key=queues_per_key,
            tenant=self.name(g["tenant"], f"{path}.tenant") if "tenant" in g else None,
            tenant_weight=(
                self.number(g["tenant_weight"], f"{path}.tenant_weight", 0.001, 1000.0)
                if "tenant_weight" in g
                else None
            ),
            queues=queues,
            envs=envs,
            key_cap=(
                self.integer(g["key_cap"], f"{path}.key_cap", 0, 1_000_000)
                if "key_cap" in g
                else None
            ),
            tenant_cap=(
                self.integer(g["tenant_cap"], f"{path}.tenant_cap", 0, 1_000_000)
                if "tenant_cap" in g
                else None
            ),
            rate=rate,
            queue=queue,
            priority=(
                self.integer(g["priority"], f"{path}.priority", 1, MAX_LEVELS)
                if "priority" in g
                else None
            ),
        )

    def pools(self, raw: object, groups: list[Group], grain: Grain) -> tuple[Pool, ...]:
        """The ``[[pools]]`` tables: unique names, known queues, every queue in use in a
        pool, one environment."""
        if not isinstance(raw, list) or not raw:
            raise self.fail("pools", "must be a non-empty array of tables ([[pools]])")
        if grain != "ck":
            raise self.fail("pools", 'only meaningful at grain "ck"')
        if any(g.envs > 1 for g in groups):
            raise self.fail("pools", "pools serve one environment: no group may set envs")
        used = {g.queue if g.queue is not None else i for g in groups for i in range(g.queues)}
        out: list[Pool] = []
        for i, item in enumerate(raw):
            path = f"pools[{i}]"
            t = self.table(item, path)
            self.known(t, path, {"name", "queues", "slots"})
            for required in ("name", "queues", "slots"):
                if required not in t:
                    raise self.fail(f"{path}.{required}", "required")
            name = self.name(t["name"], f"{path}.name")
            if any(p.name == name for p in out):
                raise self.fail(f"{path}.name", f"duplicate pool name {name!r}")
            queues = t["queues"]
            if not isinstance(queues, list) or not queues:
                raise self.fail(f"{path}.queues", "must be a non-empty list of queue indexes")
            indexes = tuple(
                self.integer(v, f"{path}.queues[{j}]", 0, MAX_SPREAD - 1)
                for j, v in enumerate(queues)
            )
            slots = self.integer(t["slots"], f"{path}.slots", 1, 100_000)
            out.append(Pool(name, tuple(sorted(set(indexes))), slots))
        served = {q for p in out for q in p.queues}
        missing = sorted(used - served)
        if missing:
            raise self.fail("pools", f"queue(s) {missing} have work but no pool serves them")
        return tuple(out)

    def tenants(self, groups: list[Group]) -> None:
        """A tenant's groups agree on its weight and cap; no tenant is named like a key
        of a group that has no tenant (that key is a tenant of its own)."""
        declared: dict[tuple[str, str], tuple[object, int]] = {}
        for i, g in enumerate(groups):
            if g.tenant is None:
                continue
            for attr in ("tenant_weight", "tenant_cap"):
                value = getattr(g, attr)
                if value is None:
                    continue
                first = declared.setdefault((g.tenant, attr), (value, i))
                if first[0] != value:
                    raise self.fail(
                        f"groups[{i}].{attr}",
                        f"tenant {g.tenant!r} already has {attr} {first[0]} (groups[{first[1]}]); "
                        f"every group of a tenant must give the same {attr}",
                    )
        named = [(i, g.tenant) for i, g in enumerate(groups) if g.tenant is not None]
        if not named:
            return
        own = {
            g.key_name(k): j
            for j, g in enumerate(groups)
            if g.tenant is None
            for k in range(g.keys)
        }
        for i, tenant in named:
            if tenant in own:
                j = own[tenant]
                raise self.fail(
                    f"groups[{i}].tenant",
                    f"{tenant!r} is also a key of groups[{j}] ({groups[j].name!r}), which has "
                    f"no tenant, so that key is a tenant of its own: choose another name",
                )

    def _start(self, t: dict[str, Any], path: str, *, required: bool = False) -> int:
        if "start" not in t:
            if required:
                raise self.fail(path, "needs start (the step the messages arrive)")
            return 0
        return self.integer(t["start"], f"{path}.start", 0, MAX_STEPS)


_TOP_FIELDS = {
    "name", "description", "grain", "env_concurrency", "burst_factor", "max_count",
    "hold_steps", "per_key_cap", "total_cap", "steps_limit", "disciplines", "groups",
    "borrow", "charge", "shards", "pools", "aging",
}  # fmt: skip
_GROUP_FIELDS = {
    "name", "keys", "messages_per_key", "weight", "arrival", "hold_steps", "queues_per_key",
    "tenant", "tenant_weight", "queues", "envs", "key_cap", "tenant_cap", "rate", "rate_burst",
    "queue", "priority",
}  # fmt: skip
#: Largest number of environments (and of base queues) one group may spread over.
MAX_SPREAD = 1000


def parse_scenario(data: dict[str, Any], *, source: str, default_name: str = "") -> Scenario:
    """Validate a decoded TOML table into a :class:`Scenario`.

    Raises:
        ScenarioError: naming ``source``, the field and the reason.
    """
    c = _Checker(source)
    c.known(data, "", _TOP_FIELDS)
    name = c.name(data.get("name", default_name or "scenario"), "name")
    if "grain" not in data:
        raise c.fail("grain", 'required: "ck" (concurrency keys) or "queue" (base queues)')
    grain = data["grain"]
    if grain not in ("ck", "queue"):
        raise c.fail("grain", f'must be "ck" or "queue", got {grain!r}')
    description = c.string(data.get("description", ""), "description")
    env_concurrency = c.integer(data.get("env_concurrency", 4), "env_concurrency", 1, 100_000)
    burst_factor = c.number(data.get("burst_factor", 1.0), "burst_factor", 1.0, 100.0)
    max_count = c.integer(data.get("max_count", 10), "max_count", 1, 1000)
    hold = c.hold(data.get("hold_steps", 1), "hold_steps")
    per_key_cap = c.integer(data.get("per_key_cap", 0), "per_key_cap", 0, 1_000_000)
    total_cap = c.integer(data.get("total_cap", 0), "total_cap", 0, 1_000_000)
    steps_limit = c.integer(data.get("steps_limit", 100_000), "steps_limit", 1, MAX_STEPS)
    borrow = c.boolean(data.get("borrow", False), "borrow")
    shards = c.integer(data.get("shards", 1), "shards", 1, MAX_SHARDS)
    aging = c.integer(data["aging"], "aging", 1, MAX_STEPS) if "aging" in data else None
    charge = data.get("charge", "count")
    if charge not in ("count", "duration"):
        raise c.fail("charge", f'must be "count" or "duration", got {charge!r}')
    raw_disciplines = data.get("disciplines", ["age", "sfq"])
    if not isinstance(raw_disciplines, list) or not raw_disciplines:
        raise c.fail("disciplines", "must be a non-empty list of discipline specs")
    disciplines: list[str] = []
    from fairq.sim.disciplines import DisciplineError, parse_discipline

    for i, spec in enumerate(raw_disciplines):
        text = c.string(spec, f"disciplines[{i}]")
        try:
            disciplines.append(parse_discipline(text).spec)
        except DisciplineError as exc:
            raise c.fail(f"disciplines[{i}]", str(exc)) from None
    raw_groups = data.get("groups")
    if raw_groups is None:
        raise c.fail("groups", "required: at least one [[groups]] table")
    if not isinstance(raw_groups, list) or not raw_groups:
        raise c.fail("groups", "must be a non-empty array of tables ([[groups]])")
    groups: list[Group] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_groups):
        group = c.group(raw, f"groups[{i}]", grain)
        if group.name in seen:
            raise c.fail(f"groups[{i}].name", f"duplicate group name {group.name!r}")
        seen.add(group.name)
        groups.append(group)
    c.tenants(groups)
    pools = c.pools(data["pools"], groups, grain) if "pools" in data else ()
    scenario = Scenario(
        name=name,
        grain=grain,
        groups=tuple(groups),
        description=description,
        env_concurrency=env_concurrency,
        burst_factor=burst_factor,
        max_count=max_count,
        hold=hold,
        per_key_cap=per_key_cap,
        total_cap=total_cap,
        steps_limit=steps_limit,
        disciplines=tuple(disciplines),
        source=source,
        borrow=borrow,
        charge=charge,
        shards=shards,
        pools=pools,
        aging=aging,
    )
    if sum(g.keys for g in groups) > MAX_KEYS:
        raise c.fail("groups", f"more than {MAX_KEYS} keys in all")
    if scenario.total_messages > MAX_MESSAGES:
        raise c.fail("groups", f"{scenario.total_messages} messages, more than {MAX_MESSAGES}")
    return scenario


def load_scenario_file(path: str | Path) -> Scenario:
    """Read and validate a scenario TOML file.

    Raises:
        ScenarioError: the file is unreadable, not TOML, or invalid (naming the field).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(str(p), "<file>", f"cannot read: {exc.strerror or exc}") from None
    return loads_scenario(text, source=str(p), default_name=p.stem)


def loads_scenario(text: str, *, source: str = "<string>", default_name: str = "") -> Scenario:
    """Validate scenario TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(source, "<toml>", f"not valid TOML: {exc}") from None
    return parse_scenario(data, source=source, default_name=default_name)


def builtin_names() -> list[str]:
    """Names of the built-in scenarios, queue grain first, in table order."""
    return [s.name for s in builtin_scenarios()]


def builtin_scenarios() -> list[Scenario]:
    """Every built-in scenario (``fairq/sim/scenarios/*.toml``), in table order."""
    folder = resources.files("fairq.sim") / "scenarios"
    entries = sorted(
        (e for e in folder.iterdir() if e.name.endswith(".toml")), key=lambda e: e.name
    )
    # files are numbered (``03_weighted.toml``) so that sorting by file name gives table order
    return [
        loads_scenario(
            e.read_text(encoding="utf-8"),
            source=f"builtin:{e.name}",
            default_name=e.name[: -len(".toml")].split("_", 1)[-1],
        )
        for e in entries
    ]


def resolve_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a scenario file by path.

    Raises:
        ScenarioError: unknown name, missing file, or an invalid file.
    """
    for scenario in builtin_scenarios():
        if scenario.name == name_or_path:
            return scenario
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        return load_scenario_file(p)
    raise ScenarioError(
        name_or_path, "<scenario>",
        f"not a built-in scenario ({', '.join(builtin_names())}) nor a .toml file",
    )  # fmt: skip
