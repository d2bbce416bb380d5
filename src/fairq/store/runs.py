"""Operations on one run by its id: cancel it, redrive it from the dead-letter queue."""

from __future__ import annotations

import asyncio
from typing import Final

from fairq import keys as K
from fairq.errors import InvalidLimitError, RunNotFoundError
from fairq.keys import Environment
from fairq.models import CancelOutcome
from fairq.outcomes import STATE_STATUS, RunStatus
from fairq.store._core import StoreCore
from fairq.store.status import Status

_CANCEL: Final = {
    Status.CANCELLED: CancelOutcome.CANCELLED,
    Status.REMOVED_FROM_DLQ: CancelOutcome.REMOVED_FROM_DLQ,
    Status.CANCEL_REQUESTED: CancelOutcome.CANCEL_REQUESTED,
    Status.ALREADY_FINISHED: CancelOutcome.ALREADY_FINISHED,
    Status.UNKNOWN_RUN: CancelOutcome.UNKNOWN,
    Status.NOT_IN_STATE: CancelOutcome.NOT_IN_STATE,
}

#: The states ``cancel(only_if=...)`` accepts, as the script names them: a run's states
#: on the server (``STATE_STATUS`` read backwards).
_ONLY_IF: Final = {status: state for state, status in STATE_STATUS.items()}


class RunOps(StoreCore):
    async def cancel(
        self,
        env: Environment,
        run_id: str,
        *,
        only_if: RunStatus | None = None,
        now_ms: int | None = None,
    ) -> CancelOutcome:
        """Cancel a run in one script call. A queued run leaves its queue and a
        dead-lettered one the DLQ (both get the outcome ``cancelled``); a running run is
        marked, and its worker told, so that it stops it and acks it as cancelled.

        ``only_if`` (``QUEUED``, ``RUNNING`` or ``DEAD_LETTERED``): act only if the run is
        in that state when the script runs, else change nothing and return
        ``NOT_IN_STATE``. A caller that looked at a run first (a dashboard, ``fairq dlq
        delete``) thus never acts on a run that moved in between, e.g. a dead letter
        redriven meanwhile.

        Raises:
            InvalidNameError: a bad run id.
            InvalidLimitError: ``only_if`` is not a state a run can be cancelled in
                (it is a ValueError too).
        """
        K.validate_name("run id", run_id)
        args = [env.id, run_id]
        if only_if is not None:
            state = _ONLY_IF.get(only_if) if isinstance(only_if, RunStatus) else None
            if state is None:
                raise InvalidLimitError(
                    "only_if", only_if, f"must be one of {', '.join(s.name for s in _ONLY_IF)}"
                )
            args.append(state)
        statuses = await self.on_every_partition("cancel", env, args, now_ms)
        # the run lives in one partition: the others do not know it
        known = [s for s in statuses if s is not Status.UNKNOWN_RUN]
        return _CANCEL[known[0] if known else Status.UNKNOWN_RUN]

    async def redrive(self, env: Environment, run_id: str, *, now_ms: int | None = None) -> None:
        """Move a dead-lettered run back to its queue with attempt 0, ready now.

        Raises:
            RunNotFoundError: the run is not in the environment's dead-letter queue.
        """
        K.validate_name("run id", run_id)
        statuses = await self.on_every_partition("redrive", env, [env.id, run_id], now_ms)
        if Status.REDRIVEN not in statuses:
            raise RunNotFoundError(run_id, f"the dead-letter queue of {env}")

    async def on_every_partition(
        self, operation: str, env: Environment, args: list[str], now_ms: int | None
    ) -> list[Status]:
        """Run a script on each partition of the environment at once (for an operation on
        a run known by its id alone): each partition's status, partition 0 first."""
        served = (await self.placement(env)).served
        replies = await asyncio.gather(
            *(self.call_for_env(operation, env, args, now_ms, p) for p in range(served))
        )
        return [self.decode(operation, reply) for reply in replies]
