"""The one narrow port between the untrusted turn controller and the trusted backend.

The controller (``runtime/``) orders model steps and tool requests; it holds no data, secrets,
identity, policy or executors (spec: Runtime pipelines, R-004). Everything consequential goes
through :class:`HostPort`, and every call presents the run's fixed :class:`AuthorityBundle`
so the backend can reject one that differs in any field (R-006, R-007).

This module is pure: dataclasses, enums and a Protocol. It imports nothing from the rest of
the package, so both sides can depend on it.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class AuthorityBundle:
    """Fixed at admission; presented unchanged by every later call of the run (R-006)."""

    run_id: str
    conversation_id: str
    input_position: int
    member: str
    agent_version_id: str
    audience_version: int
    resource_digest: str
    fence: int

    def differing_fields(self, other: AuthorityBundle) -> list[str]:
        """Names of the fields where ``other`` differs: any one means rejection."""
        return [
            name
            for name in self.__slots__
            if getattr(self, name) != getattr(other, name)
        ]


class Capability(enum.StrEnum):
    READ = "read"
    WRITE = "write"
    SENSITIVE = "sensitive"
    # A tool that declared nothing: treated as the strictest for fallback purposes.
    UNDECLARED = "undeclared"


class ToolOutcome(enum.StrEnum):
    """Exactly one per invocation (API.md ``tool.settled``)."""

    OK = "ok"
    ERROR = "error"
    RAISED = "raised"
    TIMEOUT = "timeout"
    ABANDONED = "abandoned"
    SUPPRESSED = "suppressed"


class FailureDomain(enum.StrEnum):
    """Whose failure it was (spec: Whose failure it was)."""

    NONE = "none"
    TOOL = "tool"  # the tool could not do its job: counts towards its health
    CALLER = "caller"  # relayed caller failure (a user program's traceback): never counts


#: The staged artifact protocol's group name (``ToolDescriptor.protocol_group``).
STAGED_PROTOCOL_GROUP = "staged_artifact"

#: The staged artifact protocol's four operations, by their reserved built-in names (the same
#: set as ``tools/manifest.py: STAGED_ARTIFACT_TOOLS``, which the tests hold equal). The
#: controller needs the names even when the agent was never granted the protocol: a step that
#: asks for one it was not offered is a protocol failure, not an ordinary unknown tool (R-252).
STAGED_PROTOCOL_OPERATIONS: frozenset[str] = frozenset(
    {"begin_artifact", "append_artifact", "finalize_artifact", "discard_artifact"}
)


class ProtocolFailure(enum.StrEnum):
    """Why a multi-call protocol stopped an attempt: typed and machine-readable (R-252).

    It is journaled as ``denied`` on the refused call's ``tool.settled``, as ``reason`` on
    the attempt's one ``protocol.failed`` event and as the run's terminal reason."""

    #: A step asked for a staged artifact operation its advertisement did not offer: the
    #: protocol is absent from the frozen catalog, or the step was narrowed (required tool,
    #: the tool-less synthesis step). Typically a stale captured step still writing a draft.
    STAGED_PROTOCOL_UNAVAILABLE = "staged_protocol_unavailable"


@dataclass(frozen=True, slots=True)
class AdvertisedTool:
    """One entry of the frozen catalog as the model sees it (bounds ≥ 2000 already stripped)."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    capability: Capability


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """A tool call the model asked for. ``arguments`` is the raw JSON text, byte for byte."""

    call_id: str
    name: str
    arguments: str
    step: int
    #: Set by the controller for a call its step was never offered (R-252): the backend
    #: settles it denied with this reason and runs nothing. A refusal can only stop a call,
    #: never admit one, so an untrusted controller gains nothing by setting it.
    refused: ProtocolFailure | None = None


@dataclass(frozen=True, slots=True)
class StoredFile:
    """A durable native file a call stored for one of its declared output targets (R-236).

    Trusted: the backend builds it from what the artifact store returned, never from the
    model-facing text, and journals it on ``tool.settled`` so the member surface can morph the
    call's generation placeholder for ``target`` into this exact stored version."""

    target: str
    artifact_id: str
    version: int
    filename: str
    media_type: str


@dataclass(frozen=True, slots=True)
class CanvasItem:
    """One piece of rich output a call moved out of the model's payload onto the chat canvas
    (spec: A dropped canvas retracts its own claim; R-277).

    Trusted: the tool's own backend code builds it from its output (show_chat_canvas's
    Markdown, the PNG images a run_code program displayed), never from model-facing text; the
    payload carries an on-screen marker in its place. The backend validates and bounds it
    before it journals it on ``tool.settled`` (``tools/canvas.py``)."""

    kind: Literal["markdown", "image"]
    #: The Markdown source, or the image's bytes in base64.
    data: str
    #: ``text/markdown``, or the image's type (only ``image/png`` is shown).
    media_type: str = "text/markdown"
    #: The heading of a Markdown canvas; the alternative text of an image.
    title: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCallResult:
    """What the backend hands back: a bounded, member-safe projection, never raw output."""

    call_id: str
    name: str
    outcome: ToolOutcome
    content: str
    capability: Capability = Capability.UNDECLARED
    failure_domain: FailureDomain = FailureDomain.NONE
    # True when the call produced evidence the synthesis step can use.
    evidence: bool = False
    # True when the turn must close now (ambiguous write, policy block, tool cut off...).
    closes_turn: bool = False
    close_reason: str | None = None
    # True when the call might have changed something (write/sensitive/undeclared/delegation).
    may_have_effect: bool = False
    delegated: bool = False
    # Deferred catalog tools the backend made callable from the next step (tool discovery).
    reveals: tuple[str, ...] = ()
    # The operator reference of a failed write: the same one ends the WARNING, the audit row
    # and the member's answer. Opaque; never carries failure text.
    reference: str | None = None
    # The durable files the call stored for its declared targets (run_code), as the tool's
    # trusted body reported them; a declared target with no entry was not produced.
    files: tuple[StoredFile, ...] = ()
    # Rich output shown on the chat canvas instead of handed to the model; the content holds
    # one on-screen marker per item. Dropped, markers withdrawn, when it cannot be shown
    #
    canvas: tuple[CanvasItem, ...] = ()
    # Set when the call was refused before anything ran because its protocol was not
    # callable on that step; journaled as ``denied`` on ``tool.settled``.
    denied: ProtocolFailure | None = None

    @property
    def failed(self) -> bool:
        return self.outcome not in (ToolOutcome.OK, ToolOutcome.SUPPRESSED)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call as it appears in model history."""

    call_id: str
    name: str
    arguments: str


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


class AuthorityRejected(Exception):
    """The backend refused a call whose bundle differs from the admitted one (R-007)."""

    def __init__(self, fields: Sequence[str]) -> None:
        super().__init__("authority bundle mismatch: " + ", ".join(fields))
        self.fields = tuple(fields)


class RunCancelled(Exception):
    """The run was cancelled (member stop or inactivity budget); nothing more is settled."""


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
