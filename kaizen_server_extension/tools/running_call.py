"""Which guarded call the running tool code belongs to: its call id, set only by the pipeline.

A call-scoped attestation (``store/artifacts/content.py``) must name the exact call whose
result it vouches for. The tool implementation's signature carries no call id, so the pipeline
sets it as a context variable around the call's own task (as it does ``authorized_as``); a
task started within copies it, nothing outside a guarded call sees one, and the model or the
arguments can never supply it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_CALL_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "kaizen_running_call_id", default=None)


def running_call_id() -> str | None:
    """The id of the guarded call running in this task, or None outside one."""
    return _CALL_ID.get()


@contextmanager
def running_call(call_id: str) -> Iterator[None]:
    """Within the block (and in a task created within it) the running call is ``call_id``.
    For the pipeline only."""
    token = _CALL_ID.set(call_id)
    try:
        yield
    finally:
        _CALL_ID.reset(token)


__all__ = ["running_call", "running_call_id"]
