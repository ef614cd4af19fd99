"""Tool calls as both sides of the boundary see them: capabilities, requests, results.

Pure data: the controller reads these and the backend builds them; nothing here runs a tool.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


class Capability(enum.StrEnum):
    READ = "read"
    WRITE = "write"
    SENSITIVE = "sensitive"
    # A tool that declared nothing: treated as the strictest for fallback purposes.
    UNDECLARED = "undeclared"


class WriteCategory(enum.StrEnum):
    """How a write is guarded (spec: Write tools and side effects)."""

    NONE = "none"  # reads
    MEMBER_STORE = "member_store"  # member-owned store writes: the write guard
    ISOLATED_EXECUTION = "isolated_execution"  # run_code, workspace: the sandbox lease
    EXTERNAL_EFFECT = "external_effect"  # the approval gate under ask_for_writes


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
    # Text in the body addressed to the model (a repair instruction), lifted out by the
    # backend when the call settled: never publishable as the member's answer
    # (``protocol/model_facing.py``).
    model_facing: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return self.outcome not in (ToolOutcome.OK, ToolOutcome.SUPPRESSED)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call as it appears in model history."""

    call_id: str
    name: str
    arguments: str


# --- the chat canvas's vocabulary: what a tool builds, what its payload says instead ------

#: What the model's payload says in place of each item shown on the canvas. Plain words with
#: no quote, backslash or control character, so it appears verbatim in the JSON projection and
#: :func:`withdraw_claims` finds every copy.
ON_SCREEN = "shown on screen to the member; summarize it, do not reproduce it"
PNG_MEDIA_TYPE = "image/png"
MARKDOWN_MEDIA_TYPE = "text/markdown"


def markdown_item(markdown: str, title: str | None = None) -> CanvasItem:
    return CanvasItem(kind="markdown", data=markdown, media_type=MARKDOWN_MEDIA_TYPE,
                      title=title)


def png_item(base64_data: str, alt: str) -> CanvasItem:
    return CanvasItem(kind="image", data=base64_data, media_type=PNG_MEDIA_TYPE, title=alt)
