"""Turn Chat Completions chunks (or one whole completion) into :data:`StepEvent` values.

Text and thinking are yielded as they arrive. Tool calls arrive as fragments keyed by
``index``; they are only emitted once the exchange has completed, because a call emitted
before a cut stream could be acted on even though the step is then retried.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kaizen_server_extension.models import errors
from kaizen_server_extension.protocol.model import (
    StepEvent,
    StepFinished,
    TextDelta,
    ThinkingDelta,
    ToolCallEmitted,
    Usage,
)
from kaizen_server_extension.protocol.tools import ToolCall


@dataclass(frozen=True, slots=True)
class ToolArgumentsDelta:
    """One live fragment of a tool call's arguments (only with ``live_arguments``).

    Never a call: nothing may act on it. It exists so a trusted observer can checkpoint an
    owner-resolved artifact update while it streams; the observer consumes it and the turn
    controller never sees it (kaizen_server_extension.lanes.artifact_stream)."""

    index: int
    call_id: str
    name: str
    text: str


@dataclass(slots=True)
class _PartialToolCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class StepAssembler:
    """Accumulates one model step; ``step`` seeds ids for calls the provider left unnamed."""

    def __init__(self, *, step: int, requested_model: str,
                 live_arguments: bool = False) -> None:
        self._step = step
        self._model = requested_model
        self._live_arguments = live_arguments
        self._calls: dict[int, _PartialToolCall] = {}
        self._usage = Usage()
        self.finish_reason: str | None = None

    def feed_chunk(self, chunk: Any) -> list[StepEvent | ToolArgumentsDelta]:
        """One parsed ``chat.completion.chunk``; returns the live events it carries."""
        if not isinstance(chunk, Mapping):
            raise errors.step_error(errors.MALFORMED_RESPONSE)
        if chunk.get("error") is not None:
            raise errors.classify_stream_error(chunk["error"])
        self._note_common(chunk)
        choice = _first_choice(chunk)
        if choice is None:
            return []
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, Mapping):
            return []
        events: list[StepEvent | ToolArgumentsDelta] = list(_live_events(delta))
        for fragment in _list(delta.get("tool_calls")):
            index, text = self._merge_fragment(fragment)
            if self._live_arguments and text:
                partial = self._calls[index]
                events.append(ToolArgumentsDelta(
                    index, partial.call_id or f"call_{self._step}_{index}", partial.name, text))
        return events

    def feed_completion(self, body: Any) -> list[StepEvent]:
        """A whole non-streaming ``chat.completion``; returns every event, finish included."""
        if not isinstance(body, Mapping):
            raise errors.step_error(errors.MALFORMED_RESPONSE)
        if body.get("error") is not None:
            raise errors.classify_stream_error(body["error"])
        self._note_common(body)
        choice = _first_choice(body)
        if choice is None:
            raise errors.step_error(errors.MALFORMED_RESPONSE)
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
        message = choice.get("message")
        events: list[StepEvent] = []
        if isinstance(message, Mapping):
            events = _live_events(message)
            for position, call in enumerate(_list(message.get("tool_calls"))):
                if isinstance(call, Mapping) and "index" not in call:
                    call = {**call, "index": position}
                self._merge_fragment(call)
        return events + self.finish()

    def finish(self) -> list[StepEvent]:
        """The complete tool calls, in index order, then :class:`StepFinished`."""
        events: list[StepEvent] = [
            ToolCallEmitted(
                ToolCall(
                    call_id=partial.call_id or f"call_{self._step}_{index}",
                    name=partial.name,
                    arguments="".join(partial.arguments),
                )
            )
            for index, partial in sorted(self._calls.items())
        ]
        events.append(
            StepFinished(usage=self._usage, finish_reason=self.finish_reason, model=self._model)
        )
        return events

    def _note_common(self, chunk: Mapping[str, Any]) -> None:
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self._model = chunk["model"]
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            self._usage = _parse_usage(usage)

    def _merge_fragment(self, fragment: Any) -> tuple[int, str]:
        """Merge one fragment; returns its call index and the argument text it carried."""
        if not isinstance(fragment, Mapping):
            raise errors.step_error(errors.MALFORMED_RESPONSE)
        index = fragment.get("index", 0)
        if not isinstance(index, int):
            raise errors.step_error(errors.MALFORMED_RESPONSE)
        partial = self._calls.setdefault(index, _PartialToolCall())
        if isinstance(fragment.get("id"), str) and fragment["id"]:
            partial.call_id = fragment["id"]
        function = fragment.get("function")
        if isinstance(function, Mapping):
            # Names arrive whole in the first fragment; some servers repeat them later.
            if isinstance(function.get("name"), str) and function["name"]:
                partial.name = function["name"]
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                partial.arguments.append(arguments)
                return index, arguments
            if isinstance(arguments, Mapping):
                raise errors.step_error(errors.MALFORMED_RESPONSE)
        return index, ""


def _live_events(delta: Mapping[str, Any]) -> list[StepEvent]:
    events: list[StepEvent] = []
    # Some servers send the same reasoning under both names: take one, never both.
    thinking = delta.get("reasoning_content") or delta.get("reasoning")
    if isinstance(thinking, str) and thinking:
        events.append(ThinkingDelta(thinking))
    content = delta.get("content")
    if isinstance(content, str) and content:
        events.append(TextDelta(content))
    return events


def _first_choice(chunk: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for choice in _list(chunk.get("choices")):
        if isinstance(choice, Mapping) and choice.get("index", 0) == 0:
            return choice
    return None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _parse_usage(usage: Mapping[str, Any]) -> Usage:
    cost = usage.get("cost")
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        cost=float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None,
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
