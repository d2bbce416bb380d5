"""The README's "Use it" snippet runs as written (a script: no top-level await) against a
real server, and leaves the run it reports queued there."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

from fairq.app import Fairq
from fairq.config import RunQueueConfig
from fairq.outcomes import RunStatus

README = Path(__file__).resolve().parents[2] / "README.md"


def use_it_snippet() -> str:
    """The first ```python block under the "## Use it" heading."""
    text = README.read_text()
    section = text.split("\n## Use it", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"^```python\n(.*?)^```", section, re.S | re.M)
    assert found, "no ```python block under '## Use it'"
    return found.group(1)


async def test_the_use_it_snippet_runs_as_written(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    code = use_it_snippet()
    compile(code, "README.md", "exec")  # a script: top-level await would not compile
    script = tmp_path / "use_it.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRQ_")}
    env |= {"FAIRQ_REDIS_URL": redis_url, "FAIRQ_PREFIX": prefix}
    out = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(script)], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    # it printed a run id that the server knows, queued for a worker
    run_ids = re.findall(r"\brun_[0-9a-f]{32}\b", out.stdout)
    assert run_ids, out.stdout
    apps = re.findall(r'Fairq\(env="([^"]+)"', code)
    assert apps, "the snippet names no env"
    app = Fairq(apps[0], url=redis_url, config=RunQueueConfig(prefix=prefix))
    try:
        info = await app.get_run(run_ids[0])
        assert info is not None and info.status is RunStatus.QUEUED
    finally:
        await app.aclose()
