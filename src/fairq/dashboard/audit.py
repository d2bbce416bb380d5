"""Who changed what, from the dashboard: every action is audited.

Each action (pause, resume, cancel, redrive, delete, limits, weights, caps) is appended to
the environment's bounded audit list on the server (:meth:`fairq.store.RunQueue.record_audit`:
the last 1,000, on the server's clock; one round trip, after the action succeeded), which
the queue page shows, and written as one line on the logger ``fairq.audit`` (``who``,
``action``, ``target``, ``detail`` as record attributes, so JSON logs keep them as fields).
"""

from __future__ import annotations

import logging
from typing import Any, Final

from fairq.keys import Environment
from fairq.store import RunQueue

log = logging.getLogger("fairq.audit")

#: Audit entries a page shows.
MAX_SHOWN: Final = 20


async def record(
    rq: RunQueue, env: Environment, *, who: str, action: str, target: str, detail: str = ""
) -> None:
    """Audit one action (after it succeeded)."""
    log.info(
        "%s: %s %s %s%s", who, action, env.id, target, f" ({detail})" if detail else "",
        extra={"who": who, "action": action, "env": env.id, "target": target, "detail": detail},
    )  # fmt: skip
    await rq.record_audit(
        env, who=who[:200], action=action, target=target[:500] or "-", detail=detail[:2000]
    )


async def entries(rq: RunQueue, env: Environment, limit: int = MAX_SHOWN) -> list[dict[str, Any]]:
    """The newest audit entries of ``env``, newest first."""
    return [
        {"at_ms": r.at_ms, "who": r.who, "action": r.action, "target": r.target,
         "detail": r.detail}
        for r in await rq.audit_log(env, limit=limit)
    ]  # fmt: skip


__all__ = ["MAX_SHOWN", "entries", "record"]
