"""Model context rebuilt from the durable room journal (spec: Actor-specific execution).

Only what was committed enters: accepted inputs and committed answers. Thinking, deltas and
the tool traffic of earlier turns do not, so a later turn never inherits another attempt's
reasoning (R-011).
"""

from __future__ import annotations

from collections.abc import Sequence

from kaizen_server_extension.runtime.port import ChatMessage
from kaizen_server_extension.store.records import EventRecord

#: Earlier messages carried into a turn; older history is left out rather than truncated.
MAX_HISTORY_MESSAGES = 40
INPUT_EVENTS = ("input.accepted", "steering.accepted")


def build_context(
    persona: str,
    history: Sequence[EventRecord],
    *,
    current_input_id: str,
    shared: bool,
) -> tuple[ChatMessage, ...]:
    """System persona, earlier answered exchanges, then the input this run answers."""
    answered = {e.run_id for e in history if e.type == "answer.committed"}
    messages: list[ChatMessage] = []
    current: ChatMessage | None = None
    for event in history:
        if event.type in INPUT_EVENTS:
            text = str(event.data.get("text", ""))
            # In a shared room the model must know who said what.
            content = f"[{event.actor}] {text}" if shared else text
            message = ChatMessage(role="user", content=content)
            if event.data.get("input_id") == current_input_id:
                current = message
            elif event.run_id in answered:
                messages.append(message)
        elif event.type == "answer.committed":
            messages.append(ChatMessage(role="assistant", content=str(event.data.get("text",
                                                                                      ""))))
    if current is None:
        raise LookupError("the run's accepted input is not in the journal")
    recent = messages[-MAX_HISTORY_MESSAGES:]
    # Never start the history with a dangling answer whose question was cut off.
    while recent and recent[0].role == "assistant":
        recent = recent[1:]
    return (ChatMessage(role="system", content=persona), *recent, current)
