"""A small fairq app: one keyed async task, one plain (sync) task.

Run a worker on it (from this directory)::

    fairq worker app:app --concurrency 8

and trigger runs with ``python trigger.py``. With no ``FAIRQ_REDIS_URL`` both use the
same shared embedded server (stop it with ``fairq server stop``).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from fairq import Fairq, PermanentError, RetryPolicy, current_run

# fair=True: each tenant (concurrency key) gets its share of the workers, however
# deep another tenant's backlog is. Every process using these queues must agree on it.
app = Fairq(env="acme:shop:dev", fair=True)


@app.task(
    queue="emails",
    concurrency_limit=2,  # at most 2 e-mails in flight *per tenant*
    retry=RetryPolicy(max_attempts=4, min_delay_ms=500),
)
async def send_email(payload: dict[str, Any]) -> dict[str, Any]:
    """Pretend to send an e-mail; an address without '@' can never succeed."""
    if "@" not in payload["to"]:
        raise PermanentError(f"not an address: {payload['to']!r}")
    await asyncio.sleep(0.05)  # the SMTP call
    run = current_run()
    return {"sent_to": payload["to"], "attempt": run.attempt if run else 0}


@app.task(queue="thumbnails")
def make_thumbnail(payload: dict[str, Any]) -> str:
    """CPU-ish work in a plain function: the worker runs it in a thread."""
    digest = hashlib.sha256(payload["image"].encode()).hexdigest()
    return f"thumb-{digest[:12]}.png"
