"""The key schema: every Redis key fairq uses is named here and nowhere else.

The tables below (:data:`SHARD_KEYS`, :data:`ENV_KEYS`, :data:`QUEUE_KEYS`,
:data:`VARIANT_KEYS`, :data:`TENANT_KEYS`) are the one written description of the
keyspace. Python builds key names from them (:class:`KeySchema`), and the script loader
generates the Lua key builders from the very same tables (:func:`lua_schema`), so a key
name is never spelled twice.

Cluster safety
--------------
Every environment belongs to one *shard*, chosen by a stable jump hash of its id over
``shard_count``. A shard is a Redis Cluster hash tag: ``{<prefix>.<shard>}``. Every key
of an environment (its queues, variants, tenants, runs, limits, DLQ) starts with its
shard's tag, and so do the per-shard keys. Every script receives the shard tag as
``KEYS[1]`` and builds the names it touches from it with the generated builders, so
every script touches keys of exactly one hash slot, and never uses ``KEYS``/``SCAN``.

Partitions
----------
An environment may be spread over ``S`` *partitions* (``S`` per environment, default 1).
Partition 0 is the environment's shard; partition ``p > 0`` is another shard, the first
one not yet taken along the sequence ``jump_hash("E#p")``, ``+1``, ``+2`` … (so ``S`` is
at most ``shard_count``, and the partitions of a smaller ``S`` are the first ones of a
larger). A partition holds every key of the environment above under its own shard's
tag: it is an environment of its own to the scripts. A tenant lives in one partition,
``jump_hash(tenant, S)`` (a run without a named tenant: of its concurrency key; a run
with neither: partition 0), so its caps and its fair order are exact inside it.

Names
-----
``org``, ``project``, ``env`` and ``queue`` names are validated (letters, digits and
``_ . -``; queues may also contain ``/``; at most 128 characters). Run ids are
validated the same way. Concurrency keys and tenants are client-chosen (tenant ids,
e-mails…), so they are *encoded* instead: every byte outside ``[A-Za-z0-9_.-]`` becomes
``%XX``. An encoded value can therefore never contain ``:``, ``{``, ``}``, ``*`` or
``/`` and never collides with another key or with a suffix below. Two reserved values
use characters no encoding produces: ``*`` names a queue's keyless flow, and
``/<queue>`` is the default tenant of a queue's keyless runs.

Layout (``T`` = shard tag, ``E`` = ``org:project:env``, ``Q`` = queue, ``K`` = encoded
concurrency key, ``N`` = encoded tenant)
Per shard (``T:<name>``)
  heads        ZSET  member ``q:E:Q`` (keyless runs) / ``ck:E:Q`` (keyed runs) -> the oldest
                     head score (ms) of what it stands for: the queue-heads index
  leases       ZSET  ``E:<run>`` -> lease deadline (ms, server clock)
  ttl          ZSET  ``E:<run>`` -> TTL deadline (ms)
  envs         SET   ``E`` of every environment seen on this shard
  etag         ZSET  ``E`` -> the environment's virtual tag (fair order across environments),
                     and ``~floor`` -> the shard's environment virtual time (monotonic)
  eweights     HASH  ``E`` -> environment weight (sparse, default 1)
Per run
  ``T:m:E:<run>``   HASH  the run: queue, key, tenant, payload, score, attempt, lease token…
  ``T:r:E:<run>``   STRING the run's outcome (JSON), EXPIRE = the outcome retention
Per environment (``V`` = ``T:e:E``, keys ``V:<name>``)
  inflight     SET   run ids holding an environment slot
  config       HASH  the environment's limits and options, and its queues' (fields
                     ``q:<Q>:<name>``): concurrency, burst_factor, max_queue_size, order…
  queues       SET   queue names used in this environment
  dlq          ZSET  run id -> dead-lettered at (ms)
  gated        STRING set by a dequeue that left ready work behind a limit; the next
                     script that frees a slot wakes consumers (and deletes it)
  tt           ZSET  tenant -> its virtual tag (fair order; active and parked tenants),
                     and ``~floor`` -> the environment's tenant virtual time (monotonic;
                     no encoded name contains ``~``)
  tw           HASH  tenant -> weight (sparse, default 1)
  newcomers    HASH  the admission of new tenants (fair order, ``admission = budget``):
                     ``clock`` (the newcomers' virtual clock), ``epoch`` (the floor's
                     quantum it counts in) and ``joined`` (new tenants in that epoch)
  schedules    HASH  schedule name -> its last claimed tick (ms): each tick enqueues once
  audit        LIST  admin actions (JSON: at, who, action, target, detail), newest first,
                     bounded, with a TTL
  quota        HASH  only for an environment spread over partitions: in partition 0, the
                     ledger of its cluster-wide caps (``cap:<scope>``, ``grant:<scope>:<p>``,
                     ``epoch``, ``hold``); in every partition, ``fence`` (the oldest epoch
                     a quota grant may carry). Scope ``*`` = the environment's concurrency,
                     else a queue's name (its total)
  quotalock    STRING in partition 0: lets one process at a time move quota
Per base queue (``B`` = ``T:q:E:Q``, keys ``B:<name>``)
  queued       ZSET  keyless runs: run id -> score (ms)
  inflight     SET   keyless runs holding a queue slot
  ckindex      ZSET  F -> head score (ms) of every variant with queued runs
  ckqueued     STRING runs queued across all variants (lazy, TTL)
  ckrunning    STRING runs in flight across all variants (lazy, TTL)
  trunning     HASH  tenant -> runs in flight (runs with a named tenant; lazy, TTL)
  kcaps        HASH  K -> concurrency cap override (sparse)
  tcaps        HASH  tenant -> concurrency cap override (sparse)
  krates       HASH  K -> ``rate:burst`` rate-limit override (runs/s; sparse)
  trates       HASH  tenant -> ``rate:burst`` (sparse)
  buckets      HASH  ``q`` / ``k:K`` / ``t:N`` -> ``tokens:updated_ms`` token buckets
  ckweights    HASH  K -> weight inside its tenant (fair order; sparse, default 1)
  tq           ZSET  tenant -> copy of its virtual tag, for tenants with servable flows
                     here (fair order)
  tsolo        HASH  named tenant -> its one key while it has one key in play here (and
                     had no second since): the tenant's key virtual time, the key's
                     virtual tag inside the tenant and the key (fair order; such a
                     tenant has no key set; :func:`parse_solo_entry` reads an entry)
  park         HASH  ``t:N`` / ``k:K`` -> tag of a tenant or key taken out of the fair
                     order while gated (at a cap, rate-limited, or only future runs)
  parkdue      ZSET  the same members -> when a time-gated one may return (ms)
  recent       LIST  the last finished runs (one line each), newest first, bounded
  aging        ZSET  runs below the highest priority level of a queue that promotes
                     waiting runs -> when the run moves up one level (ms)
  ``h:<bucket>``  HASH  per-10-s history: runs served, waited, finished… (EXPIRE)
  ``s:<bucket>``  HASH  per-10-s shares: backlog samples taken, each flow's summed
                     entitled share, runs and run time received by lease start (EXPIRE)
Per variant (``B:ck:F:<name>``; ``F`` a flow: ``K``, or a named tenant's ``N/K`` or ``N/``)
  queued       ZSET  the variant's runs: run id -> score (ms)
  inflight     SET   the variant's runs holding a slot
Per tenant of a queue (``B:t:N:<name>``; only for named tenants not kept in ``tsolo``)
  keys         ZSET  K -> the key's virtual tag inside the tenant; member ``!floor``: the
                     tenant's key virtual time in this queue
Global (never touched by a script)
  ``<prefix>:wake``  pub/sub channel: "work may be available" hints for consumers
  ``<prefix>:meta``  HASH  the shard count and prefix every process must agree on
  ``<prefix>:placement``  HASH  ``E`` -> how many partitions the environment has (only
                     for environments spread over several; see Partitions below)
  ``<prefix>:maintenance-lock``  STRING lets one consumer per interval run maintenance
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from fairq.errors import InvalidLimitError, InvalidNameError

#: Maximum length of an org, project, env, queue name or run id.
MAX_NAME_LENGTH: Final = 128
#: Maximum length of a concurrency key or tenant before encoding (UTF-8 bytes).
MAX_CONCURRENCY_KEY_BYTES: Final = 256

_NAME_RE: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_QUEUE_RE: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-/]*$")
_PREFIX_RE: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$")
_CK_SAFE: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")

#: Environments whose shard a KeySchema remembers.
_SHARD_CACHE_SIZE: Final = 65_536
#: Most partitions one environment may have (and at most the shard count).
MAX_PARTITIONS: Final = 256

#: Queue-heads index member kinds: a queue's keyless runs, and its keyed runs.
KIND_QUEUE: Final = "q"
KIND_CK: Final = "ck"
#: The flow name of a queue's keyless runs (no encoded key can be ``*``).
KEYLESS_FLOW: Final = "*"
#: The member of a virtual-tag index that holds its floor (no encoded name has ``~``).
FLOOR_MEMBER: Final = "~floor"
#: The member of a tenant's key set that holds its key floor: ``!`` sorts before every
#: character an encoded name starts with, so among equal tags (keys join at the floor)
#: it comes first and a read of the set's first entries finds it. A key set written
#: before this name keeps its floor under :data:`FLOOR_MEMBER` until a script moves it.
KEY_FLOOR_MEMBER: Final = "!floor"
#: Between a named tenant and its key in a flow's name (no encoded name has ``/``): a
#: flow is ``K`` (a key of no named tenant), ``N/K`` (tenant N's key K), ``N/`` (tenant
#: N's runs without a key) or ``*`` (the keyless runs of no named tenant).
FLOW_TENANT_SEPARATOR: Final = "/"
#: Priority levels: 1 is the highest; a queue has ``priority_levels`` of them (at most
#: :data:`MAX_LEVELS`). The runs of level :data:`BASE_LEVEL` wait in the queue's own
#: keys; every other level has its own order keys (its queued sets, its index of keyed
#: flows, its fair-order state) under ``<base>@<level>`` (no queue or environment name
#: contains ``@``), while the limits (slots, counters, caps, rate buckets) stay the
#: queue's, shared by its levels.
LEVEL_SEPARATOR: Final = "@"
BASE_LEVEL: Final = 3
MAX_LEVELS: Final = 9
#: A queue's priority levels unless set (``priority_levels``); a run that gives no level
#: gets the middle one, :func:`default_level`.
DEFAULT_PRIORITY_LEVELS: Final = 5


def default_level(levels: int) -> int:
    """The level of a run that names none, in a queue of ``levels`` levels."""
    return (levels + 1) // 2


#: A consumer pool (the set of queues a consumer serves) has its own fair-order tenant
#: state (tags, floor, newcomers) under ``<V>#<pool>`` (:func:`pool_name`); pool 0 (a
#: consumer of every queue) keeps the environment's own keys. No name contains ``#``.
POOL_SEPARATOR: Final = "#"
#: Pool ids are the first 48 bits of a SHA-1 (exact as a Lua number).
POOL_BITS: Final = 48


def pool_id(queues: Sequence[str] | None) -> int:
    """The pool of a consumer that serves ``queues`` (0: every queue): the same queues
    give the same pool, whatever their order."""
    if queues is None:
        return 0
    names = "\n".join(sorted(set(queues))).encode("utf-8")
    return int(hashlib.sha1(names, usedforsecurity=False).hexdigest()[: POOL_BITS // 4], 16) or 1


def pool_name(prefix: str, pool: int) -> str:
    """The prefix of a pool's tenant state (the environment's own for pool 0)."""
    return prefix if pool == 0 else f"{prefix}{POOL_SEPARATOR}{pool}"


def level_name(name: str, level: int) -> str:
    """The name of a queue's (or an environment's) order keys at ``level``."""
    return name if level == BASE_LEVEL else f"{name}{LEVEL_SEPARATOR}{level}"


def flow_of(encoded_key: str, encoded_tenant: str) -> str:
    """The flow a run belongs to: a key is scoped by the run's named tenant, so two
    tenants using one key name have two flows (neither can take the other's service)."""
    if encoded_tenant:
        return f"{encoded_tenant}{FLOW_TENANT_SEPARATOR}{encoded_key}"
    return encoded_key or KEYLESS_FLOW


def split_flow(flow: str) -> tuple[str | None, str]:
    """Invert :func:`flow_of`: ``(encoded tenant or None, encoded key or '')``."""
    if flow == KEYLESS_FLOW:
        return None, ""
    tenant, sep, key = flow.partition(FLOW_TENANT_SEPARATOR)
    return (tenant, key) if sep else (None, flow)


#: A ``tsolo`` entry: a zero byte, the key floor and the key's tag (little-endian doubles),
#: then the key's flow. (Older entries are text, ``floor tag flow``.)
SOLO_ENTRY: Final = struct.Struct("<Bdd")


def parse_solo_entry(raw: bytes | str) -> tuple[float, float, str]:
    """A ``tsolo`` entry -> (key floor, the key's tag, its flow), in either form."""
    data = raw.encode() if isinstance(raw, str) else raw
    if data[:1] == b"\0":
        _, floor, tag = SOLO_ENTRY.unpack_from(data)
        return floor, tag, data[SOLO_ENTRY.size :].decode()
    floor_text, tag_text, flow = data.decode().split(" ", 2)
    return float(floor_text), float(tag_text), flow


def solo_entry(floor: float, tag: float, flow: str) -> bytes:
    """The ``tsolo`` entry of a key (as the scripts write it)."""
    return SOLO_ENTRY.pack(0, floor, tag) + flow.encode()


#: Per-shard keys: attribute -> suffix (``T:<suffix>``).
SHARD_KEYS: Final = {
    "heads": "heads",
    "leases": "leases",
    "ttl": "ttl",
    "envs": "envs",
    "env_tags": "etag",
    "env_weights": "eweights",
}
#: Per-environment keys: attribute -> suffix (``T:e:E:<suffix>``).
ENV_KEYS: Final = {
    "inflight": "inflight",
    "config": "config",
    "queues": "queues",
    "dlq": "dlq",
    "gated": "gated",
    "tenant_tags": "tt",
    "tenant_weights": "tw",
    "newcomers": "newcomers",
    "schedules": "schedules",
    "audit": "audit",
    "quota": "quota",
    "quota_lock": "quotalock",
}
#: Per-base-queue keys: attribute -> suffix (``T:q:E:Q:<suffix>``).
QUEUE_KEYS: Final = {
    "queued": "queued",
    "inflight": "inflight",
    "ck_index": "ckindex",
    "ck_queued_counter": "ckqueued",
    "ck_running_counter": "ckrunning",
    "tenant_running": "trunning",
    "key_caps": "kcaps",
    "tenant_caps": "tcaps",
    "key_rates": "krates",
    "tenant_rates": "trates",
    "buckets": "buckets",
    "key_weights": "ckweights",
    "ready_tenants": "tq",
    "solo_keys": "tsolo",
    "parked": "park",
    "parked_due": "parkdue",
    "recent": "recent",
    "aging": "aging",
}
#: Per-variant keys: attribute -> suffix (``B:ck:K:<suffix>``).
VARIANT_KEYS: Final = {"queued": "queued", "inflight": "inflight"}
#: Per-(queue, tenant) keys: attribute -> suffix (``B:t:N:<suffix>``).
TENANT_KEYS: Final = {"keys": "keys"}
#: The per-queue keys each priority level has its own of (under ``level_name(B, L)``).
#: (QueueKeys.at_level keeps the others; a level's ``base`` names its variants' queued
#: sets and tenants' key sets, never a slot set.)
LEVEL_QUEUE_KEYS: Final = (
    "queued", "ck_index", "ready_tenants", "solo_keys", "parked", "parked_due",
)  # fmt: skip
#: Keys only the fair order uses: the age-order build of a script is generated without
#: them (so it can neither read nor write one), and their names never appear in it.
FAIR_ORDER_KEYS: Final = frozenset(
    {
        "env_tags", "env_weights", "tenant_tags", "tenant_weights", "ready_tenants",
        "solo_keys", "parked", "parked_due", "key_weights", "newcomers",
    }
)  # fmt: skip
#: Name parts between the tag and the identifiers.
ENV_PART: Final = "e"
QUEUE_PART: Final = "q"
RUN_PART: Final = "m"
OUTCOME_PART: Final = "r"
VARIANT_PART: Final = "ck"
TENANT_PART: Final = "t"
HISTORY_PART: Final = "h"
SHARES_PART: Final = "s"


def validate_name(kind: str, value: str, *, allow_slash: bool = False) -> str:
    """Check an org/project/env/queue name or run id and return it.

    Raises:
        InvalidNameError: when the value is empty, too long or has a forbidden character.
    """
    if not isinstance(value, str):
        raise InvalidNameError(kind, value, "must be a string")
    if not value:
        raise InvalidNameError(kind, value, "must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidNameError(kind, value, f"longer than {MAX_NAME_LENGTH} characters")
    pattern = _QUEUE_RE if allow_slash else _NAME_RE
    if not pattern.fullmatch(value):
        allowed = "letters, digits, '_', '.', '-'" + (", '/'" if allow_slash else "")
        raise InvalidNameError(
            kind, value, f"may only contain {allowed} (and not start with '.' or '-')"
        )
    return value


def validate_prefix(prefix: str) -> str:
    """Check a key prefix (one short name, no separators)."""
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise InvalidNameError("key prefix", prefix, "use 1-64 letters, digits, '_', '.', '-'")
    return prefix


def _encode(kind: str, value: str) -> str:
    if not isinstance(value, str):
        raise InvalidNameError(kind, value, "must be a string")
    try:
        raw = value.encode("utf-8", errors="strict")
    except UnicodeEncodeError:
        raise InvalidNameError(kind, value, "is not valid Unicode (lone surrogate)") from None
    if not raw:
        raise InvalidNameError(kind, value, "must not be empty")
    if len(raw) > MAX_CONCURRENCY_KEY_BYTES:
        raise InvalidNameError(kind, value, f"longer than {MAX_CONCURRENCY_KEY_BYTES} bytes")
    return "".join(chr(b) if b in _CK_SAFE else f"%{b:02X}" for b in raw)


def encode_concurrency_key(key: str) -> str:
    """Encode a client-chosen concurrency key so it is safe inside a key name.

    Raises:
        InvalidNameError: when the key is not a non-empty string of at most 256 bytes.
    """
    return _encode("concurrency key", key)


def encode_tenant(tenant: str) -> str:
    """Encode a tenant name like a concurrency key (any bytes are safe).

    Raises:
        InvalidNameError: when the tenant is not a non-empty string of at most 256 bytes.
    """
    return _encode("tenant", tenant)


def decode_concurrency_key(encoded: str) -> str:
    """Invert :func:`encode_concurrency_key` (and :func:`encode_tenant`)."""
    out = bytearray()
    i = 0
    data = encoded.encode("ascii")
    while i < len(data):
        if data[i] == 0x25:  # '%'
            out.append(int(data[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(data[i])
            i += 1
    return out.decode("utf-8")


def decode_tenant(encoded: str) -> str | None:
    """A stored tenant back to the user's name; None for a queue's default keyless tenant."""
    if encoded.startswith("/"):
        return None
    return decode_concurrency_key(encoded)


def tenant_partition(encoded_tenant: str, encoded_ck: str, partitions: int) -> int:
    """The partition of a run's tenant among ``partitions``: a jump hash of its named
    tenant, else of its concurrency key (the key is then its tenant), else 0 (a
    queue's keyless runs)."""
    if partitions <= 1:
        return 0
    name = encoded_tenant or encoded_ck
    return jump_hash(name, partitions) if name else 0


def jump_hash(key: str, buckets: int) -> int:
    """Lamping-Veach jump consistent hash of SHA-256(key) over ``buckets``."""
    if buckets <= 0:
        raise ValueError("buckets must be positive")
    (k,) = struct.unpack(">Q", hashlib.sha256(key.encode("utf-8")).digest()[:8])
    b, j = -1, 0
    while j < buckets:
        b = j
        k = ((k * 2862933555777941757) % (1 << 64)) + 1
        j = int((b + 1) * (float(1 << 31) / float((k >> 33) + 1)))
    return b


@dataclass(frozen=True, slots=True, order=True)
class Environment:
    """An environment: ``org → project → env``. Limits apply per environment."""

    org: str
    project: str
    name: str
    #: ``org:project:env``: unique, and the input of the shard hash (made once: every
    #: script call and lease member of the environment spells it).
    id: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_name("org", self.org)
        validate_name("project", self.project)
        validate_name("env", self.name)
        object.__setattr__(self, "id", f"{self.org}:{self.project}:{self.name}")

    @classmethod
    def parse(cls, text: str) -> Environment:
        """Parse ``org:project:env`` (or ``org/project/env``)."""
        if not isinstance(text, str):
            raise InvalidNameError("environment", text, "expected 'org:project:env'")
        parts = text.replace("/", ":").split(":")
        if len(parts) != 3:
            raise InvalidNameError("environment", text, "expected 'org:project:env'")
        return cls(*parts)

    def __str__(self) -> str:
        return self.id

    def __hash__(self) -> int:
        # the id's (a string keeps its hash): environments key the store's maps and every
        # enqueue's grouping, and the generated hash would hash three fields each time
        return hash(self.id)


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Every key of one base queue (and the prefixes its scripts extend)."""

    base: str
    queued: str
    inflight: str
    ck_index: str
    ck_queued_counter: str
    ck_running_counter: str
    tenant_running: str
    key_caps: str
    tenant_caps: str
    key_rates: str
    tenant_rates: str
    buckets: str
    key_weights: str
    ready_tenants: str
    solo_keys: str
    parked: str
    parked_due: str
    recent: str
    aging: str

    def at_level(self, level: int) -> QueueKeys:
        """The same queue's keys with its order keys (queued sets, ck_index, the fair
        order's) at priority ``level``; the others stay the queue's own."""
        if level == BASE_LEVEL:
            return self
        base = level_name(self.base, level)
        order = {attr: f"{base}:{QUEUE_KEYS[attr]}" for attr in LEVEL_QUEUE_KEYS}
        return replace(self, base=base, **order)

    def variant_queued(self, encoded_ck: str) -> str:
        return f"{self.base}:{VARIANT_PART}:{encoded_ck}:{VARIANT_KEYS['queued']}"

    def variant_inflight(self, encoded_ck: str) -> str:
        return f"{self.base}:{VARIANT_PART}:{encoded_ck}:{VARIANT_KEYS['inflight']}"

    def tenant_keys(self, encoded_tenant: str) -> str:
        return f"{self.base}:{TENANT_PART}:{encoded_tenant}:{TENANT_KEYS['keys']}"

    def history(self, bucket: int) -> str:
        return f"{self.base}:{HISTORY_PART}:{bucket}"

    def shares(self, bucket: int) -> str:
        return f"{self.base}:{SHARES_PART}:{bucket}"


@dataclass(frozen=True, slots=True)
class EnvKeys:
    """Every key of one environment."""

    prefix: str
    inflight: str
    config: str
    queues: str
    dlq: str
    gated: str
    tenant_tags: str
    tenant_weights: str
    newcomers: str
    schedules: str
    audit: str
    quota: str
    quota_lock: str
    message_prefix: str
    outcome_prefix: str

    def message(self, run_id: str) -> str:
        return self.message_prefix + run_id

    def outcome(self, run_id: str) -> str:
        return self.outcome_prefix + run_id


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """Every per-shard key."""

    shard: int
    tag: str
    heads: str
    leases: str
    ttl: str
    envs: str
    env_tags: str
    env_weights: str
    message_root: str


class KeySchema:
    """Builds key names for one prefix and shard count."""

    def __init__(self, prefix: str = "fairq", shard_count: int = 4) -> None:
        self.prefix = validate_prefix(prefix)
        if (
            isinstance(shard_count, bool)
            or not isinstance(shard_count, int)
            or not 1 <= shard_count <= 16384
        ):
            raise InvalidNameError("shard count", shard_count, "must be an integer in 1..16384")
        self.shard_count = shard_count
        self._shard_cache: dict[str, int] = {}
        self._partition_cache: dict[str, list[int]] = {}
        #: Pub/sub channel for wake-up hints (no hash tag: never used in a script's KEYS).
        self.wake_channel = f"{prefix}:wake"
        #: The configuration every process sharing the prefix must agree on.
        self.meta = f"{prefix}:meta"
        #: Lets one consumer per interval run maintenance.
        self.maintenance_lock = f"{prefix}:maintenance-lock"
        #: How many partitions each spread environment has.
        self.placement = f"{prefix}:placement"

    def shard_of(self, env: Environment) -> int:
        """The environment's shard (memoised: a SHA-256 per message adds up)."""
        shard = self._shard_cache.get(env.id)
        if shard is None:
            if len(self._shard_cache) >= _SHARD_CACHE_SIZE:
                self._shard_cache.clear()
            shard = self._shard_cache[env.id] = jump_hash(env.id, self.shard_count)
        return shard

    def partition_shards(self, env: Environment, partitions: int) -> list[int]:
        """The shards of an environment's first ``partitions`` partitions (partition 0 is
        its shard; see the module's docstring).

        Raises:
            InvalidLimitError: ``partitions`` is not in 1..min(shard_count, MAX_PARTITIONS).
        """
        check_partitions(partitions, self.shard_count)
        known = self._partition_cache.get(env.id)
        if known is None or len(known) < partitions:
            if len(self._partition_cache) >= _SHARD_CACHE_SIZE:
                self._partition_cache.clear()
            known = self._partition_cache[env.id] = self._place(env, partitions)
        return known[:partitions]

    def _place(self, env: Environment, partitions: int) -> list[int]:
        shards = [self.shard_of(env)]
        taken = set(shards)
        for p in range(1, partitions):
            shard = jump_hash(f"{env.id}#{p}", self.shard_count)
            while shard in taken:
                shard = (shard + 1) % self.shard_count
            shards.append(shard)
            taken.add(shard)
        return shards

    def partition_shard(self, env: Environment, partition: int) -> int:
        """The shard of one partition of an environment."""
        if partition == 0:
            return self.shard_of(env)
        return self.partition_shards(env, partition + 1)[partition]

    def partition_at(self, env: Environment, shard: int) -> int | None:
        """Which partition of ``env`` lives on ``shard`` (None: none can)."""
        if shard == self.shard_of(env):
            return 0
        limit = min(self.shard_count, MAX_PARTITIONS)
        shards = self.partition_shards(env, limit)
        return shards.index(shard) if shard in shards else None

    def tag(self, shard: int) -> str:
        """The hash tag of a shard: ``{prefix.N}``."""
        return "{" + f"{self.prefix}.{shard}" + "}"

    def shard(self, shard: int) -> ShardKeys:
        tag = self.tag(shard)
        named = {attr: f"{tag}:{suffix}" for attr, suffix in SHARD_KEYS.items()}
        return ShardKeys(shard=shard, tag=tag, message_root=f"{tag}:{RUN_PART}:", **named)

    def shards(self) -> list[ShardKeys]:
        return [self.shard(i) for i in range(self.shard_count)]

    def tag_of(self, env: Environment, partition: int = 0) -> str:
        """The hash tag of an environment's shard (or of one of its partitions)."""
        return self.tag(self.partition_shard(env, partition))

    def env(self, env: Environment, partition: int = 0) -> EnvKeys:
        tag = self.tag_of(env, partition)
        prefix = f"{tag}:{ENV_PART}:{env.id}"
        named = {attr: f"{prefix}:{suffix}" for attr, suffix in ENV_KEYS.items()}
        return EnvKeys(
            prefix=prefix,
            message_prefix=f"{tag}:{RUN_PART}:{env.id}:",
            outcome_prefix=f"{tag}:{OUTCOME_PART}:{env.id}:",
            **named,
        )

    def queue(self, env: Environment, queue: str, partition: int = 0) -> QueueKeys:
        validate_name("queue", queue, allow_slash=True)
        base = f"{self.tag_of(env, partition)}:{QUEUE_PART}:{env.id}:{queue}"
        named = {attr: f"{base}:{suffix}" for attr, suffix in QUEUE_KEYS.items()}
        return QueueKeys(base=base, **named)


def check_partitions(partitions: object, shard_count: int) -> int:
    """A partition count an environment may have: an integer in 1..min(shard_count, 256).

    Raises:
        InvalidLimitError: it is not.
    """
    high = min(shard_count, MAX_PARTITIONS)
    if (
        isinstance(partitions, bool)
        or not isinstance(partitions, int)
        or not 1 <= partitions <= high
    ):
        raise InvalidLimitError(
            "partition count",
            partitions,
            f"must be an integer in 1..{high} (at most the shard count)",
        )
    return partitions


def heads_member(kind: str, env: Environment, queue: str) -> str:
    """The queue-heads member standing for a queue's keyless (``q``) or keyed (``ck``) runs."""
    return f"{kind}:{env.id}:{queue}"


def parse_heads_member(member: str) -> tuple[str, Environment, str]:
    """Invert :func:`heads_member`: ``(kind, env, queue)``."""
    kind, org, project, name, queue = member.split(":", 4)
    return kind, Environment(org, project, name), queue.partition(LEVEL_SEPARATOR)[0]


def lease_member(env: Environment, run_id: str) -> str:
    """The member naming a run in the shard's lease and TTL indexes (``E:<run>``)."""
    return f"{env.id}:{run_id}"


def parse_lease_member(member: str) -> tuple[Environment, str]:
    org, project, name, run_id = member.split(":", 3)
    return Environment(org, project, name), run_id


def config_field(queue: str | None, name: str) -> str:
    """A field of an environment's config hash: the env's own, or ``q:<queue>:<name>``."""
    return name if queue is None else f"{QUEUE_PART}:{queue}:{name}"


def _lua_table(name: str, table: dict[str, str], fair: bool) -> str:
    body = ", ".join(
        f"{attr} = '{suffix}'"
        for attr, suffix in table.items()
        if fair or attr not in FAIR_ORDER_KEYS
    )
    return f"local {name} = {{ {body} }}"


#: Lua: a flow's name from a run's encoded key and named tenant, and back (see flow_of).
_LUA_FLOWS: Final = (
    "local function flow_of(ck, tenant)",
    "  if tenant ~= nil and tenant ~= '' then",
    f"    return tenant .. '{FLOW_TENANT_SEPARATOR}' .. ck",
    "  end",
    "  if ck == '' then return KEYLESS_FLOW end",
    "  return ck",
    "end",
    "-- the named tenant of a flow (nil: none), and its encoded key ('' = none)",
    "local function flow_tenant(flow)",
    f"  local at = string.find(flow, '{FLOW_TENANT_SEPARATOR}', 1, true)",
    "  if at == nil then return nil end",
    "  return string.sub(flow, 1, at - 1)",
    "end",
    "local function flow_key(flow)",
    "  if flow == KEYLESS_FLOW then return '' end",
    f"  local at = string.find(flow, '{FLOW_TENANT_SEPARATOR}', 1, true)",
    "  if at == nil then return flow end",
    "  return string.sub(flow, at + 1)",
    "end",
    "-- whether a flow's runs hold the queue's keyless slots (they have no key)",
    "local function flow_keyless(flow)",
    f"  return flow == KEYLESS_FLOW or string.sub(flow, -1) == '{FLOW_TENANT_SEPARATOR}'",
    "end",
)


def lua_schema(*, fair: bool = True) -> str:
    """The Lua key builders, generated from the tables above (see fairq.store.scripts).

    Args:
        fair: include the fair order's keys (False for the age-order builds).
    """
    tenant_builder = [
        "local function tenant_key(B, tenant, name)",
        f"  return B .. ':{TENANT_PART}:' .. tenant .. ':' .. TENANT_KEYS[name]",
        "end",
    ]
    return "\n".join(
        [
            "-- generated from fairq/keys.py: the key schema",
            _lua_table("SHARD_KEYS", SHARD_KEYS, fair),
            _lua_table("ENV_KEYS", ENV_KEYS, fair),
            _lua_table("QUEUE_KEYS", QUEUE_KEYS, fair),
            _lua_table("VARIANT_KEYS", VARIANT_KEYS, fair),
            *([_lua_table("TENANT_KEYS", TENANT_KEYS, fair)] if fair else []),
            *([f"local FLOOR_MEMBER = '{FLOOR_MEMBER}'"] if fair else []),
            *([f"local KEY_FLOOR_MEMBER = '{KEY_FLOOR_MEMBER}'"] if fair else []),
            f"local KEYLESS_FLOW = '{KEYLESS_FLOW}'",
            f"local BASE_LEVEL, MAX_LEVELS = {BASE_LEVEL}, {MAX_LEVELS}",
            f"local DEFAULT_PRIORITY_LEVELS = {DEFAULT_PRIORITY_LEVELS}",
            "local function pool_name(prefix, pool)",
            "  if pool == 0 then return prefix end",
            f"  return prefix .. '{POOL_SEPARATOR}' .. string.format('%d', pool)",
            "end",
            "local function level_name(name, level)",
            "  if level == BASE_LEVEL then return name end",
            f"  return name .. '{LEVEL_SEPARATOR}' .. level",
            "end",
            *_LUA_FLOWS,
            f"local KIND_QUEUE, KIND_CK = '{KIND_QUEUE}', '{KIND_CK}'",
            "local function shard_key(tag, name) return tag .. ':' .. SHARD_KEYS[name] end",
            f"local function env_prefix(tag, env_id) return tag .. ':{ENV_PART}:' .. env_id end",
            "local function env_key(V, name) return V .. ':' .. ENV_KEYS[name] end",
            "local function queue_prefix(tag, env_id, queue)",
            f"  return tag .. ':{QUEUE_PART}:' .. env_id .. ':' .. queue",
            "end",
            "local function queue_key(B, name) return B .. ':' .. QUEUE_KEYS[name] end",
            "local function variant_key(B, ck, name)",
            f"  return B .. ':{VARIANT_PART}:' .. ck .. ':' .. VARIANT_KEYS[name]",
            "end",
            *(tenant_builder if fair else []),
            f"local function history_key(B, bucket) return B .. ':{HISTORY_PART}:' .. bucket end",
            f"local function shares_key(B, bucket) return B .. ':{SHARES_PART}:' .. bucket end",
            "local function run_key(tag, member)",
            f"  return tag .. ':{RUN_PART}:' .. member",
            "end",
            "local function outcome_key(tag, member)",
            f"  return tag .. ':{OUTCOME_PART}:' .. member",
            "end",
            "local function heads_member(kind, env_id, queue)",
            "  return kind .. ':' .. env_id .. ':' .. queue",
            "end",
            "local function config_field(queue, name)",
            f"  return '{QUEUE_PART}:' .. queue .. ':' .. name",
            "end",
        ]
    )
