"""The key schema: shard hash, name validation, concurrency-key encoding (no server)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairq import keys as K
from fairq.errors import FairqError, InvalidNameError
from fairq.keys import Environment, KeySchema

# --------------------------------------------------------------------------- jump hash

#: The reference's expectations (runqueue-semantics.md §1.3): env id -> shard at 2/4/8.
REFERENCE_SHARDS = {
    "env1": (0, 0, 0),
    "env2": (0, 0, 4),
    "env3": (1, 3, 4),
    "env4": (1, 2, 2),
    "e1234": (1, 1, 4),
}


@pytest.mark.parametrize("env_id", sorted(REFERENCE_SHARDS))
@pytest.mark.parametrize("index, buckets", [(0, 2), (1, 4), (2, 8)])
def test_jump_hash_matches_the_reference_table(env_id: str, index: int, buckets: int) -> None:
    assert K.jump_hash(env_id, buckets) == REFERENCE_SHARDS[env_id][index]


def test_jump_hash_is_stable_and_in_range() -> None:
    for buckets in (1, 3, 16, 1000):
        for i in range(200):
            shard = K.jump_hash(f"org:proj:env{i}", buckets)
            assert 0 <= shard < buckets
            assert shard == K.jump_hash(f"org:proj:env{i}", buckets)


def test_jump_hash_moves_few_keys_when_buckets_grow() -> None:
    """Consistent hashing: going from 8 to 9 shards moves roughly 1/9 of the keys."""
    ids = [f"o:p:e{i}" for i in range(2000)]
    moved = sum(K.jump_hash(i, 8) != K.jump_hash(i, 9) for i in ids)
    assert moved < 2000 * 0.2
    # and a key that moves always moves to the new bucket
    assert all(K.jump_hash(i, 9) in (K.jump_hash(i, 8), 8) for i in ids)


@pytest.mark.parametrize("buckets", [0, -1])
def test_jump_hash_rejects_non_positive_buckets(buckets: int) -> None:
    with pytest.raises(ValueError):
        K.jump_hash("env1", buckets)


def test_schema_shard_of_hashes_the_full_environment_id() -> None:
    schema = KeySchema("fq", 8)
    env = Environment("o1234", "p1234", "e1234")
    assert schema.shard_of(env) == K.jump_hash("o1234:p1234:e1234", 8)


# --------------------------------------------------------------------------- names

BAD_NAMES = [
    "",
    "a:b",
    "a b",
    "{tag}",
    "a}",
    "*",
    "a*",
    "a|b",
    "a%b",
    ".hidden",
    "-dash",
    "a/b",  # only queues may contain '/'
    "ü",
    "a\nb",
    "x" * (K.MAX_NAME_LENGTH + 1),
]


@pytest.mark.parametrize("bad", BAD_NAMES)
@pytest.mark.parametrize("kind", ["org", "project", "env"])
def test_environment_rejects_bad_names(kind: str, bad: str) -> None:
    parts = {"org": "o", "project": "p", "env": "e"}
    parts[kind] = bad
    with pytest.raises(InvalidNameError) as info:
        Environment(parts["org"], parts["project"], parts["env"])
    assert info.value.kind == kind
    assert info.value.value == bad
    assert isinstance(info.value, FairqError) and isinstance(info.value, ValueError)
    assert kind in str(info.value)


@pytest.mark.parametrize("bad", [b for b in BAD_NAMES if b != "a/b"])
def test_queue_names_are_validated(bad: str) -> None:
    schema = KeySchema("fq", 4)
    with pytest.raises(InvalidNameError) as info:
        schema.queue(Environment("o", "p", "e"), bad)
    assert info.value.kind == "queue"


@pytest.mark.parametrize("good", ["task/my-task", "a", "A_b.c-d/e", "0", "x" * K.MAX_NAME_LENGTH])
def test_queue_names_may_contain_slashes(good: str) -> None:
    schema = KeySchema("fq", 4)
    assert schema.queue(Environment("o", "p", "e"), good).base.endswith(":" + good)


def test_non_string_names_are_rejected() -> None:
    with pytest.raises(InvalidNameError, match="must be a string"):
        K.validate_name("run id", 12)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "a:b", "{x}", "a b", "x" * 65])
def test_bad_prefixes_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidNameError):
        KeySchema(bad, 4)


@pytest.mark.parametrize("bad", [0, -1, 16385])
def test_bad_shard_counts_are_rejected(bad: int) -> None:
    with pytest.raises(InvalidNameError):
        KeySchema("fq", bad)


def test_environment_parse() -> None:
    assert Environment.parse("o:p:e") == Environment("o", "p", "e")
    assert Environment.parse("o/p/e") == Environment("o", "p", "e")
    with pytest.raises(InvalidNameError):
        Environment.parse("o:p")
    with pytest.raises(InvalidNameError):
        Environment.parse("o:p:e:x")


# --------------------------------------------------------------------------- concurrency keys

TRICKY_KEYS = [
    "*",
    ":",
    "a:b",
    "{",
    "}",
    "{tag}",
    "%",
    "%3A",
    "a%3Ab",
    " ",
    "tenant-1",
    "user@example.com",
    "ck:*",
    "x:queued",
    "x:inflight",
    "ümlaut",
    "日本語",
    "emoji-🎉",
    "a/b",
    "line\nbreak",
    "\x00",
    "x" * K.MAX_CONCURRENCY_KEY_BYTES,
]

_ENCODED_RE = re.compile(r"^(?:[A-Za-z0-9_.\-]|%[0-9A-F]{2})+$")


@pytest.mark.parametrize("ck", TRICKY_KEYS)
def test_concurrency_key_round_trips(ck: str) -> None:
    encoded = K.encode_concurrency_key(ck)
    assert K.decode_concurrency_key(encoded) == ck
    assert _ENCODED_RE.match(encoded)
    for forbidden in ":{}*| ":
        assert forbidden not in encoded


@given(st.text(min_size=1, max_size=60))
def test_concurrency_key_encoding_is_a_safe_bijection(ck: str) -> None:
    encoded = K.encode_concurrency_key(ck)
    assert _ENCODED_RE.match(encoded)
    assert K.decode_concurrency_key(encoded) == ck


def test_distinct_keys_encode_distinctly() -> None:
    encoded = [K.encode_concurrency_key(ck) for ck in TRICKY_KEYS]
    assert len(set(encoded)) == len(TRICKY_KEYS)


def test_safe_keys_are_kept_readable() -> None:
    assert K.encode_concurrency_key("tenant-1_a.b") == "tenant-1_a.b"
    assert K.encode_concurrency_key("*") == "%2A"
    assert K.encode_concurrency_key("a:b") == "a%3Ab"


@pytest.mark.parametrize(
    "bad, reason",
    [
        ("", "must not be empty"),
        ("x" * (K.MAX_CONCURRENCY_KEY_BYTES + 1), "longer than"),
        ("é" * (K.MAX_CONCURRENCY_KEY_BYTES // 2 + 1), "longer than"),  # counted in bytes
        (7, "must be a string"),
    ],
)
def test_bad_concurrency_keys_are_rejected(bad: object, reason: str) -> None:
    with pytest.raises(InvalidNameError, match=reason) as info:
        K.encode_concurrency_key(bad)  # type: ignore[arg-type]
    assert info.value.kind == "concurrency key"


def _all_queue_keys(schema: KeySchema, env: Environment, queue: str) -> set[str]:
    q = schema.queue(env, queue)
    return {getattr(q, attr) for attr in K.QUEUE_KEYS} | {q.history(0)}


def _all_env_keys(schema: KeySchema, env: Environment) -> set[str]:
    e = schema.env(env)
    return {getattr(e, attr) for attr in K.ENV_KEYS} | {e.message("run1"), e.outcome("run1")}


def _all_shard_keys(schema: KeySchema) -> set[str]:
    return {getattr(s, attr) for s in schema.shards() for attr in K.SHARD_KEYS}


def test_no_encoded_concurrency_key_collides_with_another_key() -> None:
    """A variant key is ``B:ck:<K>:queued|inflight``; K never contains ':' so no CK value
    can produce another variant's key, a base-queue key, or a key of another queue."""
    schema = KeySchema("fq", 2)
    env = Environment("o", "p", "e")
    fixed = _all_queue_keys(schema, env, "q") | _all_queue_keys(schema, env, "q/ck")
    fixed |= _all_env_keys(schema, env) | _all_shard_keys(schema)
    q = schema.queue(env, "q")
    seen: set[str] = set()
    for ck in [*TRICKY_KEYS, "queued", "inflight", "ckindex", "a:ck:b", "b:queued", "keys", "t"]:
        encoded = K.encode_concurrency_key(ck)
        tenant_keys = q.tenant_keys(K.encode_tenant(ck))
        assert tenant_keys not in fixed
        assert tenant_keys not in seen
        seen.add(tenant_keys)
        for key in (q.variant_queued(encoded), q.variant_inflight(encoded)):
            assert key not in fixed
            assert key not in seen
            seen.add(key)
            # the variant part parses back unambiguously
            rest = key[len(q.base) + len(":ck:") :]
            got, suffix = rest.split(":")
            assert suffix in ("queued", "inflight")
            assert K.decode_concurrency_key(got) == ck


def test_every_key_of_an_environment_shares_its_shard_tag() -> None:
    schema = KeySchema("fq", 8)
    for name in ("env1", "env2", "env3", "e1234"):
        env = Environment("o", "p", name)
        shard = schema.shard(schema.shard_of(env))
        keys = _all_queue_keys(schema, env, "task/a") | _all_env_keys(schema, env)
        keys |= {getattr(shard, attr) for attr in K.SHARD_KEYS}
        q = schema.queue(env, "task/a")
        keys.add(q.tenant_keys(K.encode_tenant("{t}")))
        keys |= {q.variant_queued(K.encode_concurrency_key("{x}")), q.variant_inflight("a")}
        for key in keys:
            assert key.startswith(shard.tag + ":")
            # exactly one hash tag: the first '{' ... '}' is the shard's
            assert key.count("{") == 1 and key.count("}") == 1


def test_different_prefixes_never_share_keys() -> None:
    env = Environment("o", "p", "e")
    a, b = KeySchema("a", 4), KeySchema("a.b", 4)
    assert not _all_queue_keys(a, env, "q") & _all_queue_keys(b, env, "q")
    assert a.wake_channel != b.wake_channel


def test_heads_and_lease_members_round_trip() -> None:
    env = Environment("org-1", "proj.1", "prod_1")
    for kind in (K.KIND_QUEUE, K.KIND_CK):
        member = K.heads_member(kind, env, "task/with/slashes")
        assert K.parse_heads_member(member) == (kind, env, "task/with/slashes")
    member = K.lease_member(env, "run_1.a-b")
    assert K.parse_lease_member(member) == (env, "run_1.a-b")


def test_reserved_flow_and_default_tenant_names_cannot_be_encoded_values() -> None:
    """'*' (the keyless flow) and '/<queue>' (a queue's default tenant) are never the
    encoding of a user's key or tenant, so they can never be confused with one."""
    for value in ["*", "/", "/jobs", "%2A", "a/b", *TRICKY_KEYS]:
        for encoded in (K.encode_concurrency_key(value), K.encode_tenant(value)):
            assert encoded != K.KEYLESS_FLOW
            assert not encoded.startswith("/")
    assert K.decode_tenant("/jobs") is None
    assert K.decode_tenant(K.encode_tenant("acme/eu")) == "acme/eu"


def test_a_lone_surrogate_key_or_tenant_is_refused() -> None:
    with pytest.raises(InvalidNameError, match="surrogate"):
        K.encode_concurrency_key("a\udc80")
    with pytest.raises(InvalidNameError, match="surrogate"):
        K.encode_tenant("\ud800")


def test_the_lua_key_builders_spell_the_same_names_as_python() -> None:
    """The Lua schema is generated from the same tables; its builders produce the same
    strings (checked on the generated text)."""
    lua = K.lua_schema()
    for table in (K.SHARD_KEYS, K.ENV_KEYS, K.QUEUE_KEYS, K.VARIANT_KEYS, K.TENANT_KEYS):
        for attr, suffix in table.items():
            assert f"{attr} = '{suffix}'" in lua
    schema = KeySchema("fq", 4)
    env = Environment("o", "p", "e")
    q = schema.queue(env, "jobs")
    tag = schema.tag_of(env)
    assert q.base == f"{tag}:{K.QUEUE_PART}:{env.id}:jobs"
    assert f"tag .. ':{K.QUEUE_PART}:' .. env_id .. ':' .. queue" in lua


def test_a_one_key_entry_reads_back_bit_for_bit_and_text_entries_still_read() -> None:
    """A ``tsolo`` entry holds the key floor and the key's tag exactly (any double, no
    digits lost) and the flow whole (spaces and non-ASCII included); the text form of an
    older fairq reads as the same three values."""
    for floor, tag, flow in [
        (0.0, 0.0, "A/a"),
        (1 / 3, 2 / 3 + 1e-12, "t%20x/k y"),
        (-2.5, 1e300, "ténant/ключ"),
        (12345678.000000001, 12345679.1, "/"),
    ]:
        entry = K.solo_entry(floor, tag, flow)
        assert entry[:1] == b"\0"
        assert K.parse_solo_entry(entry) == (floor, tag, flow)
    assert K.parse_solo_entry(b"2 3 A/a") == (2.0, 3.0, "A/a")
    assert K.parse_solo_entry("0.33333333333333331 1e+300 A/a b") == (1 / 3, 1e300, "A/a b")
