"""A local Redis/Valkey Cluster on loopback, from the same embedded binary.

:class:`EmbeddedCluster` starts ``masters`` Valkey processes with ``cluster-enabled yes``,
each on a free loopback port (and a free cluster-bus port) with its own data directory and
``appendonly yes``; it splits the 16384 hash slots into contiguous ranges
(``CLUSTER ADDSLOTSRANGE``), introduces the nodes to each other (``CLUSTER MEET``) and
waits until every node reports ``cluster_state:ok`` and knows every other node. It is
meant for tests, benchmarks and ``fairq server --cluster N``; production clusters are
managed by their operators (see ``docs/cluster.md``).

:meth:`EmbeddedCluster.restart_node` stops one master and starts it again on the same
port from its own directory, so it comes back with its ``nodes.conf`` (its identity and
slots) and its AOF (its data).
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Final

from redis.asyncio.cluster import RedisCluster

from fairq.errors import EmbeddedServerError
from fairq.keys import KeySchema
from fairq.server import EmbeddedServer, free_port

#: Number of hash slots in a Redis/Valkey Cluster.
CLUSTER_SLOTS: Final = 16384
#: How long (ms) a silent node may stay unreachable before the others mark it failed.
#: A master restart must be shorter than this for the cluster to stay ``ok`` meanwhile.
DEFAULT_NODE_TIMEOUT_MS: Final = 15_000


def _command(port: int, *args: str, timeout: float = 2.0) -> str:
    """Send one inline-free RESP command to 127.0.0.1:port and return the raw reply text."""
    parts = [a.encode() for a in args]
    payload = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if _complete(data):
                break
    text = data.decode("utf-8", errors="replace")
    if text.startswith("-"):
        raise EmbeddedServerError(f"{' '.join(args[:2])} on port {port}: {text[1:].strip()}")
    return text


def _complete(data: bytes) -> bool:
    """Whether ``data`` holds one whole simple, error, integer or bulk-string reply."""
    if not data.endswith(b"\r\n"):
        return False
    if data[:1] in (b"+", b"-", b":"):
        return True
    if data[:1] == b"$":
        header, _, rest = data.partition(b"\r\n")
        length = int(header[1:])
        return length < 0 or len(rest) >= length + 2
    return True


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """Split the 16384 slots into ``masters`` contiguous, near-equal inclusive ranges."""
    if masters < 1:
        raise ValueError("a cluster needs at least one master")
    bounds = [round(i * CLUSTER_SLOTS / masters) for i in range(masters + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(masters)]


def shard_nodes(client: RedisCluster, schema: KeySchema) -> dict[str, list[int]]:
    """Which master serves each master-queue shard: ``{"host:port": [shard, ...]}``.

    Every master appears, even with no shard (an empty list means that node gets no
    fairq work at all: raise ``shard_count``; see ``docs/cluster.md``). Uses the client's
    current slot map; call after the client has connected.
    """
    spread: dict[str, list[int]] = {
        node.name: [] for node in client.get_nodes() if node.server_type == "primary"
    }
    for shard in schema.shards():
        node = client.get_node_from_key(shard.heads)
        if node is None:
            raise EmbeddedServerError(f"no node serves the slot of {shard.heads}")
        spread.setdefault(node.name, []).append(shard.shard)
    return spread


class EmbeddedCluster:
    """``masters`` Valkey masters (no replicas) forming one cluster on 127.0.0.1.

    Use as a context manager, or call :meth:`start` / :meth:`stop`.

    Args:
        masters: number of master nodes (each owns a contiguous slot range).
        data_dir: parent of the nodes' directories (default: a temporary directory,
            removed by :meth:`stop`).
        node_timeout_ms: ``cluster-node-timeout``.
        appendfsync: ``everysec`` (default) or ``always`` (survives SIGKILL without loss).
        tied_to_parent: stop the nodes when this process dies (tests); ``False`` for a
            detached cluster.
    """

    def __init__(
        self,
        masters: int = 3,
        *,
        data_dir: Path | None = None,
        node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS,
        appendfsync: str = "everysec",
        tied_to_parent: bool = True,
    ) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        self.masters = masters
        self._own_dir = data_dir is None
        self.data_dir = (
            Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="fairq-cluster-"))
        )
        self.node_timeout_ms = node_timeout_ms
        self.appendfsync = appendfsync
        self.tied_to_parent = tied_to_parent
        self.nodes: list[EmbeddedServer] = []
        self._bus_ports: list[int] = []

    # ------------------------------------------------------------------ addresses

    @property
    def ports(self) -> list[int]:
        """The client port of every node, in slot-range order."""
        return [n.port for n in self.nodes]

    @property
    def url(self) -> str:
        """A ``redis+cluster://`` URL naming one node (the client discovers the rest)."""
        if not self.nodes:
            raise EmbeddedServerError("the cluster is not started")
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    # ------------------------------------------------------------------ lifecycle

    def _make_node(self, index: int) -> EmbeddedServer:
        port = free_port()
        bus_port = free_port()
        while bus_port == port:
            bus_port = free_port()
        self._bus_ports.append(bus_port)
        return EmbeddedServer(
            port=port,
            data_dir=self.data_dir / f"node{index}",
            appendonly=True,
            tied_to_parent=self.tied_to_parent,
            extra_args=[
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(bus_port),
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--appendfsync", self.appendfsync,
            ],
        )  # fmt: skip

    def start(self, timeout: float = 30.0) -> EmbeddedCluster:
        """Start every node, assign slots, join them, and wait for ``cluster_state:ok``.

        Raises:
            EmbeddedServerError: a node does not start, or the cluster is not ``ok`` in time.
        """
        if self.nodes:
            return self
        try:
            self.nodes = [self._make_node(i).start() for i in range(self.masters)]
            for node, (first, last) in zip(self.nodes, slot_ranges(self.masters), strict=True):
                _command(node.port, "CLUSTER", "ADDSLOTSRANGE", str(first), str(last))
            for node in self.nodes[1:]:
                # The bus port is not port + 10000 here, so MEET must name it.
                _command(
                    node.port, "CLUSTER", "MEET", "127.0.0.1",
                    str(self.nodes[0].port), str(self._bus_ports[0]),
                )  # fmt: skip
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def node_state(self, index: int) -> tuple[str, int]:
        """``(cluster_state, cluster_known_nodes)`` as node ``index`` sees it."""
        info = _command(self.nodes[index].port, "CLUSTER", "INFO")
        fields = dict(
            line.split(":", 1)
            for line in info.splitlines()
            if ":" in line and not line.startswith("$")
        )
        return fields.get("cluster_state", "?").strip(), int(fields.get("cluster_known_nodes", "0"))

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every node reports ``cluster_state:ok`` and knows every node.

        Raises:
            EmbeddedServerError: not reached within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        last: list[tuple[str, int]] = []
        while time.monotonic() < deadline:
            try:
                last = [self.node_state(i) for i in range(len(self.nodes))]
            except (OSError, EmbeddedServerError):
                last = []
            if last and all(st == "ok" and known == self.masters for st, known in last):
                return
            time.sleep(0.05)
        raise EmbeddedServerError(f"cluster not ok after {timeout}s: {last}")

    def stop_node(self, index: int, *, kill: bool = False) -> None:
        """Stop one node, keeping its directory for a restart.

        Args:
            kill: SIGKILL (a crash: only what the AOF already holds survives; with
                ``appendfsync="always"`` that is every acknowledged write) instead of
                SIGTERM (a clean shutdown that flushes the AOF).
        """
        node = self.nodes[index]
        node._own_dir = False  # keep its directory: it is restarted from it
        if kill and node.process is not None and node.process.poll() is None:
            node.process.kill()
            node.process.wait(10)
        node.stop()

    def start_node(self, index: int, timeout: float = 30.0) -> None:
        """Start a stopped node again on its port, from its directory (AOF + nodes.conf)."""
        self.nodes[index].start()
        self.wait_ok(timeout)

    def restart_node(
        self, index: int, *, down_s: float = 0.0, kill: bool = False, timeout: float = 30.0
    ) -> None:
        """Stop node ``index``, stay down ``down_s`` seconds, start it again on the same port.

        The node comes back with its identity and slots (``nodes.conf``) and its data (AOF);
        returns once every node reports ``cluster_state:ok`` again.
        """
        self.stop_node(index, kill=kill)
        if down_s > 0:
            time.sleep(down_s)
        self.start_node(index, timeout)

    def stop(self) -> None:
        """Stop every node and remove a temporary data directory."""
        for node in self.nodes:
            node._own_dir = False
            node.stop()
        self.nodes = []
        self._bus_ports = []
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
