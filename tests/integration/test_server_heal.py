"""A shared server that dies comes back at the same address with its data: running
processes heal it (:func:`fairq.server.heal_shared_server`), exactly one server results
however many heal at once, and their existing clients reconnect. ``FAIRQ_FSYNC`` sets its
fsync policy."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from click.testing import CliRunner

from fairq import server as fq_server
from fairq.cli import main
from fairq.errors import ConfigurationError, FairqError
from fairq.server import heal_shared_server, heal_shared_server_async

HEALER = textwrap.dedent(
    """
    import sys
    from fairq.server import heal_shared_server
    print("ready", flush=True)
    sys.stdin.readline()
    print(heal_shared_server(sys.argv[1]), flush=True)
    """
)


def _our_server_pids(sock: Path) -> list[int]:
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and fq_server._is_our_server(int(entry.name), sock)
    ]


@pytest.fixture
def state(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short ``FAIRQ_STATE_DIR`` for one test; any shared server left there is stopped."""
    base = Path(tempfile.mkdtemp(prefix="fq", dir="/tmp"))
    directory = base / "s"
    monkeypatch.setenv("FAIRQ_STATE_DIR", str(directory))
    monkeypatch.delenv("FAIRQ_FSYNC", raising=False)
    yield directory
    with contextlib.suppress(FairqError):
        fq_server.stop_shared_server()
    for pid in _our_server_pids(directory / "valkey.sock"):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(base, ignore_errors=True)


def _kill_hard(state: Path) -> int:
    """SIGKILL the shared server and wait (bounded) until it is gone; its pid."""
    status = fq_server.shared_server_status()
    assert status is not None
    pid = int(status["pid"])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _our_server_pids(state / "valkey.sock"):
        fq_server._reap(pid)
        assert time.monotonic() < deadline, "the killed server did not go away"
        time.sleep(0.01)
    assert fq_server.shared_server_status() is None
    return pid


def _fsync_of(url: str) -> str:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return str(client.config_get("appendfsync")["appendfsync"])
    finally:
        client.close()


def _heal_from_processes(url: str, count: int) -> list[str]:
    """Start ``count`` processes that each heal ``url``, release them together once all
    are ready, and return what each printed."""
    healers = [
        subprocess.Popen(
            [sys.executable, "-c", HEALER, url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    try:
        for healer in healers:
            assert healer.stdout is not None and healer.stdout.readline() == "ready\n"
        for healer in healers:  # release all, then collect all
            assert healer.stdin is not None
            healer.stdin.write("go\n")
            healer.stdin.flush()
        outputs = [healer.communicate(timeout=60)[0] for healer in healers]
    finally:
        for healer in healers:
            if healer.poll() is None:
                healer.kill()
                healer.wait(10)
    assert [h.returncode for h in healers] == [0] * count
    return outputs


async def test_heal_after_kill_9_from_two_processes_gives_one_server_with_the_data(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given the shared server (fsync always) holding data and clients connected to it,
    when it is killed with SIGKILL and two processes heal it at the same moment, then one
    server answers at the same URL with the data, and the old clients work again: a
    client idle during the outage on its next command, one that saw the outage (as a
    worker does before it heals) on its next command after the heal."""
    monkeypatch.setenv("FAIRQ_FSYNC", "always")
    url = fq_server.shared_server_url()
    sync_client = redis.Redis.from_url(url)
    idle_client = redis.Redis.from_url(url)
    async_client = aioredis.from_url(url)
    try:
        sync_client.hset("run:1", mapping={"payload": "hello", "attempt": "1"})
        sync_client.zadd("queue", {"run:1": 1.5})
        assert idle_client.ping()
        await async_client.set("async-key", "before")
        old_pid = _kill_hard(state)
        with pytest.raises(redis.ConnectionError):
            sync_client.ping()
        with pytest.raises(redis.ConnectionError):
            await async_client.ping()
        monkeypatch.delenv("FAIRQ_FSYNC")  # the healers keep the recorded policy

        outputs = _heal_from_processes(url, 2)
        assert outputs == [url + "\n", url + "\n"]

        pids = _our_server_pids(state / "valkey.sock")
        assert len(pids) == 1 and pids[0] != old_pid
        status = fq_server.shared_server_status()
        assert status is not None and status["pid"] == pids[0] and status["url"] == url
        assert sync_client.hgetall("run:1") == {b"payload": b"hello", b"attempt": b"1"}
        assert sync_client.zscore("queue", "run:1") == 1.5
        assert idle_client.get("async-key") == b"before"
        assert await async_client.get("async-key") == b"before"
        assert _fsync_of(url) == "always"
    finally:
        sync_client.close()
        idle_client.close()
        await async_client.aclose()


def test_heal_from_many_threads_at_once_starts_one_server(state: Path) -> None:
    url = fq_server.shared_server_url()
    fq_server.stop_shared()
    barrier = threading.Barrier(4)
    results: list[str] = []
    errors: list[BaseException] = []

    def heal() -> None:
        barrier.wait(timeout=10)
        try:
            results.append(heal_shared_server(url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=heal) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == [] and results == [url] * 4
    assert len(_our_server_pids(state / "valkey.sock")) == 1


async def test_heal_of_an_answering_server_changes_nothing(state: Path) -> None:
    url = fq_server.shared_server_url()
    before = fq_server.shared_server_status()
    assert await heal_shared_server_async(url) == url
    assert heal_shared_server(url) == url
    assert fq_server.shared_server_status() == before


@pytest.mark.parametrize(
    "other",
    [
        "redis://127.0.0.1:1/0",
        "rediss://user:pw@example.invalid:6380/0",
        "redis+cluster://127.0.0.1:7000",
        "unix:///tmp/fq-elsewhere.sock",
        "not a url",
    ],
)
def test_heal_returns_any_other_url_unchanged_and_starts_nothing(state: Path, other: str) -> None:
    assert heal_shared_server(other) == other
    assert not state.exists()


def test_heal_of_the_url_of_another_state_dir_starts_nothing(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = fq_server.shared_server_url()
    fq_server.stop_shared()
    monkeypatch.setenv("FAIRQ_STATE_DIR", str(state.parent / "t"))
    assert heal_shared_server(url) == url
    assert not (state.parent / "t").exists()
    assert _our_server_pids(state / "valkey.sock") == []


def test_the_shared_url_is_a_unix_url_redis_py_accepts(state: Path) -> None:
    url = fq_server.shared_server_url()
    assert url == f"unix://{state}/valkey.sock"
    assert fq_server.is_shared_server_url(url)
    assert not fq_server.is_shared_server_url(url + ".other")
    client = redis.Redis.from_url(url)
    try:
        assert client.ping()
    finally:
        client.close()


def test_a_state_dir_with_odd_characters_gives_a_working_quoted_url(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    odd = state.parent / "a b#c%d"
    monkeypatch.setenv("FAIRQ_STATE_DIR", str(odd))
    try:
        url = fq_server.shared_server_url()
        assert url == "unix://" + str(state.parent) + "/a%20b%23c%25d/valkey.sock"
        assert fq_server.is_shared_server_url(url)
        client = redis.Redis.from_url(url)
        try:
            assert client.ping()
        finally:
            client.close()
    finally:
        fq_server.stop_shared()


@pytest.mark.parametrize(("value", "policy"), [("always", "always"), (" No ", "no"), ("", None)])
def test_fairq_fsync_sets_the_policy(
    state: Path, monkeypatch: pytest.MonkeyPatch, value: str, policy: str | None
) -> None:
    monkeypatch.setenv("FAIRQ_FSYNC", value)
    url = fq_server.shared_server_url()
    expected = policy or "everysec"
    assert _fsync_of(url) == expected
    status = fq_server.shared_server_status()
    assert status is not None and status["fsync"] == expected


@pytest.mark.parametrize("value", ["sometimes", "1", "every sec"])
def test_a_bad_fairq_fsync_is_a_configuration_error_that_changes_nothing(
    state: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("FAIRQ_FSYNC", value)
    with pytest.raises(ConfigurationError, match="FAIRQ_FSYNC") as info:
        fq_server.shared_server_url()
    assert "always, everysec, no" in str(info.value)
    assert not state.exists()
    with pytest.raises(ConfigurationError, match="FAIRQ_FSYNC"):
        heal_shared_server(f"unix://{state}/valkey.sock")
    assert not state.exists()


def test_a_stronger_fairq_fsync_raises_the_running_servers_policy(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared server runs with everysec; a process asking FAIRQ_FSYNC=always gets
    the running server raised to always (so every write it acknowledges is durable),
    recorded for the server's restarts and shown by `fairq server status`; a process
    asking for less leaves it at always."""
    monkeypatch.delenv("FAIRQ_FSYNC", raising=False)
    url = fq_server.shared_server_url()
    assert _fsync_of(url) == "everysec"
    monkeypatch.setenv("FAIRQ_FSYNC", "always")
    assert fq_server.shared_server_url() == url
    assert _fsync_of(url) == "always"
    status = fq_server.shared_server_status()
    assert status is not None and status["fsync"] == "always"
    shown = CliRunner().invoke(main, ["server", "status"])
    assert shown.exit_code == 0 and "always (appendfsync in force)" in shown.output, shown.output
    monkeypatch.setenv("FAIRQ_FSYNC", "no")
    fq_server.shared_server_url()
    assert _fsync_of(url) == "always"
    # the record keeps it: killed, then healed without FAIRQ_FSYNC, it comes back always
    monkeypatch.delenv("FAIRQ_FSYNC")
    _kill_hard(state)
    assert heal_shared_server(url) == url
    assert _fsync_of(url) == "always"


def test_status_shows_the_policy_in_force_even_when_set_behind_fairqs_back(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FAIRQ_FSYNC", raising=False)
    url = fq_server.shared_server_url()
    client = redis.Redis.from_url(url)
    try:
        client.config_set("appendfsync", "no")
    finally:
        client.close()
    report = fq_server.shared_server_report()
    assert report.state is not None and report.state.fsync == "everysec"
    assert report.fsync == "no"
    monkeypatch.setenv("FAIRQ_FSYNC", "everysec")
    fq_server.shared_server_url()
    assert _fsync_of(url) == "everysec"
