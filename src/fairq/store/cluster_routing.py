"""Route script calls on a Redis Cluster by their keys, without asking a node.

``FCALL`` is a "movable keys" command: redis-py's cluster client does not know where its
keys are, so before every call it sends ``COMMAND GETKEYS`` (with the whole argument
list) to a node, twice, and does so outside its retry loop (a restarted node then fails
the call instead of being retried). ``FCALL``'s keys are plainly ``args[3 : 3 + numkeys]``
(as ``EVALSHA``'s, which redis-py special-cases), so :func:`route_fcall_by_keys` gives
the client a commands parser that reads them from the arguments.
"""

from __future__ import annotations

from typing import Any

from redis._parsers import AsyncCommandsParser
from redis.asyncio.cluster import RedisCluster

_FUNCTION_CALLS = frozenset({"FCALL", "FCALL_RO"})


class FcallKeysParser(AsyncCommandsParser):
    """A commands parser that finds ``FCALL``'s keys in its arguments."""

    async def get_keys(self, *args: Any) -> tuple[Any, ...] | None:
        if len(args) >= 3 and str(args[0]).upper() in _FUNCTION_CALLS:
            return tuple(args[3 : 3 + int(args[2])])
        return await super().get_keys(*args)


def route_fcall_by_keys(client: Any) -> None:
    """Give a cluster client the parser above (once; other clients are left alone)."""
    if not isinstance(client, RedisCluster):
        return
    parser = client.commands_parser
    if isinstance(parser, FcallKeysParser):
        return
    replacement = FcallKeysParser()
    replacement.commands = parser.commands
    if hasattr(parser, "node"):
        replacement.node = parser.node
    client.commands_parser = replacement
