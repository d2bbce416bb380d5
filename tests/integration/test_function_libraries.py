"""Old fairq function libraries are deleted at load, except the current and the previous
build's: across upgrades (builds that change some scripts) the libraries on a
long-lived server stay bounded, and two versions running side by side both keep working.

Each test has a server of its own (the libraries are server-wide)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from fairq.server import EmbeddedServer, connect
from fairq.store.scripts import ScriptRegistry, _package_reader

#: The name prefix of a build's manifest library.
MANIFEST_PREFIX = "fairq_build_"

#: Topology-independent, and each test starts a server of its own.
pytestmark = pytest.mark.single_server


def build(changed: dict[str, str]) -> ScriptRegistry:
    """The scripts as shipped, with a comment line added to each of ``changed``
    (script name -> marker): a later fairq build that changed those scripts."""

    def read(relative: str) -> str | None:
        text = _package_reader(relative)
        name = relative.removesuffix(".lua")
        if text is not None and name in changed:
            return text + f"\n-- build {changed[name]}\n"
        return text

    return ScriptRegistry(read)


@pytest.fixture
async def client() -> AsyncIterator[Any]:
    with EmbeddedServer() as server:
        c = await connect(server.url)
        yield c
        await c.aclose()


async def on_server(client: Any) -> set[str]:
    return {
        (e[b"library_name"] if isinstance(e, dict) else e[1]).decode()
        for e in await client.execute_command("FUNCTION", "LIST")
    }


async def load_all(client: Any, registry: ScriptRegistry) -> None:
    """What a process of that build does as it first calls each script."""
    for script in registry.all():
        await script._load(client)


def libraries_of(registry: ScriptRegistry) -> set[str]:
    return {script.function for script in registry.all()}


def only(registry: ScriptRegistry, *others: ScriptRegistry) -> set[str]:
    return libraries_of(registry) - set().union(*map(libraries_of, others))


async def test_three_builds_keep_the_two_newest_and_delete_the_oldest(client: Any) -> None:
    v1 = build({"ack": "1"})
    v2 = build({"ack": "2", "nack": "2"})
    v3 = build({"cancel": "3", "nack": "2"})
    foreign = "#!lua name=myapp_tools\nredis.register_function('myapp_tool', function() end)"
    await client.execute_command("FUNCTION", "LOAD", foreign)

    await load_all(client, v1)
    await load_all(client, v2)  # a rolling upgrade: v1 and v2 both run
    names = await on_server(client)
    assert libraries_of(v1) | libraries_of(v2) <= names
    assert {v1.build.manifest, v2.build.manifest} <= names

    await load_all(client, v3)
    names = await on_server(client)
    assert libraries_of(v2) | libraries_of(v3) <= names
    gone = only(v1, v2, v3)
    assert gone and not gone & names  # v1's own libraries (its ack) are deleted
    assert v1.build.manifest not in names
    assert "myapp_tools" in names  # not fairq's: never touched
    fairq = {n for n in names if n.startswith("fairq_")}
    assert fairq == libraries_of(v2) | libraries_of(v3) | {v2.build.manifest, v3.build.manifest}


async def test_an_older_process_still_running_reloads_and_deletes_nothing_newer(
    client: Any,
) -> None:
    """A v1 process outlives two upgrades: its next call finds its library gone, loads
    it again (the call works), and keeps the newer builds' libraries."""
    v1, v2, v3 = build({"ack": "1"}), build({"ack": "2"}), build({"ack": "3"})
    for registry in (v1, v2, v3):
        await load_all(client, registry)
    ack_v1 = v1.get("ack", "age")
    assert ack_v1.function not in await on_server(client)
    v1.build.pruned.clear()  # (a fresh v1 process: it prunes when it loads)
    with pytest.raises(Exception) as caught:
        await ack_v1(client, ["{x.0}"], [])  # runs (and refuses the empty arguments)
    assert "function not found" not in str(caught.value).lower()
    names = await on_server(client)
    assert ack_v1.function in names
    assert libraries_of(v2) | libraries_of(v3) <= names


async def test_libraries_of_a_fairq_without_manifests_count_as_the_oldest_build(
    client: Any,
) -> None:
    """Libraries no manifest claims (an older fairq's) stay while they are the previous
    build, and go at the next upgrade."""
    old = "#!lua name=fairq_ack_age_0123456789abcdef\nredis.register_function('fairq_ack_age_0123456789abcdef', function() end)"  # noqa: E501
    await client.execute_command("FUNCTION", "LOAD", old)
    v1, v2 = build({"ack": "1"}), build({"ack": "2"})
    await load_all(client, v1)
    assert "fairq_ack_age_0123456789abcdef" in await on_server(client)
    await load_all(client, v2)
    assert "fairq_ack_age_0123456789abcdef" not in await on_server(client)


async def test_the_shipped_build_prunes_once_and_keeps_working(client: Any) -> None:
    """Five upgrades' worth of builds, then the shipped one: the fairq libraries on the
    server stop growing after the second build (two builds' worth), and the shipped
    build's are all there."""
    counts = []
    for n in range(5):
        await load_all(client, build({"ack": str(n), "enqueue": str(n)}))
        counts.append(len({x for x in await on_server(client) if x.startswith("fairq_")}))
    shipped = ScriptRegistry()
    await load_all(client, shipped)
    names = await on_server(client)
    assert libraries_of(shipped) <= names
    manifests = {x for x in names if x.startswith(MANIFEST_PREFIX)}
    assert len(manifests) == 2  # the shipped build and the one before it
    assert counts[1:] == [counts[1]] * 4  # bounded: no growth after the second build
