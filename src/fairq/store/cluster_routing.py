"""Route script calls on a Redis Cluster by their keys, without asking a node.

``FCALL`` is a "movable keys" command: redis-py's cluster client does not know where its
keys are, so before every call it sends ``COMMAND GETKEYS`` (with the whole argument
list) to a node, twice, and does so outside its retry loop (a restarted node then fails
the call instead of being retried). ``FCALL``'s keys are plainly ``args[3 : 3 + numkeys]``
(as ``EVALSHA``'s, which redis-py special-cases), so :func:`route_fcall_by_keys` gives
the client a commands parser that reads them from the arguments.

The commands parser is a private part of redis-py (``redis._parsers``): redis-py offers no
public way to tell its cluster client where a command's keys are (``target_nodes`` gives
up the client's retries, and a ``MOVED`` reply is re-routed through the parser anyway).
Its interface (``commands``, ``node``, ``get_keys(*args)``) is the same from redis-py 5.0
to 8.1; pyproject.toml caps redis-py below the first release not tested, and
``tests/integration/test_cluster_routing.py`` (no ``COMMAND GETKEYS`` per script call) is
the test to run before raising the cap.
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
