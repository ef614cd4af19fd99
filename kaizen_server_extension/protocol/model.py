"""Model steps: the context sent, the events streamed back, and how a provider fails."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Literal

from kaizen_server_extension.protocol.tools import AdvertisedTool, ToolCall


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of model context. Thinking never appears here (R-011)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class StepSnapshot:
    """Exactly what one model step sends. A pre-commit retry re-sends this object (R-009)."""

    step: int
    messages: tuple[ChatMessage, ...]
    tools: tuple[AdvertisedTool, ...]
    # Set when the step must call exactly this tool (required-tool rule).
    required_tool: str | None = None

    def digest(self) -> str:
        payload = {
            "step": self.step,
            "messages": [
                {
                    "role": m.role,
                    "content": m.content,
                    "tool_calls": [[c.call_id, c.name, c.arguments] for c in m.tool_calls],
                    "tool_call_id": m.tool_call_id,
                    "name": m.name,
                }
                for m in self.messages
            ],
            "tools": [[t.name, t.description, dict(t.parameters), t.capability.value]
                      for t in self.tools],
            "required_tool": self.required_tool,
        }
        raw = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(raw.encode()).hexdigest()


# --- Streamed events of one model step -------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallEmitted:
    """A complete tool call (the gateway assembles streamed fragments before emitting)."""

    call: ToolCall


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class StepFinished:
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    model: str | None = None


StepEvent = TextDelta | ThinkingDelta | ToolCallEmitted | StepFinished


class ModelStepError(Exception):
    """A provider failure, already classified by the gateway.

    ``retryable`` is True for transient failures (connect error, timeout, 429, 5xx); such a
    failure may be retried before anything is committed. Deterministic failures (invalid
    request, tool schema, model id, provider parameter) are never replayed. ``code`` is a
    content-free diagnostic; no provider text travels in it.
    """

    def __init__(self, code: str, *, retryable: bool) -> None:
        super().__init__(code)
        self.code = code
        self.retryable = retryable
