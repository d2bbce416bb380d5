"""Typed tasks under mypy: ``Task[P, R]`` checks the payload at the trigger and types the
result of ``wait()``; the typed examples pass ``mypy --strict``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = textwrap.dedent(
    """
    from typing import TypedDict, assert_type
    from fairq import Fairq, RunHandle, Task

    app = Fairq("o:p:e")

    class Order(TypedDict):
        id: int

    @app.task(queue="ship")
    async def ship(payload: Order) -> str:
        return str(payload["id"])

    @app.task
    def count(payload: list[int]) -> int:
        return len(payload)

    async def use() -> None:
    """
)


def check(tmp_path: Path, body: str) -> tuple[int, str]:
    source = tmp_path / "typed_snippet.py"
    source.write_text(PRELUDE + textwrap.indent(textwrap.dedent(body), "    "))
    out, err, status = mypy_api.run(["--strict", "--no-error-summary", str(source)])
    return status, out + err


def test_payload_and_result_types_flow_through_trigger_and_wait(tmp_path: Path) -> None:
    status, out = check(
        tmp_path,
        """
        assert_type(ship, Task[Order, str])
        assert_type(count, Task[list[int], int])
        handle = await ship.trigger({"id": 7}, concurrency_key="k")
        assert_type(handle, RunHandle[str])
        assert_type(await handle.wait(timeout=1), str)
        assert_type(count.trigger_sync([1, 2]).wait_sync(), int)
        handles = await count.trigger_many([[1], [2, 3]])
        assert_type(handles, list[RunHandle[int]])
        """,
    )
    assert status == 0, out


#: A wrong payload or result type, and what mypy says (one mypy run for all of them).
WRONG = [
    ('await ship.trigger({"id": "seven"})', 'TypedDict item "id" has type "int"'),
    ('await count.trigger("1,2")', 'Argument 1 to "trigger" of "Task" has incompatible type'),
    ("count.trigger_sync([1.5])", 'List item 0 has incompatible type "float"; expected "int"'),
    (
        "text: bytes = await (await ship.trigger({'id': 1})).wait()",
        'Incompatible types in assignment (expression has type "str"',
    ),
]


def test_a_wrong_payload_or_result_type_is_a_type_error(tmp_path: Path) -> None:
    status, out = check(tmp_path, "\n".join(line for line, _ in WRONG))
    assert status == 1
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == len(WRONG), out
    first = PRELUDE.count("\n") + 1
    for i, (_, message) in enumerate(WRONG):
        at = [e for e in errors if f"typed_snippet.py:{first + i}:" in e]
        assert at and message in at[0], (message, out)


def test_the_examples_pass_mypy_strict() -> None:
    out, err, status = mypy_api.run(["--strict", str(ROOT / "examples")])
    assert status == 0, out + err
