"""The key schema: every Redis key fairq uses is named here and nowhere else.

Cluster safety
--------------
Every environment belongs to one *shard*, chosen by a stable jump hash of its id over
``shard_count``. A shard is a Redis Cluster hash tag: ``{<prefix>.<shard>}``. Every key
of an environment (its queues, variants, messages, limits, DLQ) starts with its shard's
tag, and so do the per-shard keys (master queue, leases, TTL index, expiry stream). So
every Lua script touches keys of exactly one hash slot: it receives a few keys through
KEYS and derives the others by appending suffixes to a KEYS entry (or to a prefix stored
in a message hash that was itself built here), never by ``KEYS``/``SCAN``.

Names
-----
``org``, ``project``, ``env`` and ``queue`` names are validated (letters, digits and
``_ . -``; queues may also contain ``/``; at most 128 characters). Run ids are
validated the same way (``_ . -`` plus letters and digits). Concurrency keys are
client-chosen (tenant ids, e-mails…), so they are *encoded* instead: every byte outside
``[A-Za-z0-9_.-]`` becomes ``%XX``. An encoded key can therefore never contain ``:``,
``{``, ``}`` or ``*`` and never collides with another key or with a suffix below.

Layout (``T`` = shard tag, ``O:P:E`` = org:project:env, ``Q`` = queue, ``K`` = encoded CK)
------------------------------------------------------------------------------------------
Per shard
  ``T:master``            ZSET  member ``q:O:P:E:Q`` (keyless runs) or ``ck:O:P:E:Q``
                                (runs with concurrency keys); score = oldest head (ms)
  ``T:leases``            ZSET  member ``O:P:E:<run>``; score = lease deadline (ms)
  ``T:ttl``               ZSET  member ``O:P:E:<run>``; score = TTL deadline (ms)
  ``T:expired``           STREAM one entry per run that expired before delivery
  ``T:envs``              SET   ``O:P:E`` of every environment seen on this shard
  ``T:m:O:P:E:<run>``     HASH  one run: payload, queue prefix, CK, score, attempt, state…
  ``T:r:O:P:E:<run>``     STRING a run's outcome (JSON: status, result, error, attempts),
                                written by workers, EXPIRE = the app's result retention
  ``T:expired:cursor``    STRING last ``T:expired`` entry id copied into run outcomes
Per environment (``V`` = ``T:e:O:P:E``)
  ``V:inflight``          SET   run ids holding an environment slot
  ``V:limits``            HASH  ``concurrency``, ``burst_factor``, ``max_queue_size``
  ``V:queues``            SET   queue names used in this environment
  ``V:dlq``               ZSET  run id -> dead-lettered at (ms)
Per base queue (``B`` = ``T:q:O:P:E:Q``)
  ``B:queued``            ZSET  keyless runs: run id -> score (ms)
  ``B:inflight``          SET   keyless runs holding a queue slot
  ``B:limits``            HASH  ``concurrency`` (0 = paused), ``max_size``
  ``B:ckindex``           ZSET  K -> head score (ms) of every non-empty variant
  ``B:ckbusy``            SET   K of every variant with runs in flight
  ``B:ckqueued``          STRING runs queued across all variants (lazy, TTL)
  ``B:ckrunning``         STRING runs in flight across all variants (lazy, TTL)
  ``B:ck:K:queued``       ZSET  the variant's runs: run id -> score (ms)
  ``B:ck:K:inflight``     SET   the variant's runs holding a slot
  ``B:vtime``             ZSET  K -> next virtual start tag (fair order only)
  ``B:vfloor``            STRING the monotonic virtual-time floor (fair order only)
  ``B:vidle``             ZSET  K -> parked tag of a drained variant (fair order only)
  ``B:ckweights``         HASH  K -> weight (fair order only; sparse, default 1)
  ``B:served:<bucket>``   HASH  K ('' = keyless) -> runs served in one 10 s window; written
                                by consumers for the dashboard (fairq.metrics), EX 900 s
Global (never touched by a script)
  ``<prefix>:wake``       pub/sub channel: "work may be available" hints for consumers
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass
from typing import Final

from fairq.errors import InvalidNameError

#: Maximum length of an org, project, env, queue name or run id.
MAX_NAME_LENGTH: Final = 128
#: Maximum length of a concurrency key before encoding (UTF-8 bytes).
MAX_CONCURRENCY_KEY_BYTES: Final = 256

_NAME_RE: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_QUEUE_RE: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-/]*$")
_PREFIX_RE: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$")
_CK_SAFE: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")

#: Environments whose shard a KeySchema remembers.
_SHARD_CACHE_SIZE: Final = 65_536

#: Master-queue member kinds.
KIND_QUEUE: Final = "q"
KIND_CK: Final = "ck"


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
    if not pattern.match(value):
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


def encode_concurrency_key(key: str) -> str:
    """Encode a client-chosen concurrency key so it is safe inside a key name.

    Raises:
        InvalidNameError: when the key is not a non-empty string of at most 256 bytes.
    """
    if not isinstance(key, str):
        raise InvalidNameError("concurrency key", key, "must be a string")
    raw = key.encode("utf-8", errors="strict")
    if not raw:
        raise InvalidNameError("concurrency key", key, "must not be empty")
    if len(raw) > MAX_CONCURRENCY_KEY_BYTES:
        raise InvalidNameError(
            "concurrency key", key, f"longer than {MAX_CONCURRENCY_KEY_BYTES} bytes"
        )
    return "".join(chr(b) if b in _CK_SAFE else f"%{b:02X}" for b in raw)


def decode_concurrency_key(encoded: str) -> str:
    """Invert :func:`encode_concurrency_key`."""
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

    def __post_init__(self) -> None:
        validate_name("org", self.org)
        validate_name("project", self.project)
        validate_name("env", self.name)

    @property
    def id(self) -> str:
        """``org:project:env``: unique, and the input of the shard hash."""
        return f"{self.org}:{self.project}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> Environment:
        """Parse ``org:project:env`` (or ``org/project/env``)."""
        parts = text.replace("/", ":").split(":")
        if len(parts) != 3:
            raise InvalidNameError("environment", text, "expected 'org:project:env'")
        return cls(*parts)

    def __str__(self) -> str:
        return self.id


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Every key of one base queue (and the prefixes its scripts extend)."""

    base: str
    queued: str
    inflight: str
    limits: str
    ck_index: str
    ck_busy: str
    ck_queued_counter: str
    ck_running_counter: str
    vtime: str
    vtime_floor: str
    vtime_idle: str
    ck_weights: str

    def variant_queued(self, encoded_ck: str) -> str:
        return f"{self.base}:ck:{encoded_ck}:queued"

    def variant_inflight(self, encoded_ck: str) -> str:
        return f"{self.base}:ck:{encoded_ck}:inflight"


@dataclass(frozen=True, slots=True)
class EnvKeys:
    """Every key of one environment."""

    prefix: str
    inflight: str
    limits: str
    queues: str
    dlq: str
    message_prefix: str

    def message(self, run_id: str) -> str:
        return self.message_prefix + run_id


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """Every per-shard key."""

    shard: int
    tag: str
    master: str
    leases: str
    ttl: str
    expired: str
    envs: str
    message_root: str


class KeySchema:
    """Builds key names for one prefix and shard count."""

    def __init__(self, prefix: str = "fairq", shard_count: int = 4) -> None:
        self.prefix = validate_prefix(prefix)
        if not isinstance(shard_count, int) or not 1 <= shard_count <= 16384:
            raise InvalidNameError("shard count", shard_count, "must be an integer in 1..16384")
        self.shard_count = shard_count
        self._shard_cache: dict[str, int] = {}
        #: Pub/sub channel for wake-up hints (no hash tag: never used in a script's KEYS).
        self.wake_channel = f"{prefix}:wake"

    def shard_of(self, env: Environment) -> int:
        """The environment's shard (memoised: a SHA-256 per message adds up)."""
        shard = self._shard_cache.get(env.id)
        if shard is None:
            if len(self._shard_cache) >= _SHARD_CACHE_SIZE:
                self._shard_cache.clear()
            shard = self._shard_cache[env.id] = jump_hash(env.id, self.shard_count)
        return shard

    def shard(self, shard: int) -> ShardKeys:
        tag = "{" + f"{self.prefix}.{shard}" + "}"
        return ShardKeys(
            shard=shard,
            tag=tag,
            master=f"{tag}:master",
            leases=f"{tag}:leases",
            ttl=f"{tag}:ttl",
            expired=f"{tag}:expired",
            envs=f"{tag}:envs",
            message_root=f"{tag}:m:",
        )

    def shards(self) -> list[ShardKeys]:
        return [self.shard(i) for i in range(self.shard_count)]

    def env(self, env: Environment) -> EnvKeys:
        s = self.shard(self.shard_of(env))
        prefix = f"{s.tag}:e:{env.id}"
        return EnvKeys(
            prefix=prefix,
            inflight=f"{prefix}:inflight",
            limits=f"{prefix}:limits",
            queues=f"{prefix}:queues",
            dlq=f"{prefix}:dlq",
            message_prefix=f"{s.message_root}{env.id}:",
        )

    def queue(self, env: Environment, queue: str) -> QueueKeys:
        validate_name("queue", queue, allow_slash=True)
        s = self.shard(self.shard_of(env))
        base = f"{s.tag}:q:{env.id}:{queue}"
        return QueueKeys(
            base=base,
            queued=f"{base}:queued",
            inflight=f"{base}:inflight",
            limits=f"{base}:limits",
            ck_index=f"{base}:ckindex",
            ck_busy=f"{base}:ckbusy",
            ck_queued_counter=f"{base}:ckqueued",
            ck_running_counter=f"{base}:ckrunning",
            vtime=f"{base}:vtime",
            vtime_floor=f"{base}:vfloor",
            vtime_idle=f"{base}:vidle",
            ck_weights=f"{base}:ckweights",
        )


def master_member(kind: str, env: Environment, queue: str) -> str:
    """The master-queue member standing for a queue's keyless (``q``) or keyed (``ck``) runs."""
    return f"{kind}:{env.id}:{queue}"


def parse_master_member(member: str) -> tuple[str, Environment, str]:
    """Invert :func:`master_member`: ``(kind, env, queue)``."""
    kind, org, project, name, queue = member.split(":", 4)
    return kind, Environment(org, project, name), queue


def lease_member(env: Environment, run_id: str) -> str:
    """The member naming a run in the shard's lease and TTL indexes (``O:P:E:<run>``)."""
    return f"{env.id}:{run_id}"


def parse_lease_member(member: str) -> tuple[Environment, str]:
    org, project, name, run_id = member.split(":", 3)
    return Environment(org, project, name), run_id


def run_outcome_key(schema: KeySchema, env: Environment, run_id: str) -> str:
    """``T:r:O:P:E:<run>``: a run's outcome (status, result or error), kept for the retention."""
    return f"{schema.shard(schema.shard_of(env)).tag}:r:{env.id}:{run_id}"


def expired_cursor_key(shard: ShardKeys) -> str:
    """``T:expired:cursor``: id of the last ``T:expired`` entry recorded as a run outcome."""
    return f"{shard.tag}:expired:cursor"
