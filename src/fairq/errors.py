"""fairq's error vocabulary.

Every exception fairq raises on purpose derives from :class:`FairqError`. Lua scripts
report domain failures as small numeric codes; :func:`raise_for_code` is the one place
that maps them to exceptions.
"""

from __future__ import annotations


class FairqError(Exception):
    """Root of every error fairq raises on purpose."""


class InvalidNameError(FairqError, ValueError):
    """A name (org, project, env, queue, run id, concurrency key) cannot be used."""

    def __init__(self, kind: str, value: object, reason: str) -> None:
        self.kind = kind
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {kind} {value!r}: {reason}")


class InvalidLimitError(FairqError, ValueError):
    """A limit, weight or option is out of its allowed range."""

    def __init__(self, name: str, value: object, reason: str) -> None:
        self.name = name
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {name} {value!r}: {reason}")


class ConfigurationError(FairqError, ValueError):
    """A configuration value (option or environment variable) is invalid."""


class PayloadError(FairqError, ValueError):
    """A payload is not JSON-serialisable or is larger than the configured maximum."""


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


class EmbeddedServerError(FairqError, RuntimeError):
    """The embedded Valkey server could not be started or stopped."""


class RunNotFoundError(FairqError, LookupError):
    """The run does not exist (or no longer exists) where the operation expected it."""

    def __init__(self, run_id: str, where: str) -> None:
        self.run_id = run_id
        self.where = where
        super().__init__(f"run {run_id!r} not found in {where}")


#: Prefix of a Lua error reply that carries a fairq code (``{err = "FQ<code> <detail>"}``).
#: Domain outcomes (duplicate, rejected by the size limit, lease lost…) are not errors:
#: scripts return them as status codes, which :mod:`fairq.store` decodes into enums.
#: Codes: ``2`` = an argument the script refuses (a caller bug).
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
