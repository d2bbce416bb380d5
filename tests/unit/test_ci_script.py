"""CI (.ci/run) runs the README's test command as the README prints it, after the lint and
type checks, and builds the documentation site."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def readme_test_command() -> str:
    block = re.search(
        r"<!-- quickstart -->\n```\n(.*?)```\n<!-- /quickstart -->",
        (REPO / "README.md").read_text(),
        re.S,
    )
    assert block is not None, "README.md has no quickstart block"
    lines = block.group(1).splitlines()
    assert len(lines) >= 2
    return lines[1]


def test_ci_runs_the_readme_test_command_verbatim_after_lint_and_types() -> None:
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    command = readme_test_command()
    assert command.endswith("-m pytest -q"), command  # the whole suite, no selection
    assert command in ci
    at = ci.index(command)
    for check in ("ruff check", "ruff format --check", "mypy src/fairq"):
        first = next(i for i, line in enumerate(ci) if check in line)
        assert first < at, f"{check} runs after the tests"
    assert any("mkdocs build --strict" in line for line in ci[at:])
