"""In-memory fakes of the pipeline's ports, and a harness that wires a ToolPipeline to them."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from kaizen_server_extension.policy.approvals import (
    ApprovalMode,
    ApprovalReceipt,
    ApprovalStatus,
)
from kaizen_server_extension.policy.guardrails import Guardrail, GuardrailChain
from kaizen_server_extension.policy.task_posture import TaskPostureGate
from kaizen_server_extension.protocol.authority import AuthorityBundle, verify_bundle
from kaizen_server_extension.protocol.tools import (
    Capability,
    ToolCallRequest,
    ToolCallResult,
    ToolOutcome,
    WriteCategory,
)
from kaizen_server_extension.tools.authorization import CallAuthorization
from kaizen_server_extension.tools.ledger import TurnLedger
from kaizen_server_extension.tools.metrics import ToolMetrics
from kaizen_server_extension.tools.pipeline import ToolPipeline
from kaizen_server_extension.tools.ports import (
    ApprovalModeResolver,
    ArgumentValidator,
    AuthorityCheck,
)
from kaizen_server_extension.tools.types import RegisteredTool, RoomClass, ToolDescriptor

BUNDLE = AuthorityBundle(
    run_id="run-1", conversation_id="conv-1", input_position=3, member="alice",
    agent_version_id="agent-v1", audience_version=2, resource_digest="res-digest", fence=7,
)

Impl = Callable[[Mapping[str, Any]], Awaitable[object]]


def make_tool(
    name: str,
    impl: Impl,
    *,
    capability: Capability = Capability.READ,
    write_category: WriteCategory = WriteCategory.NONE,
    room_class: RoomClass = RoomClass.AUDIENCE_SAFE_READ,
    **descriptor: Any,
) -> RegisteredTool:
    return RegisteredTool(
        ToolDescriptor(name=name, description=f"{name} for tests",
                       input_schema={"type": "object"}, capability=capability,
                       write_category=write_category, room_class=room_class, **descriptor),
        impl,
    )


def returning(value: object) -> Impl:
    async def impl(arguments: Mapping[str, Any]) -> object:
        return value

    return impl


def raising(exc: BaseException) -> Impl:
    async def impl(arguments: Mapping[str, Any]) -> object:
        raise exc

    return impl


def json_object(descriptor: ToolDescriptor, raw: str, /) -> Mapping[str, Any]:
    value = json.loads(raw) if raw.strip() else {}
    if not isinstance(value, dict):
        raise ValueError("arguments must be a JSON object")
    return value


@dataclass(frozen=True, slots=True)
class FixedBundleAuthority:
    """Accepts only the bundle the run was admitted with, field for field (R-007); reads no
    call facts."""

    admitted: AuthorityBundle

    async def verify(self, bundle: AuthorityBundle, prefetched: object = None) -> None:
        verify_bundle(self.admitted, bundle)


@dataclass(frozen=True, slots=True)
class FixedApprovalMode:
    mode: ApprovalMode

    async def mode_for(self, member: str, facts: object = None) -> ApprovalMode:
        return self.mode


@dataclass
class Permissions:
    revoked: set[str] = field(default_factory=set)
    calls: int = 0

    async def allowed(self, member: str, tool_name: str, facts: object = None) -> bool:
        self.calls += 1
        return tool_name not in self.revoked


@dataclass
class _Approval:
    approval_id: str
    run_id: str
    digest: str
    tool: str
    redacted_args: Mapping[str, Any]
    status: ApprovalStatus = ApprovalStatus.PENDING


@dataclass
class Approvals:
    """Approval records with the store's compare-and-set semantics."""

    records: list[_Approval] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    async def find_receipt(self, run_id: str, call_digest: str) -> ApprovalReceipt | None:
        for record in reversed(self.records):
            if record.run_id == run_id and record.digest == call_digest:
                return ApprovalReceipt(record.approval_id, record.status)
        return None

    async def request(self, run_id: str, bundle: AuthorityBundle, tool: str, args_digest: str,
                      redacted_args: Mapping[str, Any]) -> str:
        approval_id = f"appr-{next(self._ids)}"
        self.records.append(_Approval(approval_id, run_id, args_digest, tool, redacted_args))
        return approval_id

    async def consume_receipt(self, run_id: str, approval_id: str) -> bool:
        for record in self.records:
            if record.approval_id == approval_id and record.status is ApprovalStatus.APPROVED:
                record.status = ApprovalStatus.CONSUMED
                return True
        return False

    def decide(self, approval_id: str, status: ApprovalStatus) -> None:
        next(r for r in self.records if r.approval_id == approval_id).status = status


@dataclass
class Audit:
    entries: list[tuple[str, ToolOutcome, object]] = field(default_factory=list)
    # What authorized each entry's call, in the same order (None: it never ran).
    authorizations: list[CallAuthorization | None] = field(default_factory=list)

    async def record_tool_call(self, bundle: AuthorityBundle, request: ToolCallRequest,
                               outcome: ToolOutcome, raw: object,
                               authorization: CallAuthorization | None = None) -> None:
        self.entries.append((request.name, outcome, raw))
        self.authorizations.append(authorization)


@dataclass
class Roster:
    only_initiator: bool = True

    async def __call__(self, bundle: AuthorityBundle, facts: object = None, /) -> bool:
        return self.only_initiator


@dataclass
class Harness:
    pipeline: ToolPipeline
    tools: dict[str, RegisteredTool]
    permissions: Permissions
    approvals: Approvals | None
    audit: Audit
    roster: Roster
    registry: CollectorRegistry
    executed: list[str]
    cancelled: asyncio.Event
    _calls: itertools.count[int] = field(default_factory=itertools.count)

    async def call(self, name: str, arguments: str = "{}", *, step: int = 1,
                   bundle: AuthorityBundle = BUNDLE) -> ToolCallResult:
        request = ToolCallRequest(f"call-{next(self._calls)}", name, arguments, step)
        return await self.pipeline.run(bundle, request)

    def count(self, tool: str, capability: str, outcome: str) -> float:
        value = self.registry.get_sample_value(
            "kaizen_tool_invocations_total",
            {"tool": tool, "capability": capability, "outcome": outcome})
        return value or 0.0


def harness(
    *tools: RegisteredTool,
    ceiling: list[str] | None = None,
    mode: ApprovalMode = ApprovalMode.ASK_FOR_WRITES,
    approvals: bool = True,
    guardrails: list[Guardrail] | None = None,
    ledger: TurnLedger | None = None,
    projection_limit: int = 16_000,
    validator: ArgumentValidator | None = json_object,
    modes: ApprovalModeResolver | None = None,
    authority: AuthorityCheck | None = None,
    task_posture: TaskPostureGate | None = None,
) -> Harness:
    """A pipeline over in-memory ports; ``validator=None`` keeps the pipeline's default (the
    schema module's)."""
    executed: list[str] = []

    async def executor(tool: RegisteredTool, bundle: AuthorityBundle,
                       arguments: Mapping[str, Any], /) -> object:
        executed.append(tool.descriptor.name)
        return await tool.impl(arguments)

    by_name = {t.descriptor.name: t for t in tools}
    permissions, audit, roster = Permissions(), Audit(), Roster()
    store = Approvals() if approvals else None
    registry = CollectorRegistry()
    cancelled = asyncio.Event()
    pipeline = ToolPipeline(
        tools=by_name,
        ceiling=ceiling if ceiling is not None else list(by_name),
        authority=authority if authority is not None else FixedBundleAuthority(BUNDLE),
        permissions=permissions,
        approval_modes=modes if modes is not None else FixedApprovalMode(mode),
        approvals=store,
        executor=executor,
        roster_is_only_initiator=roster,
        audit=audit,
        guardrails=GuardrailChain(guardrails or ()),
        ledger=ledger,
        metrics=ToolMetrics(registry),
        projection_limit=projection_limit,
        cancelled=cancelled,
        task_posture=task_posture,
        **({"validator": validator} if validator is not None else {}),
    )
    return Harness(pipeline, by_name, permissions, store, audit, roster, registry, executed,
                   cancelled)
