"""fairq's asyncio connections pack commands with hiredis: the same bytes as redis-py's
own packer, and redis-py's rules (and errors) for what hiredis does not take."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection, ConnectionPool, SSLConnection
from redis.exceptions import DataError

from fairq.packing import HiredisPacking, use_hiredis_packing

SCRIPT_CALL = (
    "FCALL", "fairq_enqueue_age_0123456789abcdef", 1, "{fairq.2}", "",
    "86400 86400 fairq:wake 100 1.0 0 age", "b:p:r", "noop", "", 0, "run-é", "", "",
    "", 0, 0, 0, '{"i": 1, "t": 0.5}', "", 0, "", 1.5, -3, 2**70, b"\x00\xff",
)  # fmt: skip


def _packing_connection() -> Connection:
    pool = ConnectionPool()
    use_hiredis_packing(pool)
    conn = pool.make_connection()
    assert isinstance(conn, HiredisPacking) and isinstance(conn, Connection)
    return conn


def test_a_script_call_packs_to_the_same_bytes_as_redis_py() -> None:
    assert b"".join(_packing_connection().pack_command(*SCRIPT_CALL)) == b"".join(
        Connection().pack_command(*SCRIPT_CALL)
    )


def test_a_command_name_of_several_words_is_split_as_redis_py_splits_it() -> None:
    args = ("CLIENT SETINFO", "LIB-NAME", "fairq")
    assert _packing_connection().pack_command(*args) == Connection().pack_command(*args)


def test_what_hiredis_does_not_pack_follows_redis_py() -> None:
    conn = _packing_connection()
    assert b"".join(conn.pack_command("SET", "k", bytearray(b"ab"))) == b"".join(
        Connection().pack_command("SET", "k", bytearray(b"ab"))
    )
    for bad in (None, True):
        with pytest.raises(DataError):
            conn.pack_command("SET", "k", bad)


def test_each_connection_class_keeps_its_kind_and_is_wrapped_once() -> None:
    pool = ConnectionPool(connection_class=SSLConnection)
    use_hiredis_packing(pool)
    first = pool.connection_class
    use_hiredis_packing(pool)
    assert pool.connection_class is first
    assert issubclass(first, SSLConnection) and issubclass(first, HiredisPacking)
