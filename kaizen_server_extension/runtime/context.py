"""Model context of one run and the immutable step snapshots built from it (pure).

The transcript starts from the admitted context and grows only by what the model committed
(assistant text and tool calls), the tool projections the backend handed back, and
server-authored instructions (correction reminders, the synthesis instruction). Thinking has
no place in :class:`ChatMessage`, so it can never reach a later step, a retry payload or the
durable history (R-011).
"""

from __future__ import annotations

from collections.abc import Iterable

from kaizen_server_extension.protocol.model import ChatMessage, StepSnapshot
from kaizen_server_extension.protocol.tools import AdvertisedTool, ToolCall


class Transcript:
    """An append-only list of messages; every snapshot copies it into a tuple."""

    def __init__(self, context: Iterable[ChatMessage]) -> None:
        self._messages: list[ChatMessage] = list(context)

    @property
    def messages(self) -> tuple[ChatMessage, ...]:
        return tuple(self._messages)

    def add_assistant(self, text: str, calls: Iterable[ToolCall] = ()) -> None:
        self._messages.append(ChatMessage(role="assistant", content=text, tool_calls=tuple(calls)))

    def add_tool_result(self, call: ToolCall, content: str) -> None:
        self._messages.append(
            ChatMessage(role="tool", content=content, tool_call_id=call.call_id, name=call.name)
        )

    def add_instruction(self, text: str) -> None:
        """A server-authored instruction (a correction reminder or a required-tool nudge)."""
        self._messages.append(ChatMessage(role="system", content=text))

    def snapshot(
        self,
        step: int,
        tools: tuple[AdvertisedTool, ...],
        *,
        required_tool: str | None = None,
        instruction: str | None = None,
    ) -> StepSnapshot:
        """Freeze what this step sends. ``instruction`` is appended to this snapshot only
        (the synthesis instruction does not become part of the running transcript)."""
        messages = self.messages
        if instruction is not None:
            messages += (ChatMessage(role="system", content=instruction),)
        return StepSnapshot(step=step, messages=messages, tools=tools, required_tool=required_tool)
