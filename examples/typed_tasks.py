"""Typed tasks: a task's payload and result types flow to ``trigger`` and ``wait``.

``Task[P, R]`` takes ``P`` and ``R`` from the function it wraps, so a type checker
refuses a wrong payload at the trigger and knows what ``wait()`` returns::

    mypy --strict examples/

Run it (a worker of this module must run: ``fairq worker typed_tasks:app``), or see
``eager_demo`` for the same without a server.
"""

from __future__ import annotations

import asyncio
from typing import TypedDict, assert_type

from fairq import Fairq, RunHandle, Task

app = Fairq(env="acme:shop:dev")


class ReportRequest(TypedDict):
    account: str
    month: str


class ReportSummary(TypedDict):
    account: str
    rows: int


@app.task(queue="reports", timeout=60)
async def build_report(payload: ReportRequest) -> ReportSummary:
    await asyncio.sleep(0)
    return {"account": payload["account"], "rows": 42}


@app.task(queue="totals")
def add_up(payload: list[int]) -> int:
    """A plain function: it runs in a worker thread."""
    return sum(payload)


# what the decorator made of them
assert_type(build_report, Task[ReportRequest, ReportSummary])
assert_type(add_up, Task[list[int], int])


async def main() -> None:
    handle = await build_report.trigger({"account": "a-1", "month": "2024-05"})
    assert_type(handle, RunHandle[ReportSummary])
    summary = await handle.wait(timeout=30)
    assert_type(summary, ReportSummary)
    print(summary["rows"])

    total = await (await add_up.trigger([1, 2, 3])).wait(timeout=30)
    assert_type(total, int)
    print(total + 1)

    # mypy refuses these (uncomment to see):
    # await build_report.trigger({"account": 7})          # "account" must be a str
    # await add_up.trigger("1, 2, 3")                     # a str is not a list[int]
    # text: str = await (await add_up.trigger([1])).wait()  # the result is an int


def eager_demo() -> int:
    """The same tasks run in-process, no server: ``Fairq(..., eager=True)``."""
    eager = Fairq(env="acme:shop:test", eager=True)

    @eager.task(queue="totals")
    def add_up_here(payload: list[int]) -> int:
        return sum(payload)

    result = add_up_here.trigger_sync([4, 5]).wait_sync(timeout=5)
    eager.close()
    return result


if __name__ == "__main__":
    print(eager_demo())
    asyncio.run(main())
