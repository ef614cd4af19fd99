"""Operator logs: every Kaizen line carries the run and conversation it belongs to.

The ids travel in context variables, set where a room's lane drains and a run executes
(:func:`log_context`); asyncio tasks copy them, so whatever a run's controller, tools and
store log carries its ids without passing them around. :func:`configure` gives Kaizen's
loggers one handler: Jupyter's line format with ``run=… conversation=…`` appended, or, with
``KAIZEN_LOG_FORMAT=json``, one JSON object per line (for Jupyter's own lines too, so a log
shipper reads one format). Lines never carry secrets or tool-result text: the messages
logged are content-free by construction (tools/metrics.py), this module adds only ids.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal

from tornado.log import LogFormatter

LogFormat = Literal["text", "json"]

#: Every logger Kaizen's code writes to (some modules log under ``kaizen.*``, the others
#: under their module name).
KAIZEN_LOGGERS = ("kaizen", "kaizen_server_extension", "kaizen_kernel", "kaizen_plugins")
CONTEXT_FIELDS = ("run_id", "conversation_id")

_run_id: ContextVar[str | None] = ContextVar("kaizen_run_id", default=None)
_conversation_id: ContextVar[str | None] = ContextVar("kaizen_conversation_id", default=None)


@contextmanager
def log_context(*, conversation_id: str | None = None,
                run_id: str | None = None) -> Iterator[None]:
    """Lines logged inside (and in tasks created inside) carry these ids."""
    tokens = []
    if conversation_id is not None:
        tokens.append((_conversation_id, _conversation_id.set(conversation_id)))
    if run_id is not None:
        tokens.append((_run_id, _run_id.set(run_id)))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


class ContextFilter(logging.Filter):
    """Stamps ``run_id`` and ``conversation_id`` on a record (an ``extra=`` value wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "run_id", None) is None:
            record.run_id = _run_id.get()
        if getattr(record, "conversation_id", None) is None:
            record.conversation_id = _conversation_id.get()
        return True


class TextFormatter(LogFormatter):
    """Jupyter's own line format, then the ids the line belongs to."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = " ".join(f"{name.removesuffix('_id')}={value}" for name in CONTEXT_FIELDS
                       if (value := getattr(record, name, None)))
        if not ids:
            return line
        first, newline, rest = line.partition("\n")
        return f"{first} [{ids}]{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, the ids, and the exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def formatter_for(fmt: LogFormat, *, jupyter_format: str | None = None,
                  datefmt: str | None = None) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    return TextFormatter(fmt=jupyter_format or LogFormatter.DEFAULT_FORMAT,
                         datefmt=datefmt or LogFormatter.DEFAULT_DATE_FORMAT)


def configure(fmt: LogFormat, *, level: int | str = logging.INFO,
              jupyter_log: logging.Logger | None = None,
              jupyter_format: str | None = None, datefmt: str | None = None) -> None:
    """One handler on Kaizen's loggers (which Jupyter leaves unconfigured: without it their
    INFO lines are lost and warnings print bare). A logger an operator already configured
    (``c.ServerApp.logging_config``) is left alone. With ``json``, Jupyter's own handlers
    get the JSON formatter too."""
    formatter = formatter_for(fmt, jupyter_format=jupyter_format, datefmt=datefmt)
    context = ContextFilter()
    for name in KAIZEN_LOGGERS:
        logger = logging.getLogger(name)
        if logger.handlers:
            continue
        stream = logging.StreamHandler()
        stream.setFormatter(formatter)
        stream.addFilter(context)
        logger.addHandler(stream)
        logger.setLevel(level)
        logger.propagate = False
    if fmt == "json" and jupyter_log is not None:
        for handler in jupyter_log.handlers:
            handler.setFormatter(formatter)
            handler.addFilter(context)
