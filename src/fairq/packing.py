"""Command packing for fairq's asyncio clients: hiredis's C packer instead of redis-py's.

redis-py's blocking client packs commands with hiredis when it is installed; its asyncio
client packs them in Python, one argument at a time. A fairq script call carries about 20
arguments (the script's context and eleven fields per run), and packing them was the
largest single cost of an awaited ``trigger`` on the client (37 µs in Python, 4 µs with
hiredis, for the same bytes). :func:`use_hiredis_packing` makes a connection pool create
connections that pack with hiredis, and fall back to redis-py's own packing (and its
errors) for anything hiredis does not take.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio.connection import AbstractConnection, ConnectionPool


class HiredisPacking:
    """Mixin for a redis-py asyncio connection class: pack with ``hiredis.pack_command``."""

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        if (isinstance(first, str) and " " in first) or (
            isinstance(first, bytes) and b" " in first
        ):
            # a command name of several words ('CLIENT SETINFO'): redis-py splits it
            return super().pack_command(*args)  # type: ignore[misc, no-any-return]
        try:
            return [hiredis.pack_command(args)]
        except TypeError:
            # what hiredis does not pack (a bytearray; None or a bool, which redis-py refuses
            # with its own DataError): redis-py's rules apply
            return super().pack_command(*args)  # type: ignore[misc, no-any-return]


#: One packing subclass per connection class (plain, SSL, Unix socket).
_PACKING_CLASSES: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def _with_hiredis_packing(cls: type[AbstractConnection]) -> type[AbstractConnection]:
    packing = _PACKING_CLASSES.get(cls)
    if packing is None:
        packing = _PACKING_CLASSES[cls] = type(
            f"HiredisPacking{cls.__name__}", (HiredisPacking, cls), {}
        )
    return packing


def use_hiredis_packing(pool: ConnectionPool) -> None:
    """Make ``pool`` create connections of its class that pack with hiredis (before it
    creates any: connections it already made keep their class)."""
    cls = pool.connection_class
    if not issubclass(cls, HiredisPacking):
        pool.connection_class = _with_hiredis_packing(cls)
