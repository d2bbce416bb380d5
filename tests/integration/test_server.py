"""The embedded server's life cycle: it answers, it never outlives its owner, and the
shared per-user server is found by every command instead of started twice."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fairq import server as fq_server
from fairq.errors import FairqError, ServerUnavailableError
from fairq.server import EmbeddedServer, connect

#: The owner turns SIGINT back into KeyboardInterrupt: a process started as a background
#: job of a non-interactive shell (a CI step run with `&`) inherits SIGINT ignored.
OWNER = textwrap.dedent(
    """
    import signal, sys, time
    from fairq.server import EmbeddedServer
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with EmbeddedServer() as s:
        print(s.port, s.process.pid, flush=True)
        time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has exited; /proc says so
    try:
        return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0
    except OSError:
        return False


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _start_owner() -> tuple[subprocess.Popen[str], int, int]:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    port, pid = (int(x) for x in owner.stdout.readline().split())
    return owner, port, pid


async def test_embedded_server_answers_and_stops_cleanly() -> None:
    with EmbeddedServer() as server:
        assert server.process is not None
        pid = server.process.pid
        client = await connect(server.url)
        assert await client.ping()
        await client.aclose()
        data_dir = server.data_dir
    assert _wait_gone(pid)
    assert not data_dir.exists()


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_the_embedded_server_never_outlives_its_owner(how: signal.Signals) -> None:
    """Given a process that owns an embedded server, when it is killed (even with
    SIGKILL, which runs no cleanup) or interrupted, then the server process exits too."""
    owner, _port, pid = _start_owner()
    assert _alive(pid)
    owner.send_signal(how)
    owner.wait(timeout=10)
    assert owner.stdout is not None
    owner.stdout.close()
    assert _wait_gone(pid), f"valkey-server {pid} outlived its owner after {how.name}"


def test_the_shared_server_is_started_once_found_by_others_and_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIRQ_STATE_DIR", str(tmp_path))
    first = fq_server.shared_server_url(start=True)
    try:
        assert fq_server.shared_server_url(start=True) == first
        status = fq_server.shared_server_status()
        assert status is not None and status["url"] == first
        pid = int(status["pid"])
    finally:
        assert fq_server.stop_shared_server() is True
    assert _wait_gone(pid)
    assert fq_server.shared_server_status() is None
    assert fq_server.stop_shared_server() is False


async def test_a_server_that_is_not_redis_gives_one_clear_error() -> None:
    """A port that accepts connections but does not speak RESP is reported by URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    url = f"redis://127.0.0.1:{port}/0"
    try:
        import asyncio

        async def serve_garbage() -> None:
            loop = asyncio.get_running_loop()
            listener.setblocking(False)
            conn, _ = await loop.sock_accept(listener)
            await loop.sock_sendall(conn, b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

        task = asyncio.create_task(serve_garbage())
        with pytest.raises(ServerUnavailableError) as info:
            await connect(url)
        assert url in str(info.value)
        await task
    finally:
        listener.close()


@pytest.fixture
def short_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short ``FAIRQ_STATE_DIR`` (socket paths must stay under 108 bytes)."""
    base = Path(tempfile.mkdtemp(prefix="fq", dir="/tmp"))
    monkeypatch.setenv("FAIRQ_STATE_DIR", str(base / "s"))
    monkeypatch.delenv("FAIRQ_FSYNC", raising=False)
    yield base / "s"
    with contextlib.suppress(FairqError):
        fq_server.stop_shared_server()
    shutil.rmtree(base, ignore_errors=True)


def test_a_restarted_shared_server_comes_back_at_the_same_url(short_state: Path) -> None:
    """The address is the socket in the state directory, not a random port: a stopped
    (or killed) server starts again where running processes already look for it."""
    first = fq_server.shared_server_url()
    assert first == f"unix://{short_state / 'valkey.sock'}"
    before = fq_server.shared_server_status()
    assert fq_server.stop_shared_server() is True
    assert fq_server.shared_server_url() == first
    after = fq_server.shared_server_status()
    assert before is not None and after is not None
    assert after["run_id"] != before["run_id"] and after["url"] == first
