"""The trusted side of Kaizen's own MCP endpoint (opt-in, docs/mcp.md "Kaizen as an MCP server").

An external agent authenticated as a Jupyter member may list and call that member's **read**
tools. Such a call belongs to no run, so its authority is the member alone: every call builds
a :class:`ToolPipeline` whose authority check re-verifies the bundle it was given for the
authenticated member and re-reads the member's settings, and then runs the same steps as a
run's call — the member's permission re-resolved (admin policy and the Jupyter authorizer),
the ceiling (only the served read tools), the room check, argument validation against the
tool's schema, the guardrail chain, the timeout, outcome classification, the bounded and
redacted projection, and an audit row (``via: mcp_server``). No write is served, so the
approval gate never needs a member who is not there.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kaizen_server_extension.host.store_ports import StoreApprovalModes, StorePermissions
from kaizen_server_extension.host.tool_backend import PipelineToolBackend, RunToolContext
from kaizen_server_extension.protocol.authority import AuthorityBundle, verify_bundle
from kaizen_server_extension.protocol.tools import (
    Capability,
    ToolCallRequest,
    ToolCallResult,
    ToolOutcome,
    WriteCategory,
)
from kaizen_server_extension.store.core import audit_insert
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.tools.authorization import CallAuthorization
from kaizen_server_extension.tools.pipeline import ToolPipeline
from kaizen_server_extension.tools.ports import CallFactsView
from kaizen_server_extension.tools.settlement import delegates
from kaizen_server_extension.tools.types import RegisteredTool, RoomClass, ToolDescriptor

#: Surfaces whose read tools only make sense inside a run (its chat canvas, its catalog).
RUN_ONLY_SURFACES = frozenset({"presentation", "discovery"})
#: The audit marker of a call that came through Kaizen's MCP endpoint.
VIA = "mcp_server"


def servable(descriptor: ToolDescriptor) -> bool:
    """A plain read that needs no run: declared read, no write category, offered by default
    (not grant-only), needing no other tool beside it in a run (request_document), allowed in
    a private turn, not a run-only presentation tool, and not a delegation (another agent's
    turn runs inside a run's authority, host/delegation.py)."""
    return (descriptor.capability is Capability.READ
            and not delegates(descriptor)
            and descriptor.write_category is WriteCategory.NONE
            and not descriptor.explicit_grant_only
            and not descriptor.requires_tools
            and descriptor.room_class is not RoomClass.UNKNOWN
            and descriptor.surface not in RUN_ONLY_SURFACES)


@dataclass(frozen=True, slots=True)
class MemberFacts:
    """A served call's facts: the member, read now; no run, no room but the member's own."""

    member: str
    approval_mode: str
    only_initiator: bool = True

    def allowed(self, tool: str) -> bool | None:
        return None  # read by the permission check itself, on every call

    def granted(self, tool: str) -> bool | None:
        return None

    def grant_approval(self, tool: str) -> str | None:
        return None


class MemberAuthority:
    """The authority of a call outside any run: exactly the bundle minted for the
    authenticated member of this request (R-007), whose settings are read afresh."""

    def __init__(self, store: Store, admitted: AuthorityBundle) -> None:
        self._store = store
        self._admitted = admitted

    async def verify(self, bundle: AuthorityBundle,
                     prefetched: CallFactsView | None = None) -> MemberFacts:
        verify_bundle(self._admitted, bundle)
        record = await self._store.members.get(bundle.member)
        return MemberFacts(bundle.member,
                           record.approval_mode if record else "ask_for_writes")


class ServedAudit:
    """Each served call's audit row, outside any conversation, marked as served."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def record_tool_call(self, bundle: AuthorityBundle, request: ToolCallRequest,
                               outcome: ToolOutcome, raw: object,
                               authorization: CallAuthorization | None = None) -> None:
        await self._store.run(audit_insert(bundle.member, "tool.call", {
            "tool": request.name, "call_id": request.call_id, "outcome": outcome.value,
            "via": VIA, "authorization": (None if authorization is None
                                          else authorization.audit())}))


class NoApprovals:
    """No member is there to decide: a call that would need a decision fails closed."""

    async def find_receipt(self, run_id: str, call_digest: str) -> None:
        raise RuntimeError("approvals are not available to served calls")

    async def request(self, *args: Any, **kwargs: Any) -> str:
        raise RuntimeError("approvals are not available to served calls")

    async def consume_receipt(self, run_id: str, approval_id: str) -> bool:
        return False


class McpServedTools:
    """What Kaizen's MCP endpoint lists and calls, for one authenticated member at a time."""

    def __init__(self, backend: PipelineToolBackend) -> None:
        self._backend = backend
        self._tools = {t.descriptor.name: t for t in backend.registry if servable(t.descriptor)}

    @property
    def permissions(self) -> StorePermissions:
        return self._backend.permissions

    async def listed(self, member: str) -> list[ToolDescriptor]:
        """The served tools ``member`` may use now (admin policy and authorizer)."""
        return [t.descriptor for name, t in sorted(self._tools.items())
                if await self.permissions.allowed(member, name)]

    async def call(self, member: str, name: str, arguments: str) -> ToolCallResult:
        """One call through a fresh pipeline under ``member``'s own authority."""
        bundle = AuthorityBundle(
            run_id=f"mcp-{uuid.uuid4().hex}", conversation_id="", input_position=0,
            member=member, agent_version_id="", audience_version=0, resource_digest="",
            fence=0)
        backend = self._backend
        services = backend.member_services()

        async def execute(tool: RegisteredTool, run_bundle: AuthorityBundle,
                          args: Mapping[str, Any], /) -> object:
            return await tool.impl(RunToolContext(run_bundle, services), **args)

        async def only_member(run_bundle: AuthorityBundle,
                              facts: CallFactsView | None = None, /) -> bool:
            return True  # no room: the caller is the only one who sees the result

        pipeline = ToolPipeline(
            tools=self._tools, ceiling=tuple(self._tools),
            authority=MemberAuthority(backend.store, bundle),
            permissions=backend.permissions,
            approval_modes=StoreApprovalModes(backend.store),
            approvals=NoApprovals(),
            executor=execute,
            roster_is_only_initiator=only_member,
            audit=ServedAudit(backend.store),
            metrics=backend.metrics,
            guardrails=backend.guardrails,
        )
        request = ToolCallRequest(call_id=f"mcp-{uuid.uuid4().hex[:12]}", name=name,
                                  arguments=arguments, step=0)
        return await pipeline.run(bundle, request)
