"""A scripted, in-memory HostPort for controller tests.

Each model step pops the next script: a list of items that are streamed in order. An item is a
:data:`StepEvent`, or one of the directives below (raise, hang, advance the fake clock). Tool
calls are answered by per-tool handlers. Everything the controller hands over is recorded:
every bundle, every snapshot object, every trace event, every terminal proposal.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.model import (
    ChatMessage,
    StepEvent,
    StepFinished,
    StepSnapshot,
    TextDelta,
    ToolCallEmitted,
    Usage,
)
from kaizen_server_extension.protocol.tools import (
    AdvertisedTool,
    Capability,
    FailureDomain,
    ProtocolFailure,
    ToolCall,
    ToolCallRequest,
    ToolCallResult,
    ToolOutcome,
)
from kaizen_server_extension.runtime.controller import TurnController
from kaizen_server_extension.runtime.port import (
    Budgets,
    RunManifest,
    SynthesisInstructions,
    TerminalOutcome,
    TraceEvent,
)


@dataclass(frozen=True)
class Raise:
    error: BaseException


@dataclass(frozen=True)
class Hang:
    """Never yields again (until cancelled)."""


@dataclass(frozen=True)
class Advance:
    """Move the fake clock forward before the next item."""

    seconds: float


Item = StepEvent | Raise | Hang | Advance
ToolHandler = Callable[[ToolCallRequest], Awaitable[ToolCallResult]]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


BUNDLE = AuthorityBundle(
    run_id="run-1",
    conversation_id="conv-1",
    input_position=3,
    member="alice",
    agent_version_id="agent-v7",
    audience_version=2,
    resource_digest="sha256:abc",
    fence=5,
)

SYNTHESIS = SynthesisInstructions(
    with_evidence="SYNTH-WITH-EVIDENCE",
    without_evidence="SYNTH-WITHOUT-EVIDENCE",
    without_evidence_after_failure="SYNTH-AFTER-FAILURE",
)


def tool(name: str, capability: Capability = Capability.READ) -> AdvertisedTool:
    return AdvertisedTool(
        name=name, description=f"{name} tool", parameters={}, capability=capability
    )


CATALOG = (tool("search_docs"), tool("tool_search"), tool("write_note", Capability.WRITE))


def manifest(**overrides: Any) -> RunManifest:
    budgets = overrides.pop("budgets", Budgets())
    values: dict[str, Any] = {
        "bundle": BUNDLE,
        "context": (ChatMessage("system", "You are helpful."), ChatMessage("user", "Hi?")),
        "catalog": CATALOG,
        "catalog_digest": "sha256:catalog",
        "budgets": budgets,
        "synthesis": SYNTHESIS,
    }
    values.update(overrides)
    return RunManifest(**values)


# --- script helpers ---------------------------------------------------------------------


def finished(model: str = "fake-model", prompt: int = 10, completion: int = 5) -> StepFinished:
    return StepFinished(usage=Usage(prompt, completion), finish_reason="stop", model=model)


def say(*chunks: str) -> list[Item]:
    return [*(TextDelta(c) for c in chunks), finished()]


def call(call_id: str, name: str, arguments: str = "{}") -> ToolCallEmitted:
    return ToolCallEmitted(ToolCall(call_id, name, arguments))


def calls(*pairs: tuple[str, str]) -> list[Item]:
    return [*(call(cid, name) for cid, name in pairs), finished()]


def result(
    request: ToolCallRequest,
    outcome: ToolOutcome = ToolOutcome.OK,
    **kwargs: Any,
) -> ToolCallResult:
    kwargs.setdefault("content", f"result of {request.call_id}")
    kwargs.setdefault("capability", Capability.READ)
    return ToolCallResult(call_id=request.call_id, name=request.name, outcome=outcome, **kwargs)


def returns(
    outcome: ToolOutcome = ToolOutcome.OK, delay: float = 0.0, **kwargs: Any
) -> ToolHandler:
    async def handler(request: ToolCallRequest) -> ToolCallResult:
        if delay:
            await asyncio.sleep(delay)
        return result(request, outcome, **kwargs)

    return handler


def refuses(reason: ProtocolFailure) -> ToolHandler:
    """What the trusted pipeline settles for a call the controller marked ``refused``: a
    turn-closing denial with the typed reason, nothing run (R-252)."""
    async def handler(request: ToolCallRequest) -> ToolCallResult:
        return result(request, ToolOutcome.ERROR, content="That artifact step was not run.",
                      capability=Capability.WRITE, failure_domain=FailureDomain.CALLER,
                      closes_turn=True, close_reason=reason.value, denied=reason)

    return handler


def raises(error: BaseException) -> ToolHandler:
    async def handler(request: ToolCallRequest) -> ToolCallResult:
        raise error

    return handler


# --- the fake ---------------------------------------------------------------------------


@dataclass
class FakeHost:
    steps: Sequence[Sequence[Item]]
    tools: dict[str, ToolHandler] = field(default_factory=dict)
    clock: FakeClock = field(default_factory=FakeClock)
    terminal_accepts: bool = True
    heartbeat_error: BaseException | None = None

    bundles: list[tuple[str, AuthorityBundle]] = field(default_factory=list)
    snapshots: list[StepSnapshot] = field(default_factory=list)
    traces: list[TraceEvent] = field(default_factory=list)
    terminals: list[TerminalOutcome] = field(default_factory=list)
    requests: list[ToolCallRequest] = field(default_factory=list)
    heartbeats: int = 0
    # An ordered log of what happened, for ordering assertions.
    log: list[str] = field(default_factory=list)
    active_tools: int = 0
    max_active_tools: int = 0
    cancelled_tools: int = 0

    def __post_init__(self) -> None:
        #: The scripts not yet consumed by a model step.
        self.remaining: list[Sequence[Item]] = list(self.steps)

    # HostPort -----------------------------------------------------------------------

    def model_step(
        self, bundle: AuthorityBundle, snapshot: StepSnapshot
    ) -> AsyncIterator[StepEvent]:
        self.bundles.append(("model_step", bundle))
        self.snapshots.append(snapshot)
        self.log.append(f"model_step:{snapshot.step}")
        if not self.remaining:
            raise AssertionError(f"unscripted model step {snapshot.step}")
        return self._stream(self.remaining.pop(0))

    async def _stream(self, items: Sequence[Item]) -> AsyncIterator[StepEvent]:
        for item in items:
            await asyncio.sleep(0)
            if isinstance(item, Raise):
                raise item.error
            if isinstance(item, Hang):
                await asyncio.Event().wait()
            elif isinstance(item, Advance):
                self.clock.now += item.seconds
            else:
                self.log.append(f"yield:{type(item).__name__}")
                yield item

    async def call_tool(self, bundle: AuthorityBundle, request: ToolCallRequest) -> ToolCallResult:
        self.bundles.append(("call_tool", bundle))
        self.requests.append(request)
        self.log.append(f"call_tool:{request.call_id}")
        handler = self.tools.get(request.name, returns())
        if request.refused is not None:
            handler = refuses(request.refused)  # the backend honours every refusal
        self.active_tools += 1
        self.max_active_tools = max(self.max_active_tools, self.active_tools)
        try:
            return await handler(request)
        except asyncio.CancelledError:
            self.cancelled_tools += 1
            raise
        finally:
            self.active_tools -= 1

    async def publish(self, bundle: AuthorityBundle, event: TraceEvent) -> None:
        self.bundles.append(("publish", bundle))
        self.traces.append(event)
        self.log.append(f"publish:{event.kind}")

    async def publish_terminal(self, bundle: AuthorityBundle, outcome: TerminalOutcome) -> bool:
        self.bundles.append(("publish_terminal", bundle))
        self.terminals.append(outcome)
        self.log.append("publish_terminal")
        return self.terminal_accepts and len(self.terminals) == 1

    async def heartbeat(self, bundle: AuthorityBundle) -> None:
        self.bundles.append(("heartbeat", bundle))
        self.heartbeats += 1
        if self.heartbeat_error is not None:
            raise self.heartbeat_error

    # Views ---------------------------------------------------------------------------

    def kinds(self) -> list[str]:
        return [t.kind for t in self.traces]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [dict(t.data) for t in self.traces if t.kind == kind]

    def published_text(self) -> str:
        """Everything a member could have seen: every trace value and terminal."""
        parts = [repr(dict(t.data)) for t in self.traces]
        parts += [repr(t) for t in self.terminals]
        return "\n".join(parts)


async def drive(host: FakeHost, **overrides: Any) -> TerminalOutcome:
    """Run one controller over ``host`` with a manifest built from ``overrides``."""
    controller = TurnController(host, manifest(**overrides), clock=host.clock)
    return await controller.run()
