"""``server.json`` is validated, never blindly trusted: a corrupt file is reported once and
replaced, a server is used only when it answers with the recorded run_id, and
``fairq server stop`` never signals a process that is not the shared server."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from fairq import server as fq_server
from fairq.cli import main
from fairq.errors import EmbeddedServerError, FairqError
from fairq.server import EmbeddedServer

FAKE_RUN_ID = "0123456789abcdef0123456789abcdef01234567"


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
    monkeypatch.setattr(fq_server, "_warned", set())
    yield directory
    for pid in _our_server_pids(directory / "valkey.sock"):
        os.kill(pid, signal.SIGCONT)
    with contextlib.suppress(FairqError):
        fq_server.stop_shared_server()
    for pid in _our_server_pids(directory / "valkey.sock"):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(base, ignore_errors=True)


def _freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped (until then the SIGSTOP itself shows
    as pending, and a loaded machine can take a while to deliver it)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while "T (stopped)" not in Path(f"/proc/{pid}/status").read_text():
        assert time.monotonic() < deadline, f"pid {pid} did not stop"
        time.sleep(0.01)


def _stopped_decoy() -> subprocess.Popen[bytes]:
    """A ``sleep 60`` frozen with SIGSTOP: a signal sent to it stays pending (visible in
    /proc), so "it was never signalled" is checked exactly, without waiting."""
    decoy = subprocess.Popen(["sleep", "60"])
    _freeze(decoy.pid)
    return decoy


def _pending_signals(pid: int) -> int:
    """Signals sent to ``pid`` and not yet delivered (thread and process pending sets)."""
    pending = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            pending |= int(line.split()[1], 16)
    return pending


def _bit(sig: signal.Signals) -> int:
    return 1 << (sig - 1)


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(10)


def _state_naming(directory: Path, pid: int, binary: str | None = None) -> dict[str, object]:
    sock = directory / "valkey.sock"
    return {
        "url": f"unix://{sock}",
        "socket": str(sock),
        "pid": pid,
        "run_id": FAKE_RUN_ID,
        "process_id": pid,
        "binary": binary or str(fq_server.valkey_binary()),
        "started_at": "2026-01-01T00:00:00+00:00",
        "fsync": "everysec",
    }


def _write(directory: Path, content: str | bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / "server.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def _valid(directory: Path) -> dict[str, object]:
    """The state file, checked: valid, 0600, and naming the server that answers."""
    path = directory / "server.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data: dict[str, object] = json.loads(path.read_text())
    parsed = fq_server._parse_state(path.read_text(), directory / "valkey.sock")
    client = redis.Redis(unix_socket_path=str(directory / "valkey.sock"))
    try:
        info = client.info("server")
    finally:
        client.close()
    assert (parsed.run_id, parsed.process_id) == (info["run_id"], info["process_id"])
    return data


def test_the_state_file_records_what_was_started(state: Path) -> None:
    url = fq_server.shared_server_url()
    data = _valid(state)
    assert set(data) == {
        "url", "socket", "pid", "run_id", "process_id", "binary", "started_at", "fsync",
    }  # fmt: skip
    assert data["url"] == url == f"unix://{state / 'valkey.sock'}"
    assert data["socket"] == str(state / "valkey.sock")
    assert data["pid"] == data["process_id"]
    assert data["binary"] == str(fq_server.valkey_binary())
    assert data["fsync"] == "everysec"
    assert [p.name for p in state.iterdir() if p.name.startswith(".server.")] == []


#: state files that are not usable as they are
RAW = {
    "garbage": "{not json at all",
    "binary": b"\xff\xfe\x00garbage",
    "array": "[1, 2, 3]",
    "other-shape": '{"url": "redis://127.0.0.1:abc/0", "pid": 1, "port": "abc"}',
}
#: a well-formed state file naming pid 1, with one field made wrong
CHANGES: dict[str, dict[str, object]] = {
    "pid-string": {"pid": "12"},
    "pid-negative": {"pid": -5},
    "pid-bool": {"pid": True},
    "pid-missing": {"pid": None},
    "socket-elsewhere": {"socket": "/etc/elsewhere.sock", "url": "unix:///etc/elsewhere.sock"},
    "run-id-bad": {"run_id": "not-a-run-id"},
    "fsync-bad": {"fsync": "sometimes"},
}


def _corrupt_content(kind: str, directory: Path) -> str | bytes:
    if kind in RAW:
        return RAW[kind]
    data = {**_state_naming(directory, 1), **CHANGES[kind]}
    return json.dumps({k: v for k, v in data.items() if v is not None})


@pytest.mark.parametrize("kind", sorted([*RAW, *CHANGES]))
def test_a_corrupt_state_file_is_reported_once_and_replaced_on_the_next_start(
    state: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Given a server.json that is garbage, of the wrong shape or naming pid 1, then
    status, stop and the CLI report it clearly (no traceback, one log warning, nothing
    signalled), and the next start replaces it with a valid file."""
    _write(state, _corrupt_content(kind, state))
    caplog.set_level(logging.WARNING, logger="fairq.server")
    assert fq_server.shared_server_status() is None
    assert fq_server.shared_server_status() is None
    outcome = fq_server.stop_shared()
    assert outcome.stopped is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert str(state / "server.json") in warnings[0].getMessage()
    assert "replaced" in warnings[0].getMessage()

    shown = CliRunner().invoke(main, ["server", "status"])
    assert shown.exit_code == 1 and isinstance(shown.exception, SystemExit), shown.output
    assert "not running" in shown.output and "corrupt" in shown.output

    url = fq_server.shared_server_url()
    assert url == f"unix://{state / 'valkey.sock'}"
    _valid(state)
    assert fq_server.shared_server_status() is not None


def test_a_state_dir_that_does_not_exist_is_simply_not_running(state: Path) -> None:
    assert fq_server.shared_server_status() is None
    assert fq_server.stop_shared() == fq_server.StopOutcome(False, "not running")
    assert not state.exists()
    with pytest.raises(EmbeddedServerError, match="not running"):
        fq_server.shared_server_url(start=False)


def test_a_stale_state_file_naming_an_unrelated_process_never_gets_it_signalled(
    state: Path,
) -> None:
    """Given server.json naming a live `sleep` (even claiming the valkey binary), when the
    shared server is stopped, then nothing is signalled and the stale file is dropped."""
    decoy = _stopped_decoy()
    try:
        _write(state, json.dumps(_state_naming(state, decoy.pid)))
        assert fq_server.shared_server_status() is None
        outcome = fq_server.stop_shared()
        assert outcome.stopped is False
        assert f"pid {decoy.pid}" in outcome.message and "nothing was signalled" in outcome.message
        assert _pending_signals(decoy.pid) == 0
        assert decoy.poll() is None
        assert not (state / "server.json").exists()
        # and the CLI says the same, still signalling nothing
        _write(state, json.dumps(_state_naming(state, decoy.pid)))
        shown = CliRunner().invoke(main, ["server", "stop"])
        assert shown.exit_code == 0, shown.output
        assert "not running" in shown.output and "nothing was signalled" in shown.output
        assert _pending_signals(decoy.pid) == 0
    finally:
        _end(decoy)


def test_a_valkey_server_on_another_socket_is_never_signalled(state: Path) -> None:
    """The recorded pid runs the right binary but was not started on our socket."""
    with EmbeddedServer(unix_socket=state.parent / "other.sock") as other:
        assert other.process is not None
        pid = other.process.pid
        _freeze(pid)
        try:
            _write(state, json.dumps(_state_naming(state, pid)))
            assert fq_server.stop_shared().stopped is False
            assert _pending_signals(pid) == 0
        finally:
            os.kill(pid, signal.SIGCONT)
        client = redis.Redis(unix_socket_path=str(state.parent / "other.sock"))
        try:
            assert client.ping()
        finally:
            client.close()


def test_a_server_with_another_run_id_is_not_trusted_but_recorded_after_a_check(
    state: Path,
) -> None:
    """Given the shared server running while server.json names a `sleep` and a made-up
    run_id, then the server is not trusted as recorded; starting checks /proc and records
    the server that really answers; the `sleep` is never signalled."""
    fq_server.shared_server_url()
    real = fq_server.shared_server_status()
    assert real is not None
    decoy = _stopped_decoy()
    try:
        _write(state, json.dumps(_state_naming(state, decoy.pid)))
        assert fq_server.shared_server_status() is None
        assert fq_server.shared_server_report().unrecorded_pid == real["pid"]
        fq_server.shared_server_url()
        again = fq_server.shared_server_status()
        assert again is not None
        assert (again["pid"], again["run_id"]) == (real["pid"], real["run_id"])
        assert _pending_signals(decoy.pid) == 0
        # the same while stopping: the answering server is shut down, the decoy untouched
        _write(state, json.dumps(_state_naming(state, decoy.pid)))
        assert fq_server.stop_shared().stopped is True
        assert _our_server_pids(state / "valkey.sock") == []
        assert _pending_signals(decoy.pid) == 0
    finally:
        _end(decoy)


def test_something_unidentified_on_the_socket_is_neither_used_nor_stopped(state: Path) -> None:
    """A server on our socket whose command line does not show it was started there by
    fairq (here: one that rewrote its process title) is refused, and keeps running."""
    state.mkdir(mode=0o700)
    with EmbeddedServer(
        unix_socket=state / "valkey.sock", extra_args=["--set-proc-title", "yes"]
    ) as stranger:
        assert stranger.process is not None
        with pytest.raises(EmbeddedServerError, match="refusing to stop it"):
            fq_server.stop_shared()
        with pytest.raises(EmbeddedServerError, match="neither uses nor stops it"):
            fq_server.shared_server_url()
        shown = CliRunner().invoke(main, ["server", "stop"])
        assert shown.exit_code == 1 and "refusing" in shown.output
        client = redis.Redis(unix_socket_path=str(state / "valkey.sock"))
        try:
            assert client.ping()
        finally:
            client.close()
        assert stranger.process.poll() is None


def test_stop_shuts_the_server_down_and_keeps_its_data(state: Path) -> None:
    url = fq_server.shared_server_url()
    status = fq_server.shared_server_status()
    assert status is not None
    client = redis.Redis.from_url(url)
    try:
        client.set("kept", "yes")
    finally:
        client.close()
    outcome = fq_server.stop_shared()
    assert outcome == fq_server.StopOutcome(True, f"stopped (pid {status['pid']})")
    assert _our_server_pids(state / "valkey.sock") == []
    assert not (state / "server.json").exists()
    assert "shutdown" in (state / "data" / "valkey.log").read_text().lower()
    url = fq_server.shared_server_url()
    client = redis.Redis.from_url(url)
    try:
        assert client.get("kept") == b"yes"
    finally:
        client.close()


def test_a_server_that_no_longer_answers_gets_sigterm_only_after_the_proc_check(
    state: Path,
) -> None:
    """Given the shared server frozen (it accepts no command), when it is stopped, then
    the recorded pid — verified by /proc as valkey-server on our socket — gets SIGTERM,
    and the server exits once it runs again."""
    fq_server.shared_server_url()
    status = fq_server.shared_server_status()
    assert status is not None
    pid = int(status["pid"])
    _freeze(pid)
    try:
        with pytest.raises(EmbeddedServerError, match="did not exit"):
            fq_server.stop_shared(timeout=0.2)
        assert _pending_signals(pid) & _bit(signal.SIGTERM)
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while _our_server_pids(state / "valkey.sock"):
        fq_server._reap(pid)
        assert time.monotonic() < deadline, "the server did not exit after SIGTERM"
        time.sleep(0.02)


def test_the_cli_shows_the_validated_state(state: Path) -> None:
    runner = CliRunner()
    shown = runner.invoke(main, ["server", "status"])
    assert shown.exit_code == 1 and shown.output.startswith("not running")
    started = runner.invoke(main, ["server", "start"])
    assert started.exit_code == 0, started.output
    assert started.output.strip() == f"unix://{state / 'valkey.sock'}"
    status = fq_server.shared_server_status()
    assert status is not None
    shown = runner.invoke(main, ["server", "status"])
    assert shown.exit_code == 0, shown.output
    for text in (
        "running",
        str(state / "valkey.sock"),
        f"pid:      {status['pid']}",
        f"run_id:   {status['run_id']}",
        "fsync:    everysec",
        f"data dir: {state / 'data'}",
    ):
        assert text in shown.output
    as_json = json.loads(runner.invoke(main, ["server", "status", "--json"]).output)
    assert as_json["running"] is True
    assert (as_json["pid"], as_json["run_id"]) == (status["pid"], status["run_id"])
    assert as_json["state_file_problem"] is None
    stopped = runner.invoke(main, ["server", "stop"])
    assert stopped.exit_code == 0 and stopped.output.startswith("stopped")
    again = runner.invoke(main, ["server", "stop"])
    assert again.exit_code == 0 and again.output.strip() == "not running"
    as_json = json.loads(runner.invoke(main, ["server", "status", "--json"]).output)
    assert as_json["running"] is False


def _returns_within(call: Callable[[], object], seconds: float) -> bool:
    """Whether ``call`` returns (or raises) within ``seconds``, run in a daemon thread."""
    done = threading.Event()

    def run() -> None:
        with contextlib.suppress(Exception):
            call()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(seconds)


def _release_readers(fifo: Path) -> None:
    """Open the FIFO for writing and close it: a reader blocked on it sees EOF."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_fifo_as_the_state_file_hangs_nothing_and_is_replaced(state: Path) -> None:
    """server.json is a FIFO nobody writes: status, report, stop and the URL each
    return at once (the file is not a regular file: reported, not read), and the next
    start replaces it with a valid record."""
    state.mkdir(mode=0o700)
    fifo = state / "server.json"
    os.mkfifo(fifo, 0o600)
    try:
        for call in (fq_server.shared_server_status, fq_server.shared_server_report,
                     fq_server.stop_shared):  # fmt: skip
            assert _returns_within(call, 5), call.__name__
        assert "not a regular file" in (fq_server.shared_server_report().problem or "")
        assert _returns_within(fq_server.shared_server_url, 30)
    finally:
        _release_readers(fifo)
    assert stat.S_ISREG(os.lstat(fifo).st_mode)
    _valid(state)


def test_a_symlinked_or_huge_state_file_is_not_read(state: Path, tmp_path: Path) -> None:
    """A server.json that is a symlink (to a record naming a live server, even) is not
    followed, and one over 64 KiB is not read: both are reported and replaced."""
    url = fq_server.shared_server_url()
    record = tmp_path / "elsewhere.json"
    record.write_text((state / "server.json").read_text())
    (state / "server.json").unlink()
    (state / "server.json").symlink_to(record)
    report = fq_server.shared_server_report()
    assert not report.running and "symlink" in (report.problem or "")
    assert fq_server.shared_server_url() == url  # recorded again, as a regular file
    assert stat.S_ISREG(os.lstat(state / "server.json").st_mode)
    (state / "server.json").write_text(" " * (64 * 1024 + 1))
    assert "larger than" in (fq_server.shared_server_report().problem or "")


def test_a_lock_file_that_is_not_a_regular_file_is_a_clear_error(state: Path) -> None:
    """server.lock is a FIFO (or a symlink): starting refuses it with an error naming
    it, at once, instead of blocking on it or locking something else."""
    state.mkdir(mode=0o700)
    os.mkfifo(state / "server.lock", 0o600)
    try:
        with pytest.raises(EmbeddedServerError, match=r"server\.lock.*not a regular file"):
            fq_server.shared_server_url()
    finally:
        _release_readers(state / "server.lock")
    (state / "server.lock").unlink()
    (state / "server.lock").symlink_to(state / "elsewhere")
    with pytest.raises(EmbeddedServerError, match=r"server\.lock"):
        fq_server.shared_server_url()
    assert not (state / "elsewhere").exists()
