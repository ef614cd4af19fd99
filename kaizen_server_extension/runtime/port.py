"""The one narrow port between the untrusted turn controller and the trusted backend.

The controller (``runtime/``) orders model steps and tool requests; it holds no data, secrets,
identity, policy or executors (spec: Runtime pipelines, R-004). Everything consequential goes
through :class:`HostPort`, and every call presents the run's fixed
:class:`~kaizen_server_extension.protocol.AuthorityBundle` so the backend can reject one that
differs in any field (R-006, R-007).

This module holds what only the controller's side needs: the port itself, the run manifest,
budgets and the resume point. The vocabulary both sides share (bundle, tool calls and
results, model steps) is in :mod:`kaizen_server_extension.protocol`; like it, this module
imports nothing else of the package.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.model import ChatMessage, StepEvent, StepSnapshot
from kaizen_server_extension.protocol.tools import (
    AdvertisedTool,
    ToolCallRequest,
    ToolCallResult,
)

# --- Live trace events the controller publishes -----------------------------------------

TraceKind = Literal[
    "model.step.started",
    "answer.delta",
    "thinking.delta",
    "answer.committed",
    "tool.requested",
    "tool.settled",
    "correction.applied",
    "retry.scheduled",
    "protocol.failed",
]


@dataclass(frozen=True, slots=True)
class TraceEvent:
    kind: TraceKind
    data: Mapping[str, Any]


# --- The terminal ---------------------------------------------------------------------


class TerminalStatus(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    ANSWER_UNAVAILABLE = "answer_unavailable"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class TerminalOutcome:
    status: TerminalStatus
    reason: str
    answer: str | None = None


@runtime_checkable
class HostPort(Protocol):
    """The controller's only door to the trusted backend."""

    def model_step(
        self, bundle: AuthorityBundle, snapshot: StepSnapshot
    ) -> AsyncIterator[StepEvent]:
        """Stream one model step. Raises :class:`ModelStepError` on provider failure."""
        ...

    async def call_tool(
        self, bundle: AuthorityBundle, request: ToolCallRequest
    ) -> ToolCallResult:
        """Run one tool call through the guarded pipeline; always returns a settled result
        (or raises :class:`AuthorityRejected` / :class:`RunCancelled`)."""
        ...

    async def publish(self, bundle: AuthorityBundle, event: TraceEvent) -> None:
        """Append a trace event to the room journal (live-only kinds are not stored)."""
        ...

    async def publish_terminal(
        self, bundle: AuthorityBundle, outcome: TerminalOutcome
    ) -> bool:
        """Settle the run by compare-and-set; True only for the one caller that settled it."""
        ...

    async def heartbeat(self, bundle: AuthorityBundle) -> None:
        """Extend the run's lease; raises :class:`RunCancelled` when the run was cancelled."""
        ...


# --- What the backend hands the controller at admission ---------------------------------


@dataclass(frozen=True, slots=True)
class CorrectionRule:
    """An operator-defined literal response pattern and its fixed reminder (already bounded)."""

    id: str
    pattern: str
    reminder: str


#: Staged creation's own protocol allowance (spec: Budgets and the synthesis grant; R-039,
#: R-074): the spec's 52 rounds — ``begin``, 50 maximal ``append`` chunks and ``finalize`` —
#: spent only by rounds that call nothing but the staged artifact protocol, so writing a large
#: artifact does not starve the general tool budget. The draft's byte, sequence, ownership
#: and execution fences are the store's and stay enforced on every one of those calls.
STAGED_PROTOCOL_ROUNDS = 52


@dataclass(frozen=True, slots=True)
class Budgets:
    #: General tool-bearing model rounds (AGENT_LOOP_MAX_CYCLES).
    max_cycles: int = 10
    inactivity_ms: int = 120_000
    max_parallel_tools: int = 1
    correction_max_attempts: int = 1
    # Pre-commit retries of one step for transient or empty provider exchanges.
    max_step_retries: int = 2
    #: Rounds of the staged artifact protocol, not drawn from ``max_cycles``.
    staged_protocol_rounds: int = STAGED_PROTOCOL_ROUNDS


@dataclass(frozen=True, slots=True)
class SynthesisInstructions:
    """Authored once in the Python policy and applied identically on every agent."""

    with_evidence: str
    without_evidence: str
    without_evidence_after_failure: str


@dataclass(frozen=True, slots=True)
class RunManifest:
    """Everything the controller may know about a run, fixed at admission (R-020)."""

    bundle: AuthorityBundle
    context: tuple[ChatMessage, ...]
    catalog: tuple[AdvertisedTool, ...]
    catalog_digest: str
    budgets: Budgets
    synthesis: SynthesisInstructions
    correction_rules: tuple[CorrectionRule, ...] = ()
    required_tool: str | None = None
    # Frozen tools held back behind discovery; revealed only by a result's ``reveals``.
    deferred: tuple[AdvertisedTool, ...] = ()
    # The frozen tools of the staged artifact protocol: a round that calls only these draws
    # from ``budgets.staged_protocol_rounds`` instead of ``budgets.max_cycles``.
    staged_protocol: frozenset[str] = frozenset()
    # The member opted in to tool-result compression when the run was admitted: the model
    # reads run_code's streams compressed (``runtime/compression.py``).
    compress_tool_results: bool = False


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a recovered run continues: what its earlier holder committed, rebuilt from the
    journal by the backend (R-054). The controller appends ``messages`` to the admitted
    context and never asks the model again for a step counted here; the budgets it already
    used stay used."""

    #: Committed assistant tool calls and their results (dangling calls rebuilt as errors),
    #: and any correction reminders, in journal order.
    messages: tuple[ChatMessage, ...] = ()
    #: The highest step number already started: the next step gets the next number.
    steps_started: int = 0
    #: Rounds already used (tool rounds and rejected corrections count, as in the loop).
    rounds_used: int = 0
    corrections_used: int = 0
    #: Settled tool results so far, for the synthesis instruction and the fallback text.
    results: tuple[ToolCallResult, ...] = ()
    #: True once a tool round ran: a pending required tool was attempted (R-305).
    required_attempted: bool = False
