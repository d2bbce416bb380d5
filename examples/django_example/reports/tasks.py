"""The reports app's fairq app and tasks (a worker: ``python manage.py run_fairq_worker``,
or ``fairq worker reports.tasks:app`` for tasks that do not need Django set up)."""

from __future__ import annotations

from typing import TypedDict

from fairq import Fairq

app = Fairq(env="acme:shop:dev")


class ReportRequest(TypedDict):
    account: str


class Report(TypedDict):
    account: str
    rows: int


@app.task(queue="django_reports", concurrency_limit=2)
def build_report(payload: ReportRequest) -> Report:
    """A plain function, as most Django code is: the worker runs it in a thread (the ORM
    is usable here once Django is set up, e.g. by the run_fairq_worker command)."""
    return {"account": payload["account"], "rows": len(payload["account"]) * 10}
