"""A worker whose state directory another user set up never talks to that user's server.

Another uid (``nobody``) made the state directory first, runs a valkey on the socket in
it and wrote a ``server.json`` that matches it: everything a fairq of that user would
leave. A real ``fairq worker`` (no ``FAIRQ_REDIS_URL``, so the shared server) and
``fairq server status`` refuse the directory with an error naming the fix, exit
non-zero, and send that server nothing: no key is written and no command but the
test's own reaches it. Needs root (to make files of another uid); skipped otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from tests.foreign import hand_to_nobody

from fairq.server import EmbeddedServer

APP = """
from fairq.app import Fairq

app = Fairq("o:p:e")


@app.task(queue="jobs")
async def jobs(payload):
    return payload
"""

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to make files of another uid (os.chown)"
)


def _fairq(args: list[str], cwd: Path, state: Path) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "FAIRQ_REDIS_URL"}
    environ["FAIRQ_STATE_DIR"] = str(state)
    return subprocess.run(
        [sys.executable, "-m", "fairq", *args], cwd=cwd, env=environ,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_worker_refuses_a_state_dir_another_user_set_up(tmp_path: Path) -> None:
    base = tmp_path / "tmp"
    base.mkdir()
    base.chmod(0o1777)  # a /tmp of its own: world-writable, sticky
    state = base / f"fairq-{os.getuid()}"  # the per-uid path fairq suggests
    state.mkdir(mode=0o700)
    sock = state / "valkey.sock"
    (tmp_path / "app.py").write_text(APP)
    with EmbeddedServer(unix_socket=sock) as theirs:
        client = redis.Redis(unix_socket_path=str(sock))
        try:
            hand_to_nobody(state, theirs, client)
            before = int(client.info("stats")["total_commands_processed"])

            worker = _fairq(["worker", "app:app", "--burst"], tmp_path, state)
            status = _fairq(["server", "status"], tmp_path, state)

            for done in (worker, status):
                assert done.returncode != 0, done
                assert "belongs to uid 65534" in done.stderr, done.stderr[-500:]
                assert "FAIRQ_STATE_DIR" in done.stderr
                assert "Traceback" not in done.stderr
            # their server saw only this test's two INFO calls, and holds no key
            assert int(client.info("stats")["total_commands_processed"]) == before + 1
            assert client.dbsize() == 0
        finally:
            client.close()
