"""fairq's error vocabulary.

Every exception fairq raises on purpose derives from :class:`FairqError`. Lua scripts
report a refused argument as an ``FQ<code>`` error reply; :func:`raise_for_code` is the
one place that maps those to exceptions. Domain outcomes (duplicate, rejected by the
size limit, lease lost…) are not errors: scripts return them as status codes from one
table (:mod:`fairq.store.status`), decoded in one place.

:class:`PermanentError` is the one exception here that is *not* a :class:`FairqError`:
it is raised by user code (a task) to tell fairq something, not raised by fairq, and a
task's ``except FairqError`` must not swallow it.
"""

from __future__ import annotations

from typing import Any

#: Longest part of a bad value that an error message repeats.
MAX_ECHO_CHARS = 60


def short(value: object) -> str:
    """``repr(value)``, truncated so that a 10 KB value does not flood a message."""
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__}>"
    if len(text) > MAX_ECHO_CHARS:
        text = text[: MAX_ECHO_CHARS - 1] + "…"
    return text


class FairqError(Exception):
    """Root of every error fairq raises on purpose."""


class InvalidNameError(FairqError, ValueError):
    """A name (org, project, env, queue, run id, concurrency key, tenant) cannot be used."""

    def __init__(self, kind: str, value: object, reason: str) -> None:
        self.kind = kind
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {kind} {short(value)}: {reason}")


class InvalidLimitError(FairqError, ValueError):
    """A limit, weight, time or option is out of its allowed range."""

    def __init__(self, name: str, value: object, reason: str) -> None:
        self.name = name
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {name} {short(value)}: {reason}")


class ConfigurationError(FairqError, ValueError):
    """A configuration value (option or environment variable) is invalid."""


class ConfigurationMismatchError(ConfigurationError):
    """This process's shard count or prefix disagrees with what the server recorded."""


class PayloadError(FairqError, ValueError):
    """A payload is not JSON-serialisable, too deep, or larger than the configured maximum."""


class QueueSizeLimitExceededError(FairqError):
    """An enqueue would grow a queue past its size limit; nothing was written."""

    def __init__(self, queue: str, maximum_size: int) -> None:
        self.queue = queue
        self.maximum_size = maximum_size
        super().__init__(
            f"cannot enqueue to queue {queue!r}: its size limit has been reached "
            f"(the maximum size is {maximum_size})"
        )


class ServerUnavailableError(FairqError, ConnectionError):
    """The Redis/Valkey server cannot be reached, or is not a usable server."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"cannot use the Redis/Valkey server at {url}: {reason}")


class ConnectionLostError(ServerUnavailableError):
    """A command failed because the connection to the server broke (it may come back)."""


class EmbeddedServerError(FairqError, RuntimeError):
    """The embedded Valkey server could not be started or stopped."""


class RunNotFoundError(FairqError, LookupError):
    """The run does not exist (or no longer exists) where the operation expected it."""

    def __init__(self, run_id: str, where: str) -> None:
        self.run_id = run_id
        self.where = where
        super().__init__(f"run {short(run_id)} not found in {where}")


class ScriptProtocolError(FairqError):
    """A script returned a reply this version of fairq does not understand (a bug, or a
    script and a client of different versions)."""

    def __init__(self, operation: str, reply: object) -> None:
        self.operation = operation
        self.reply = reply
        super().__init__(f"the {operation} script returned an unknown reply {short(reply)}")


class RunFailedError(FairqError):
    """:meth:`fairq.RunHandle.wait` found the run failed, expired, dead-lettered or cancelled."""

    def __init__(self, run_id: str, status: Any, error: str | None) -> None:
        self.run_id = run_id
        self.status = status
        self.error = error
        detail = f": {error}" if error else ""
        value = getattr(status, "value", status)
        super().__init__(f"run {run_id!r} ended {value}{detail}")


class TaskTimeoutError(FairqError, TimeoutError):
    """A run exceeded its task's timeout (recorded as the run's error)."""

    def __init__(self, run_id: str, timeout_s: float) -> None:
        self.run_id = run_id
        self.timeout_s = timeout_s
        super().__init__(f"run {run_id!r} timed out after {timeout_s:g}s")


class PermanentError(Exception):
    """Raise it from a task to fail the run now: no retry, no dead letter (status ``failed``).

    Not a :class:`FairqError` on purpose: user code raises it, and a task's own
    ``except FairqError`` handler must not catch it by accident.
    """


#: Prefix of a Lua error reply that carries a fairq code (``{err = "FQ<code> <detail>"}``).
#: Codes: ``2`` = an argument the script refuses (a caller bug; nothing was written).
LUA_ERROR_PREFIX = "FQ"


def raise_for_code(message: str) -> None:
    """Translate a Lua ``FQ<code>`` error reply into a fairq exception.

    Raises:
        FairqError: always; the subclass depends on the code.
    """
    text = message.split(LUA_ERROR_PREFIX, 1)[-1] if LUA_ERROR_PREFIX in message else message
    code, _, detail = text.partition(" ")
    if code == "2":
        raise InvalidLimitError("script argument", detail, "rejected by the server script")
    raise FairqError(f"server script error: {message}")
