"""The shared server is private: it listens on a unix socket (no TCP port) in a 0700
state directory, its files are 0600, and another local user can neither connect to it
nor read what it stores."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from tests.foreign import hand_to_nobody

from fairq import server as fq_server
from fairq.errors import EmbeddedServerError, FairqError
from fairq.server import EmbeddedServer

NOBODY = 65534


def _our_server_pids(sock: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and fq_server._is_our_server(int(entry.name), sock):
            pids.append(int(entry.name))
    return pids


@pytest.fixture
def base() -> Iterator[Path]:
    """A short, world-traversable directory (0755), so only fairq's own modes protect
    what it creates inside."""
    path = Path(tempfile.mkdtemp(prefix="fq", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def state(base: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``FAIRQ_STATE_DIR`` for one test; any shared server left there is stopped after."""
    directory = base / "s"
    monkeypatch.setenv("FAIRQ_STATE_DIR", str(directory))
    monkeypatch.delenv("FAIRQ_FSYNC", raising=False)
    yield directory
    with contextlib.suppress(FairqError):
        fq_server.stop_shared_server()
    for pid in _our_server_pids(directory / "valkey.sock"):
        os.kill(pid, signal.SIGKILL)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_shared_server_listens_on_a_socket_in_the_state_dir_and_on_no_port(
    state: Path,
) -> None:
    url = fq_server.shared_server_url()
    sock = state / "valkey.sock"
    assert url == f"unix://{sock}"
    client = redis.Redis.from_url(url)
    try:
        assert client.ping()
        assert client.config_get("port") == {"port": "0"}
        assert client.config_get("appendonly") == {"appendonly": "yes"}
    finally:
        client.close()
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)


def test_every_file_of_the_shared_server_is_private(state: Path) -> None:
    url = fq_server.shared_server_url()
    client = redis.Redis.from_url(url)
    try:
        client.hset("payloads", "r1", "secret-payload")
    finally:
        client.close()
    assert _mode(state) == 0o700
    assert _mode(state / "data") == 0o700
    assert _mode(state / "server.json") == 0o600
    assert _mode(state / "valkey.sock") == 0o700
    files = [p for p in (state / "data").rglob("*") if p.is_file()]
    assert any(p.suffix == ".aof" for p in files), files
    assert any(p.name == "valkey.log" for p in files), files
    for path in files:
        assert _mode(path) == 0o600, path
    for path in (p for p in (state / "data").rglob("*") if p.is_dir()):
        assert _mode(path) == 0o700, path


def test_loose_files_in_the_data_directory_are_made_private(state: Path) -> None:
    """Inside a trusted state directory, group / other access to the data is taken away."""
    (state / "data").mkdir(parents=True)
    state.chmod(0o700)
    (state / "data").chmod(0o755)
    old = state / "data" / "old.aof"
    old.write_text("payloads")
    old.chmod(0o644)
    fq_server.shared_server_url()
    assert (_mode(state), _mode(state / "data"), _mode(old)) == (0o700, 0o700, 0o600)


def _untouched(directory: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``directory``: (mode, size), to show a refusal changed nothing."""
    return {
        str(p.relative_to(directory)): (os.lstat(p).st_mode, os.lstat(p).st_size)
        for p in [directory, *directory.rglob("*")]
    }


def test_a_state_dir_open_to_other_users_is_refused_and_left_alone(state: Path) -> None:
    """A directory of ours that group or others may enter or write is not trusted (they
    could have put a socket or a record there): a clear error names the fix, and
    nothing in it is read, started or changed."""
    state.mkdir()
    state.chmod(0o755)
    (state / "server.json").write_text("{}")
    before = _untouched(state)
    for call in (fq_server.shared_server_url, fq_server.shared_server_report,
                 fq_server.stop_shared):  # fmt: skip
        with pytest.raises(EmbeddedServerError, match=r"mode is 0755.*chmod 700"):
            call()
    assert fq_server.shared_server_status() is None
    assert _untouched(state) == before


def test_a_symlinked_state_dir_is_refused(base: Path, state: Path) -> None:
    """The state directory is a symlink (to a private directory of ours, even): refused."""
    real = base / "real"
    real.mkdir(mode=0o700)
    state.symlink_to(real)
    with pytest.raises(EmbeddedServerError, match=r"is a symlink.*FAIRQ_STATE_DIR"):
        fq_server.shared_server_url()
    assert list(real.iterdir()) == []


def test_a_state_dir_whose_parent_others_may_write_is_refused(base: Path, state: Path) -> None:
    """Others may write to the parent and it has no sticky bit: they could swap the
    directory, so it is refused; with the sticky bit (as /tmp has) it is used."""
    base.chmod(0o777)
    with pytest.raises(EmbeddedServerError, match=r"write to its parent.*sticky"):
        fq_server.shared_server_url()
    base.chmod(0o1777)
    assert fq_server.shared_server_url() == f"unix://{state / 'valkey.sock'}"


def test_the_suggested_fallback_is_per_uid_and_made_private(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error for a state directory too long for a socket suggests
    ``<temp>/fairq-<uid>``; set as FAIRQ_STATE_DIR, it is created 0700 in a sticky,
    world-writable temp directory and works."""
    base.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    fallback = fq_server.fallback_state_dir()
    assert fallback == base / f"fairq-{os.getuid()}"
    monkeypatch.setenv("FAIRQ_STATE_DIR", str(base / ("d" * 100)))
    with pytest.raises(EmbeddedServerError, match=f"e.g. {fallback}"):
        fq_server.shared_server_url()
    monkeypatch.setenv("FAIRQ_STATE_DIR", str(fallback))
    monkeypatch.delenv("FAIRQ_FSYNC", raising=False)
    try:
        assert fq_server.shared_server_url() == f"unix://{fallback / 'valkey.sock'}"
        assert _mode(fallback) == 0o700
    finally:
        fq_server.stop_shared_server()


AS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to make files of another uid (os.chown)"
)


@AS_ROOT
def test_a_state_dir_of_another_user_is_refused(state: Path) -> None:
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY, NOBODY)
    with pytest.raises(EmbeddedServerError, match=r"belongs to uid 65534.*FAIRQ_STATE_DIR"):
        fq_server.shared_server_url()
    assert list(state.iterdir()) == []


@AS_ROOT
def test_a_server_another_user_set_up_in_the_state_dir_is_never_used(state: Path) -> None:
    """Another uid made the state directory first (the per-user path under /tmp is
    predictable), runs its own valkey on the socket there and wrote a record that
    matches it. fairq refuses the directory before reading the record: neither the URL
    nor the status ever names that server, and nothing is sent to it."""
    state.mkdir(mode=0o700)
    sock = state / "valkey.sock"
    with EmbeddedServer(unix_socket=sock) as theirs:
        client = redis.Redis(unix_socket_path=str(sock))
        try:
            hand_to_nobody(state, theirs, client)
            calls_before = int(client.info("stats")["total_commands_processed"])
            with pytest.raises(EmbeddedServerError, match=r"belongs to uid 65534"):
                fq_server.shared_server_url()
            with pytest.raises(EmbeddedServerError, match=r"belongs to uid 65534"):
                fq_server.resolve_url()
            assert fq_server.shared_server_status() is None
            # nothing but this test's own INFO reached their server
            assert int(client.info("stats")["total_commands_processed"]) == calls_before + 1
        finally:
            client.close()


@AS_ROOT
def test_a_state_file_of_another_user_is_not_read(state: Path) -> None:
    """In a trusted directory, a server.json that is not ours is ignored (and replaced
    at the next start)."""
    state.mkdir(mode=0o700)
    (state / "server.json").write_text("{}")
    os.chown(state / "server.json", NOBODY, NOBODY)
    report = fq_server.shared_server_report()
    assert report.state is None and report.problem is not None
    assert "belongs to uid 65534" in report.problem
    fq_server.shared_server_url()
    assert os.lstat(state / "server.json").st_uid == os.getuid()


def test_a_state_dir_too_long_for_a_socket_is_a_clear_error_that_creates_nothing(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = base / ("d" * 100)
    monkeypatch.setenv("FAIRQ_STATE_DIR", str(directory))
    with pytest.raises(EmbeddedServerError) as info:
        fq_server.shared_server_url()
    message = str(info.value)
    assert "107" in message and "FAIRQ_STATE_DIR" in message and str(directory) in message
    assert not directory.exists()
    assert fq_server.shared_server_status() is None
    with pytest.raises(EmbeddedServerError, match="107"):
        EmbeddedServer(unix_socket=directory / "x.sock")


def test_a_socket_path_of_exactly_107_bytes_is_accepted(base: Path) -> None:
    name = "s" * (107 - len(str(base)) - 1)
    path = base / name
    assert len(str(path)) == 107
    with EmbeddedServer(unix_socket=path) as server:
        assert server.url == f"unix://{path}"
        client = redis.Redis(unix_socket_path=str(path))
        try:
            assert client.ping()
        finally:
            client.close()


def test_the_tcp_embedded_server_is_unchanged() -> None:
    with EmbeddedServer() as server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert server.port > 0
        client = redis.Redis(host="127.0.0.1", port=server.port)
        try:
            assert client.ping()
        finally:
            client.close()


# A child that drops to uid/gid nobody, then tries what an attacker would. It reports
# the errno name of each attempt ("ok" when it succeeded).
INTRUDER = textwrap.dedent(
    """
    import errno, json, os, socket, sys
    target, control, *files = sys.argv[1:]
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    assert os.getuid() == 65534 and os.geteuid() == 65534

    def attempt(fn):
        try:
            fn()
            return "ok"
        except OSError as exc:
            return errno.errorcode.get(exc.errno, str(exc.errno))

    def connect(path):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(path)

    def read(path):
        with open(path, "rb") as f:
            f.read(1)

    print(json.dumps({
        "uid": os.getuid(),
        "control": attempt(lambda: connect(control)),
        "socket": attempt(lambda: connect(target)),
        "listdir": attempt(lambda: os.listdir(os.path.dirname(target))),
        "files": {path: attempt(lambda: read(path)) for path in files},
    }))
    """
)


def _intrude(sock: Path, control: Path, files: list[Path]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", INTRUDER, str(sock), str(control), *map(str, files)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a probe as another uid (nobody)")
def test_another_user_can_neither_connect_nor_read_the_data(base: Path, state: Path) -> None:
    """Given the shared server holding a payload, when uid nobody tries to connect to its
    socket and to read its files, then every attempt is refused — first by the 0700 state
    directory, and still by the 0700 socket and 0600 files when the directories are made
    traversable. A control socket open to all proves the probe itself can connect."""
    url = fq_server.shared_server_url()
    sock = state / "valkey.sock"
    client = redis.Redis.from_url(url)
    try:
        client.hset("payloads", "r1", "secret-payload-1234")
    finally:
        client.close()
    files = sorted(p for p in state.rglob("*") if p.is_file())
    assert state / "server.json" in files
    # root itself reads the payload on disk: the files hold what the probe must not see
    assert any(b"secret-payload-1234" in p.read_bytes() for p in files if p.suffix == ".aof")

    control_sock = base / "open.sock"
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.bind(str(control_sock))
    control_sock.chmod(0o777)
    control.listen(4)
    try:
        first = _intrude(sock, control_sock, files)
        assert first["uid"] == NOBODY
        assert first["control"] == "ok"
        assert first["socket"] == "EACCES"
        assert first["listdir"] == "EACCES"
        assert first["files"] == {str(p): "EACCES" for p in files}

        # even with every directory traversable, the socket and files stay closed
        dirs = [state, *(p for p in state.rglob("*") if p.is_dir())]
        for d in dirs:
            d.chmod(0o711)
        try:
            second = _intrude(sock, control_sock, files)
        finally:
            for d in dirs:
                d.chmod(0o700)
        assert second["control"] == "ok"
        assert second["socket"] == "EACCES"
        assert second["files"] == {str(p): "EACCES" for p in files}
    finally:
        control.close()
