"""Another user's shared server, set up in a state directory the way that user's fairq
would leave it: for the tests that show fairq refuses such a directory."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fairq.server import EmbeddedServer, valkey_binary

#: The uid (and gid) the directory is given to.
NOBODY = 65534


def hand_to_nobody(state: Path, server: EmbeddedServer, client: Any) -> None:
    """Write a ``server.json`` in ``state`` that matches ``server`` (running on
    ``state/valkey.sock``, answering ``client``), then give the directory, the socket
    and the record to uid nobody (needs root)."""
    assert server.process is not None and server.unix_socket is not None
    sock = server.unix_socket
    info = client.info("server")
    (state / "server.json").write_text(json.dumps({
        "url": f"unix://{sock}", "socket": str(sock), "pid": server.process.pid,
        "run_id": info["run_id"], "process_id": info["process_id"],
        "binary": str(valkey_binary()), "started_at": "2026-01-01T00:00:00+00:00",
        "fsync": "everysec",
    }))  # fmt: skip
    for path in (state, sock, state / "server.json"):
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
