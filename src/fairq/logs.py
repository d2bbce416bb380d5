"""Logging setup for fairq's processes: plain text or one JSON object per line.

fairq logs through the standard library (``fairq.worker``, ``fairq.consumer``,
``fairq.run`` — one INFO line per run attempt with ``run_id``, ``queue``,
``concurrency_key``, ``tenant``, ``attempt``, ``duration_ms``, ``outcome`` and ``error`` as
record attributes — ``fairq.dashboard``, ``fairq.audit``...). :class:`JsonFormatter` writes
each record as one JSON object: ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``message``,
every extra attribute the call passed, and ``exc`` for an exception's traceback.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Any, Final, Literal

LogFormat = Literal["text", "json"]

#: The text format of ``fairq worker`` (and the supervisor).
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Attributes every LogRecord has: not "extra" fields.
_STANDARD: Final = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName"}


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and not name.startswith("_") and name not in data:
                data[name] = _plain(value)
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            data["exc"] = record.exc_text
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def say(message: str, fmt: LogFormat = "text", *, logger: str = "fairq.worker") -> None:
    """A status line on stderr (start and stop banners): as is, or as one JSON object in
    the log format, whatever the log level."""
    if fmt == "json":
        record = logging.LogRecord(logger, logging.INFO, __file__, 0, message, None, None)
        sys.stderr.write(JsonFormatter().format(record) + "\n")
    else:
        sys.stderr.write(message + "\n")
    sys.stderr.flush()


def configure(level: int = logging.WARNING, fmt: LogFormat = "text", *, stream: Any = None) -> None:
    """Send the root logger's records to ``stream`` (stderr) as text or JSON lines,
    replacing handlers an earlier call installed. ``fairq.run`` logs at INFO: with a level
    above INFO a worker still writes its per-run lines when ``fmt`` is json (they are what a
    log pipeline wants); text keeps them at the chosen level."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be 'text' or 'json', got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_fairq", False):
            root.removeHandler(old)
    handler._fairq = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    if fmt == "json" and level > logging.INFO:
        logging.getLogger("fairq.run").setLevel(logging.INFO)


__all__ = ["TEXT_FORMAT", "JsonFormatter", "LogFormat", "configure", "say"]
