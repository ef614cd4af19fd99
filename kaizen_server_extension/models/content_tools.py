"""Tool calls that an OpenAI-compatible server returned as JSON in ``content``.

Small models served by llama.cpp, Ollama or vLLM with their own chat template often answer a
tool request with the call as JSON text (sometimes in a Markdown fence or Qwen's
``<tool_call>`` tags) instead of ``tool_calls``. Such text is taken as a call only when it is
*nothing but* that JSON, names a tool advertised for this step, and carries arguments valid
against that tool's schema. Anything else stays text, unchanged.

Only used when the provider sent no native ``tool_calls`` in the step.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from kaizen_server_extension.models.constrained import validate_arguments
from kaizen_server_extension.protocol.model import (
    StepEvent,
    StepFinished,
    TextDelta,
    ToolCallEmitted,
)
from kaizen_server_extension.protocol.tools import AdvertisedTool, ToolCall

_FENCED = re.compile(r"\A```[ \t]*(?:json|JSON|tool_call)?[ \t]*\n?(?P<body>.*?)\n?```\Z",
                     re.DOTALL)
_TAGGED = re.compile(r"\A<tool_call>\s*(?P<body>.*?)\s*</tool_call>\Z", re.DOTALL)
#: Content longer than this is never inspected as a call (and streams without delay).
MAX_CALL_CHARS = 256 * 1024


def tool_call_from_content(text: str, tools: Sequence[AdvertisedTool], *,
                           call_id: str = "call_0") -> ToolCall | None:
    """The tool call ``text`` spells, validated against ``tools``; None when it is text.

    Accepted shapes (the whole content, optionally fenced or in ``<tool_call>`` tags):
    ``{"name": N, "arguments": {...}}``, ``{"tool": N, "arguments": {...}}``,
    ``{"name": N, "parameters": {...}}`` and ``{"function": {"name": N, "arguments": ...}}``;
    arguments may also be a JSON-encoded string of an object."""
    if len(text) > MAX_CALL_CHARS:
        return None
    body = _unwrap(text.strip())
    if body is None:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    parsed = _name_and_arguments(data)
    if parsed is None:
        return None
    name, arguments = parsed
    tool = next((t for t in tools if t.name == name), None)
    if tool is None or not validate_arguments(tool, arguments):
        return None
    return ToolCall(call_id=call_id, name=name,
                    arguments=json.dumps(arguments, ensure_ascii=False))


def _unwrap(text: str) -> str | None:
    for pattern in (_FENCED, _TAGGED):
        match = pattern.match(text)
        if match is not None:
            return match.group("body").strip()
    return text if text.startswith("{") else None


def _name_and_arguments(data: Any) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(data, Mapping):
        return None
    if isinstance(data.get("function"), Mapping) and set(data) <= {"function", "type", "id"}:
        data = data["function"]
    name = data.get("name", data.get("tool"))
    if not isinstance(name, str) or not name:
        return None
    keys = set(data)
    allowed = {"name", "tool", "arguments", "parameters"}
    if not keys <= allowed or ("name" in keys and "tool" in keys):
        return None  # some other JSON document that happens to carry a "name"
    raw = data.get("arguments", data.get("parameters", {}))
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return None
    if not isinstance(raw, dict):
        return None
    return name, raw


def _may_become_call(text: str) -> bool:
    """While the content so far could still turn out to be a call, its text is held."""
    stripped = text.lstrip()
    if not stripped:
        return True
    if len(text) > MAX_CALL_CHARS:
        return False
    return (stripped.startswith(("{", "```"))
            or "```".startswith(stripped)
            or stripped.startswith("<tool_call>")
            or "<tool_call>".startswith(stripped))


class ContentToolCalls:
    """Filters one step's event stream: content that may be a JSON call is held back; at
    the end it becomes a :class:`ToolCallEmitted` when :func:`tool_call_from_content`
    accepts it and the provider emitted no native call, else it is released as text.
    Content that cannot be a call streams through unchanged."""

    def __init__(self, tools: Sequence[AdvertisedTool], *, step: int) -> None:
        self._tools = tuple(tools)
        self._step = step
        self._held: list[str] = []
        self._passing = not self._tools  # nothing advertised: nothing to recognise
        self._native = False

    def feed(self, event: StepEvent) -> list[StepEvent]:
        if isinstance(event, TextDelta):
            if self._passing:
                return [event]
            self._held.append(event.text)
            held = "".join(self._held)
            if _may_become_call(held):
                return []
            self._passing = True
            self._held = []
            return [TextDelta(held)]
        if isinstance(event, ToolCallEmitted):
            self._native = True
            return [*self._release(), event]
        if isinstance(event, StepFinished):
            return [*self._settle(), event]
        return [event]

    def _release(self) -> list[StepEvent]:
        held = "".join(self._held)
        self._held = []
        return [TextDelta(held)] if held else []

    def _settle(self) -> list[StepEvent]:
        held = "".join(self._held)
        if not held or self._native:
            return self._release()
        call = tool_call_from_content(held, self._tools, call_id=f"call_{self._step}_0")
        if call is None:
            return self._release()
        self._held = []
        return [ToolCallEmitted(call)]
