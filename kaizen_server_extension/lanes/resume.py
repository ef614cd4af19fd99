"""What a crashed run had committed, read back from its journal (crash recovery, R-054).

A run whose holder died (kill -9, lost database) is taken over by whichever replica's lease
check fires first. This module reads the run's durable trace and answers the two questions
the recovery needs:

* which tool calls were dispatched but never settled (each is rebuilt as an error result,
  R-264), and
* what the model had already committed — its tool calls and their results, correction
  reminders, the step numbers and rounds used — so a resumed controller continues after
  them without a second model request for any committed step.

It decides nothing about authority: the lane checks the admission and the dangling calls'
capabilities against the run's frozen catalog before it resumes anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from kaizen_server_extension.protocol.model import ChatMessage
from kaizen_server_extension.protocol.model_facing import ECHO_REMINDER, ECHO_RULE_ID
from kaizen_server_extension.protocol.tools import (
    Capability,
    FailureDomain,
    ToolCall,
    ToolCallResult,
    ToolOutcome,
)
from kaizen_server_extension.runtime.compression import model_bound
from kaizen_server_extension.runtime.port import CorrectionRule, ResumePoint
from kaizen_server_extension.store.records import EventRecord

#: The journal events a recovery reads back.
RECOVERY_EVENTS = ("model.step.started", "tool.requested", "tool.settled",
                   "correction.applied", "answer.committed")

_E = TypeVar("_E", ToolOutcome, Capability, FailureDomain)

INTERRUPTED_CONTENT = ("The server stopped while this call was running; its outcome is "
                       "unknown.")


@dataclass(frozen=True, slots=True)
class DanglingCall:
    """A tool call journaled as requested whose settlement never was."""

    call_id: str
    name: str
    step: int
    #: The marker of the delegated turn that made the call (host/delegation.py), if any.
    delegation: Mapping[str, object] | None = None

    def rebuilt(self, capability: Capability | None) -> dict[str, object]:
        """The ``tool.settled`` data journaled for it: an error with an unknown outcome."""
        data: dict[str, object] = {
            "step": self.step, "call_id": self.call_id, "name": self.name,
            "outcome": ToolOutcome.ERROR.value, "reason": "interrupted", "rebuilt": True,
            "capability": (capability or Capability.UNDECLARED).value,
            "failure_domain": FailureDomain.NONE.value, "content": INTERRUPTED_CONTENT,
            "closes_turn": False}
        if self.delegation is not None:
            data["delegation"] = dict(self.delegation)
        return data


def _delegated(data: Mapping[str, object]) -> Mapping[str, object] | None:
    """The delegation marker of a child turn's event: such events are the child's history,
    not the run's own, and never enter the resumed transcript. A child's call that never
    settled is still a dangling call of the run (its capability decides the recovery)."""
    marker = data.get("delegation")
    return marker if isinstance(marker, Mapping) else None


@dataclass(slots=True)
class _ToolRound:
    step: int
    call_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RunJournal:
    """The recovery's reading of one run's journal."""

    events: tuple[EventRecord, ...]
    steps_started: int
    synthesis_started: bool
    #: The committed final answer, when the crash came between it and the terminal.
    answer: str | None
    dangling: tuple[DanglingCall, ...]
    #: A settled call had closed the turn (the controller was about to fail the run).
    turn_closed: bool

    @classmethod
    def read(cls, events: Iterable[EventRecord]) -> RunJournal:
        ordered = tuple(sorted(events, key=lambda e: e.seq))
        steps = 0
        synthesis = False
        answer: str | None = None
        requested: dict[str, DanglingCall] = {}
        settled: set[str] = set()
        closed = False
        for event in ordered:
            data = event.data
            marker = _delegated(data)
            if marker is not None:
                if event.type == "tool.requested":
                    call_id = str(data.get("call_id", ""))
                    requested[call_id] = DanglingCall(call_id, str(data.get("name", "")),
                                                      _int(data.get("step")), marker)
                elif event.type == "tool.settled":
                    settled.add(str(data.get("call_id", "")))
                continue
            if event.type == "model.step.started":
                steps = max(steps, _int(data.get("step")))
                synthesis = synthesis or bool(data.get("synthesis"))
            elif event.type == "tool.requested":
                call_id = str(data.get("call_id", ""))
                requested[call_id] = DanglingCall(call_id, str(data.get("name", "")),
                                                  _int(data.get("step")))
            elif event.type == "tool.settled":
                settled.add(str(data.get("call_id", "")))
                closed = closed or bool(data.get("closes_turn"))
            elif event.type == "answer.committed":
                answer = str(data.get("text", ""))
        dangling = tuple(c for cid, c in requested.items() if cid not in settled)
        return cls(ordered, steps, synthesis, answer, dangling, closed)

    def resume_point(self, rebuilt: Sequence[dict[str, object]],
                     rules: Sequence[CorrectionRule], *,
                     compress: bool = False) -> ResumePoint | None:
        """The controller's starting point after the committed steps, with the ``rebuilt``
        results of the dangling calls in place of theirs; None when a correction rule the
        run applied is no longer known (the rule set is bound to the run, R-020).
        ``compress``: the run was admitted with tool-result compression."""
        # The built-in echo guard's reminder is server-authored, not an operator rule: it is
        # replayed like one but does not draw from the correction attempts.
        reminders = {ECHO_RULE_ID: ECHO_REMINDER, **{rule.id: rule.reminder for rule in rules}}
        echoes = 0
        blocks: list[_ToolRound | str] = []
        calls: dict[str, ToolCall] = {}
        settled: dict[str, dict[str, object]] = {str(d["call_id"]): d for d in rebuilt}
        corrections = 0
        for event in self.events:
            data = event.data
            if _delegated(data) is not None:
                continue
            if event.type == "tool.requested":
                step = _int(data.get("step"))
                last = blocks[-1] if blocks else None
                if not isinstance(last, _ToolRound) or last.step != step:
                    last = _ToolRound(step)
                    blocks.append(last)
                call_id = str(data.get("call_id", ""))
                last.call_ids.append(call_id)
                calls[call_id] = ToolCall(call_id, str(data.get("name", "")),
                                          _argument_text(data.get("arguments")))
            elif event.type == "tool.settled":
                settled.setdefault(str(data.get("call_id", "")), dict(data))
            elif event.type == "correction.applied":
                rule_id = str(data.get("rule_id", ""))
                reminder = reminders.get(rule_id)
                if reminder is None:
                    return None
                if rule_id == ECHO_RULE_ID:
                    echoes += 1
                else:
                    corrections += 1
                blocks.append(reminder)

        messages: list[ChatMessage] = []
        results: list[ToolCallResult] = []
        rounds = 0
        for block in blocks:
            if isinstance(block, str):
                messages.append(ChatMessage(role="system", content=block))
                continue
            rounds += 1
            round_calls = tuple(calls[cid] for cid in block.call_ids)
            # The text that accompanied the calls was live-only (answer.delta): not durable.
            messages.append(ChatMessage(role="assistant", content="", tool_calls=round_calls))
            for call in round_calls:
                data = settled.get(call.call_id, {})
                result = _result(call, data)
                results.append(result)
                # What the model read when the call settled (compressed if opted in).
                messages.append(ChatMessage(role="tool",
                                            content=model_bound(result, enabled=compress),
                                            tool_call_id=call.call_id, name=call.name))
        return ResumePoint(
            messages=tuple(messages), steps_started=self.steps_started,
            rounds_used=rounds + corrections + echoes, corrections_used=corrections,
            results=tuple(results), required_attempted=bool(calls),
        )


def _result(call: ToolCall, data: dict[str, object]) -> ToolCallResult:
    outcome = _enum(ToolOutcome, data.get("outcome"), ToolOutcome.ERROR)
    content = str(data.get("content", INTERRUPTED_CONTENT))
    capability = _enum(Capability, data.get("capability"), Capability.UNDECLARED)
    return ToolCallResult(
        call_id=call.call_id, name=call.name, outcome=outcome, content=content,
        capability=capability,
        failure_domain=_enum(FailureDomain, data.get("failure_domain"), FailureDomain.NONE),
        # Evidence is not journaled; a completed call with content is the closest reading.
        evidence=outcome is ToolOutcome.OK and bool(content.strip()),
        closes_turn=bool(data.get("closes_turn")),
        may_have_effect=capability is not Capability.READ,
        delegated=bool(data.get("delegated")),
    )


def _argument_text(shown: object) -> str:
    """The journal holds the redacted, bounded arguments (never the raw text): the rebuilt
    history carries those, which is all the model needs to read its own earlier call."""
    if shown is None:
        return "{}"
    if isinstance(shown, str):
        return shown
    return json.dumps(shown, ensure_ascii=False)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _enum(kind: type[_E], value: object, default: _E) -> _E:
    try:
        return kind(str(value))
    except ValueError:
        return default
