"""``fairq partitions``: show or change how many partitions an environment is spread over."""

from __future__ import annotations

import click

from fairq.commands._common import open_queue, parse_env, print_json, run_async, url_option


@click.command(name="partitions")
@click.argument("env_name", metavar="ENV")
@click.argument("count", type=int, required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@url_option
@run_async
async def command(env_name: str, count: int | None, as_json: bool, url: str | None) -> None:
    """Show the partitions of ENV (`fairq partitions ENV`: each one's shard and the runs it
    holds), or spread ENV over COUNT partitions (`fairq partitions ENV COUNT`).

    Growing copies the environment's settings to the new partitions, then new runs go to
    their tenant's partition. Shrinking keeps serving the old partitions until they are
    empty: run the same command again then to stop serving them (see docs/cluster.md).
    """
    env = parse_env(env_name)
    rq = await open_queue(url)
    try:
        if count is not None:
            await rq.set_partitions(env, count)
        placement, _ = await rq.stored_placement(env)
        shards = rq.keys.partition_shards(env, placement.served)
        held = await rq.partition_counts(env, range(placement.served))
    finally:
        await rq.close()
    rows = [
        {"partition": p, "shard": shards[p], "runs": held[p], "draining": p >= placement.partitions}
        for p in range(placement.served)
    ]
    if as_json:
        print_json({"env": str(env), "partitions": placement.partitions, "rows": rows})
        return
    click.echo(f"{env}: {placement.partitions} partition(s)")
    for row in rows:
        note = "  (draining)" if row["draining"] else ""
        click.echo(
            f"  partition {row['partition']}: shard {row['shard']}, {row['runs']} runs{note}"
        )
