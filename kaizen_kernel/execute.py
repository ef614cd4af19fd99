"""One execution on a kernel client: send, collect iopub until idle, bound everything.

The kernel caps its own stdout/stderr (see :mod:`kaizen_kernel.prelude_py`); this module is
the server-side backstop: whatever arrives (fd-level output of subprocesses, display data,
huge tracebacks) is accounted against the same byte budget and dropped past it.
"""

from __future__ import annotations

import queue
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

MAX_ERROR_VALUE_CHARS = 2_000
MAX_TRACEBACK_CHARS = 16_000
MAX_TEXT_PLAIN_CHARS = 16_000
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_POLL_S = 0.25


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def bound_tail(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to its last ``limit`` characters (the end of a traceback matters most)."""
    if len(text) <= limit:
        return text, False
    return "…[truncated]\n" + text[-limit:], True


def bound_head(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    return text[:limit] + "…[truncated]", True


@dataclass(slots=True)
class DisplayItem:
    """One display_data / execute_result, reduced to the mime types we keep."""

    text_plain: str | None = None
    image_png_b64: str | None = None


@dataclass(slots=True)
class ErrorInfo:
    name: str
    value: str
    traceback: str


ExecStatus = Literal["ok", "error", "timeout", "died"]


@dataclass(slots=True)
class ExecutionCapture:
    status: ExecStatus = "ok"
    stdout: str = ""
    stderr: str = ""
    displays: list[DisplayItem] = field(default_factory=list)
    error: ErrorInfo | None = None
    execution_count: int | None = None
    # Output beyond the budget was dropped inside the kernel (marker seen) / in the server.
    truncated_in_kernel: bool = False
    truncated_by_server: bool = False
    error_truncated: bool = False
    output_bytes: int = 0

    @property
    def truncated(self) -> bool:
        return self.truncated_in_kernel or self.truncated_by_server


class _OutputBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.exhausted = False

    def take_text(self, text: str) -> str:
        data = text.encode("utf-8", "replace")
        room = self.limit - self.used
        if len(data) <= room:
            self.used += len(data)
            return text
        self.exhausted = True
        self.used = self.limit
        return data[:max(room, 0)].decode("utf-8", "ignore")

    def take_blob(self, size: int) -> bool:
        if size <= self.limit - self.used:
            self.used += size
            return True
        self.exhausted = True
        return False


def _strip_markers(text: str, marker_re: re.Pattern[str] | None) -> tuple[str, bool]:
    if marker_re is None:
        return text, False
    cleaned, count = marker_re.subn("", text)
    return cleaned, count > 0


async def collect(
    client: Any,
    msg_id: str,
    *,
    wall_seconds: float,
    output_bytes: int,
    marker_re: re.Pattern[str] | None = None,
    is_alive: Callable[[], Awaitable[bool]] | None = None,
) -> ExecutionCapture:
    """Read iopub for ``msg_id`` until the kernel goes idle, the wall time ends or it dies.

    Never raises for kernel behaviour: the outcome is in ``status``.
    """
    cap = ExecutionCapture()
    budget = _OutputBudget(output_bytes)
    out: dict[str, list[str]] = {"stdout": [], "stderr": []}
    deadline = time.monotonic() + wall_seconds
    next_alive_check = time.monotonic() + 1.0
    while True:
        now = time.monotonic()
        if now >= deadline:
            cap.status = "timeout"
            break
        try:
            msg = await client.get_iopub_msg(timeout=min(_POLL_S, deadline - now))
        except (TimeoutError, queue.Empty):
            if is_alive is not None and time.monotonic() >= next_alive_check:
                next_alive_check = time.monotonic() + 1.0
                if not await is_alive():
                    cap.status = "died"
                    break
            continue
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = msg.get("msg_type") or msg.get("header", {}).get("msg_type")
        content = msg.get("content", {})
        if kind == "status" and content.get("execution_state") == "idle":
            break
        if kind == "stream":
            name = "stderr" if content.get("name") == "stderr" else "stdout"
            text, marked = _strip_markers(str(content.get("text", "")), marker_re)
            cap.truncated_in_kernel |= marked
            if not budget.exhausted:
                out[name].append(budget.take_text(text))
        elif kind in ("display_data", "execute_result", "update_display_data"):
            if kind == "execute_result":
                cap.execution_count = content.get("execution_count")
            data = content.get("data", {}) or {}
            item = DisplayItem()
            plain = data.get("text/plain")
            if isinstance(plain, str):
                bounded, _ = bound_head(plain, MAX_TEXT_PLAIN_CHARS)
                item.text_plain = budget.take_text(bounded) if not budget.exhausted else None
            png = data.get("image/png")
            if isinstance(png, str) and budget.take_blob(len(png)):
                item.image_png_b64 = png
            if item.text_plain is not None or item.image_png_b64 is not None:
                cap.displays.append(item)
        elif kind == "error":
            name, _ = bound_head(str(content.get("ename", "Error")), 200)
            value, vt = bound_head(strip_ansi(str(content.get("evalue", ""))),
                                   MAX_ERROR_VALUE_CHARS)
            tb_raw = "\n".join(strip_ansi(str(line)) for line in content.get("traceback", []))
            tb, tbt = bound_tail(tb_raw, MAX_TRACEBACK_CHARS)
            cap.error = ErrorInfo(name=name, value=value, traceback=tb)
            cap.error_truncated = vt or tbt
            cap.status = "error"
    cap.stdout = "".join(out["stdout"])
    cap.stderr = "".join(out["stderr"])
    cap.truncated_by_server = budget.exhausted
    cap.output_bytes = budget.used
    return cap


# The last "Name: message" line a kernel printed for an uncaught exception (Node prints its
# stack to stderr and sends no iopub ``error``), e.g. "RangeError: too far".
_DIAGNOSTIC = re.compile(r"^\d+:\d+ - ")
_STDERR_EXCEPTION = re.compile(r"^([A-Za-z_$][\w$.]*(?:Error|Exception)): ?(.*)$", re.MULTILINE)


def was_aborted_unrun(cap: ExecutionCapture, reply: dict[str, Any] | None) -> bool:
    """True when the kernel answered "aborted" without running anything (no output)."""
    status = ((reply or {}).get("content", {}) or {}).get("status")
    return (status in ("abort", "aborted") and cap.status == "ok" and not cap.stdout
            and not cap.stderr and not cap.displays)


def apply_reply_status(cap: ExecutionCapture, reply: dict[str, Any] | None) -> None:
    """The shell reply is authoritative for success: a kernel may report a failed execution
    only there (tslab sends no iopub ``error``), so an "ok" capture whose reply says error or
    aborted becomes an error, named from the reply or else from the stderr it printed."""
    if reply is None or cap.status != "ok":
        return
    content = reply.get("content", {}) or {}
    status = content.get("status")
    if status not in ("error", "aborted", "abort"):
        return
    name = str(content.get("ename") or "")
    value = strip_ansi(str(content.get("evalue") or ""))
    if not name:
        found = list(_STDERR_EXCEPTION.finditer(strip_ansi(cap.stderr)))
        if found:
            name, value = found[-1].group(1), found[-1].group(2)
        elif status != "error":
            name, value = "ExecutionAborted", "the kernel aborted this execution"
        else:
            lines = strip_ansi(cap.stderr).strip().splitlines()
            # tslab's type-check diagnostics read "LINE:COL - message".
            name = "CompileError" if lines and _DIAGNOSTIC.match(lines[0]) else "Error"
            value = lines[0] if name == "CompileError" else (lines[-1] if lines else "")
    bounded_name, _ = bound_head(name, 200)
    bounded_value, truncated = bound_head(value, MAX_ERROR_VALUE_CHARS)
    tb, tb_truncated = bound_tail(strip_ansi(cap.stderr), MAX_TRACEBACK_CHARS)
    cap.error = ErrorInfo(name=bounded_name, value=bounded_value, traceback=tb)
    cap.error_truncated = truncated or tb_truncated
    cap.status = "error"


async def wait_reply(client: Any, msg_id: str, seconds: float) -> dict[str, Any] | None:
    """The shell reply to ``msg_id`` (older replies are discarded), or None on timeout."""
    deadline = time.monotonic() + seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            msg = await client.get_shell_msg(timeout=remaining)
        except (TimeoutError, queue.Empty):
            return None
        if msg.get("parent_header", {}).get("msg_id") == msg_id:
            return dict(msg)


async def drain_until_idle(client: Any, msg_id: str, seconds: float) -> bool:
    """True when the kernel reports idle for ``msg_id`` within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            msg = await client.get_iopub_msg(timeout=remaining)
        except (TimeoutError, queue.Empty):
            return False
        if (msg.get("parent_header", {}).get("msg_id") == msg_id
                and msg.get("msg_type") == "status"
                and msg.get("content", {}).get("execution_state") == "idle"):
            return True
