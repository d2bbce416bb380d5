"""fairq in a FastAPI app: the lifespan opens and closes the app's connection, an endpoint
triggers a task, another reads the run. Run the API and a worker (from this directory)::

    uvicorn fastapi_app:api
    fairq worker fastapi_app:fq

    curl -X POST localhost:8000/reports -H 'content-type: application/json' \\
         -d '{"account": "acme", "month": "2024-05"}'       # {"run_id": "run_…"}
    curl localhost:8000/reports/run_…                        # status, progress, result
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypedDict

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from fairq import Fairq, current_run

fq = Fairq(env="acme:shop:dev", fair=True)


class ReportRequest(TypedDict):
    account: str
    month: str


@fq.task(queue="reports", concurrency_limit=2, timeout=300)
async def build_report(payload: ReportRequest) -> dict[str, Any]:
    run = current_run()
    for step in range(1, 4):
        if run is not None:
            run.progress(step / 3, f"step {step} of 3")
        await asyncio.sleep(0.01)  # the real work
    return {"account": payload["account"], "month": payload["month"], "rows": 42}


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    await fq.queue()  # connect at startup: an unreachable server fails here, not per request
    yield
    await fq.aclose()


api = FastAPI(lifespan=lifespan)


class ReportIn(BaseModel):
    account: str
    month: str


@api.post("/reports", status_code=202)
async def request_report(body: ReportIn) -> dict[str, str]:
    # one round trip; each account is its own concurrency key (2 reports at a time each)
    handle = await build_report.trigger(
        {"account": body.account, "month": body.month}, concurrency_key=body.account
    )
    return {"run_id": handle.run_id}


@api.get("/reports/{run_id}")
async def report_status(run_id: str) -> dict[str, Any]:
    info = await fq.get_run(run_id)
    if info is None:
        raise HTTPException(status_code=404, detail="unknown run")
    return {
        "status": info.status.value,
        "progress": list(info.progress) if info.progress else None,
        "result": info.result,
        "error": info.error,
    }
