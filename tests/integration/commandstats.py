"""Commands the server ran, from INFO commandstats (script-internal commands included).

On a Redis Cluster the counts of every node are summed: a script runs on the node of its
slot, which is not the node a plain INFO would ask."""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import RedisCluster

#: Commands of the measurement itself and of the cluster client's own upkeep.
_NOT_COUNTED = ("cmdstat_info", "cmdstat_config", "cmdstat_cluster", "cmdstat_command")


async def reset_stats(client: Any) -> None:
    """CONFIG RESETSTAT on every node."""
    if isinstance(client, RedisCluster):
        await client.config_resetstat(target_nodes=RedisCluster.ALL_NODES)
    else:
        await client.config_resetstat()


async def command_counts(client: Any) -> dict[str, int]:
    """Per-command call counts since the last CONFIG RESETSTAT, summed over the nodes."""
    if isinstance(client, RedisCluster):
        per_node = await client.info("commandstats", target_nodes=RedisCluster.ALL_NODES)
        sections = list(per_node.values())
    else:
        sections = [await client.info("commandstats")]
    counts: dict[str, int] = {}
    for stats in sections:
        for k, v in stats.items():
            if not k.startswith(_NOT_COUNTED):
                name = k.removeprefix("cmdstat_")
                counts[name] = counts.get(name, 0) + int(v["calls"])
    return counts


async def script_calls(client: Any) -> int:
    """Script calls (FCALL and EVALSHA) since the last CONFIG RESETSTAT."""
    counts = await command_counts(client)
    return counts.get("fcall", 0) + counts.get("evalsha", 0)


async def total_calls(client: Any) -> int:
    """Commands run since the last CONFIG RESETSTAT, summed over the nodes."""
    return sum((await command_counts(client)).values())
