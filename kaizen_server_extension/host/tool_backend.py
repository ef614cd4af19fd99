"""The tool side of a run: freeze the catalog at admission, run calls through the pipeline.

This is where the registry, the guarded pipeline and the store-backed ports meet. The
controller sees only ``HostPort.call_tool``; everything here runs in the trusted backend.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kaizen_server_extension.agents import UNSCOPED, KnowledgeScope
from kaizen_server_extension.host.run_host import ToolCaller
from kaizen_server_extension.host.store_ports import (
    StoreApprovalModes,
    StoreApprovals,
    StoreAudit,
    StoreAuthority,
    StorePermissions,
    StoreResourceAuthorization,
    artifact_services,
)
from kaizen_server_extension.host.task_tools import TaskTools
from kaizen_server_extension.models.profiles import FULL, PromptProfile
from kaizen_server_extension.policy.approvals import ApprovalReceipt
from kaizen_server_extension.policy.errors import ApprovalPending, CredentialPending
from kaizen_server_extension.policy.guardrails import GuardrailChain
from kaizen_server_extension.policy.prompt_attachments import (
    AttachmentFacts,
    ResolvedAttachments,
    has_tokens,
    resolve,
    tokens_in,
)
from kaizen_server_extension.policy.task_posture import TaskPostureGate
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.errors import MemberSafeError, RunCancelled
from kaizen_server_extension.protocol.tools import (
    AdvertisedTool,
    Capability,
    ToolCallRequest,
    ToolCallResult,
    ToolOutcome,
)
from kaizen_server_extension.resources import NO_RESOURCES, AdmittedResources
from kaizen_server_extension.settings import OPENAPI_SOURCES_SERVICE
from kaizen_server_extension.store.credential_requests import (
    SETTLED_BY_SERVER,
    CredentialRequests,
    RequestClosed,
)
from kaizen_server_extension.store.documents import DocumentStore
from kaizen_server_extension.store.hashline_state import StoredWorkspaceState
from kaizen_server_extension.store.history import HistorySearch
from kaizen_server_extension.store.records import AgentRecord, ConversationRecord
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.store.tasks import TaskStore
from kaizen_server_extension.store.tool_choices import ToolChoices, left_out
from kaizen_server_extension.tools.canvas import without_canvas
from kaizen_server_extension.tools.catalog import FrozenCatalog, freeze_catalog
from kaizen_server_extension.tools.discovery import TOOL_SEARCH_NAME
from kaizen_server_extension.tools.mcp_sources import (
    NOTHING_DISCOVERED,
    SESSIONS_SERVICE,
    McpSources,
    RunSessions,
)
from kaizen_server_extension.tools.metrics import ToolMetrics
from kaizen_server_extension.tools.pipeline import ToolPipeline
from kaizen_server_extension.tools.ports import CallFactsView, CallScope
from kaizen_server_extension.tools.registry import ToolRegistry
from kaizen_server_extension.tools.services import AgentDelegation, ToolServices
from kaizen_server_extension.tools.settlement import delegates
from kaizen_server_extension.tools.source_catalog import SOURCE_CATALOG_NAME
from kaizen_server_extension.tools.types import (
    SOURCES_ROOT,
    Discovered,
    RegisteredTool,
    ToolDescriptor,
)

if TYPE_CHECKING:  # loaded only when the feature is on (app.py)
    from kaizen_server_extension.tools.openapi_sources import OpenApiSources

log = logging.getLogger("kaizen.tools")

#: How often a waiting call looks at its approval row; decisions also arrive over REST in
#: another process, so the row, not an in-process signal, is the authority.
APPROVAL_POLL_S = 0.25
#: Server-authored routing grants by agent mode (R-307), under a prompt profile that routes
#: specialists (a small model's): a Search-mode agent's turn calls ``search`` on its first
#: step, so its answer rests on retrieved evidence rather than the model's recollection.
#: Visibility and order only: the tool must already be in the agent's frozen catalog.
ROUTED_FIRST_TOOL: dict[str, str] = {"search": "search"}


@dataclass(frozen=True, slots=True)
class FrozenTools:
    """What the tool backend froze for one run (digest-bound, R-020)."""

    advertised: tuple[AdvertisedTool, ...]
    digest: str
    required_tool: str | None
    # The backend's own frozen catalog, handed back to it when the run's caller is built.
    catalog: object = None
    # Held back behind tool discovery until a search reveals them.
    deferred: tuple[AdvertisedTool, ...] = ()
    # The turn's attached files, pinned at acceptance and bound into the bundle's resource
    # digest at admission; run_code projects exactly these.
    resources: AdmittedResources = NO_RESOURCES
    # The agent version's knowledge scope: the retrieval tools intersect it with the
    # member's access at every call. Bound into the resource digest with the agent version.
    knowledge_scope: KnowledgeScope = UNSCOPED

    # Per frozen tool, the arguments observers never see (``tool(withheld_arguments=)``).
    withheld_arguments: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    # The run's source tools (MCP servers) by name, discovered at admission for this run only:
    # never registered server-wide, so no other run can reach them.
    sources: Mapping[str, RegisteredTool] = dataclasses.field(default_factory=dict)
    # True for the tools of a delegated turn inside the run (host/delegation.py), narrowed
    # from the run's own.
    delegated: bool = False

    def declared(self, name: str) -> ToolDescriptor | None:
        """The frozen catalog's declaration of ``name``, or None when it has no such tool."""
        return self.catalog.descriptors.get(name) if isinstance(self.catalog, FrozenCatalog) \
            else None

    @property
    def read_tools(self) -> frozenset[str]:
        """The frozen tools that only read (advertised or deferred)."""
        return frozenset(tool.name for tool in (*self.advertised, *self.deferred)
                         if tool.capability is Capability.READ)


@dataclass
class RunToolContext:
    """What a tool implementation sees: the member it acts for and the run's services."""

    bundle: AuthorityBundle
    services: ToolServices = field(default_factory=ToolServices)

    @property
    def member(self) -> str:
        return self.bundle.member


@dataclass(frozen=True)
class BridgeBinding:
    """What a kernel's ``tools.call`` may reach during one run_code call: the run's own
    guarded caller, with the run's bundle, limited to the catalog's read tools."""

    bundle: AuthorityBundle
    call: ToolCaller
    read_tools: Mapping[str, Capability]

    async def dispatch(self, name: str, arguments: Mapping[str, Any]) -> Any:
        """The tool's member-safe projection, parsed; a failed call raises into the kernel's
        ``tools.call`` as a ``ToolCallError`` carrying the projection's text."""
        request = ToolCallRequest(call_id=f"bridge-{uuid.uuid4().hex[:12]}", name=name,
                                  arguments=json.dumps(dict(arguments)), step=0)
        # Kernel code's calls put nothing on the chat canvas, so nothing of theirs may claim
        # to be on screen.
        result = without_canvas(await self.call(self.bundle, request))
        if result.failed:
            raise MemberSafeError(result.content, code=f"tool_{result.outcome.value}")
        try:
            return json.loads(result.content)
        except ValueError:
            return result.content


class LeaseReleasingApprovals:
    """The approvals port of one run: before a request is persisted (and so can become
    approvable) the member's sandbox affinity worker for the conversation is released (R-239).

    This is the one place it happens: every call that needs a decision, run_code or any other
    tool, passes through ``request``. A release that fails leaves no request behind, so the
    pipeline fails the call closed as "approvals unavailable" rather than ask with a live
    lease."""

    def __init__(self, approvals: StoreApprovals, run_code: Any,
                 capability_of: Mapping[str, str] | None = None) -> None:
        self._approvals = approvals
        self._run_code = run_code
        # The run's frozen declarations: a source tool's capability is known only to its run.
        self._capability_of = capability_of or {}

    async def find_receipt(self, run_id: str, call_digest: str) -> ApprovalReceipt | None:
        return await self._approvals.find_receipt(run_id, call_digest)

    async def request(self, run_id: str, bundle: AuthorityBundle, tool: str, args_digest: str,
                      redacted_args: Mapping[str, Any]) -> str:
        if self._run_code is not None:
            released = await self._run_code.release(bundle.member, bundle.conversation_id)
            if released:
                log.info("run %s: released the sandbox lease before asking about %s",
                         run_id, tool)
        return await self._approvals.request(run_id, bundle, tool, args_digest, redacted_args,
                                             capability=self._capability_of.get(tool))

    async def consume_receipt(self, run_id: str, approval_id: str) -> bool:
        return await self._approvals.consume_receipt(run_id, approval_id)


class AgentRoster:
    """``ctx.services.agents`` for the roster tool: the member-visible agents."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def visible_to(self, member: str) -> list[dict[str, Any]]:
        return [a.public() for a in await self._store.agents.list_visible(member)]


class PipelineToolBackend:
    def __init__(
        self,
        store: Store,
        registry: ToolRegistry,
        *,
        discovery_enabled: bool,
        authorize: Callable[[str, str], bool] | None = None,
        metrics: ToolMetrics | None = None,
        guardrails: GuardrailChain | None = None,
    ) -> None:
        self._store = store
        self._registry = registry
        self._discovery = discovery_enabled
        self._mcp: McpSources | None = None
        self._openapi: OpenApiSources | None = None
        # The credential quarantine's port (docs/credentials.md); None: credentials are off.
        self._credentials: Any = None
        self.permissions = StorePermissions(store, authorize, ancestors_of=self._ancestors_of)
        self._metrics = metrics
        self._guardrails = guardrails
        self._agents = AgentRoster(store)
        self._artifacts = artifact_services(store)
        # Hashline snapshots and registers.
        self._workspace_store = StoredWorkspaceState(store)
        self._documents = DocumentStore(store)
        self._history = HistorySearch(store)
        self._run_code: Any = None
        self._notebooks: Any = None
        self._task_tools: TaskTools | None = None
        capability_of = {d.name: d.capability.value for d in registry.descriptors()}
        self.approvals = StoreApprovals(store, capability_of)
        self._resources = StoreResourceAuthorization(store)
        self._task_posture = TaskPostureGate(TaskStore(store))

    @property
    def tool_names(self) -> frozenset[str]:
        """Names of the registered tools."""
        return frozenset(self._registry.names())

    def attach_mcp(self, sources: McpSources) -> None:
        """The administrator-enabled MCP servers (set at server start, docs/mcp.md)."""
        self._mcp = sources

    @property
    def mcp(self) -> McpSources | None:
        return self._mcp

    def attach_openapi(self, sources: OpenApiSources) -> None:
        """The members' external OpenAPI sources (KAIZEN_OPENAPI_SOURCES_ENABLED,
        docs/openapi-sources.md); never attached while the feature is off."""
        self._openapi = sources

    @property
    def openapi(self) -> OpenApiSources | None:
        return self._openapi

    def attach_credentials(self, service: Any) -> None:
        """The credential broker's port for credential-backed tools (set at server start)."""
        self._credentials = service

    @property
    def credentials(self) -> Any:
        return self._credentials

    def _ancestors_of(self, tool: str) -> tuple[str, ...]:
        """The policy selectors above ``tool``, root first: for a source tool the sources
        root, its family and its source (docs/tool-policies.md); none for a built-in."""
        if self._openapi is not None and (found := self._openapi.ancestors_of(tool)):
            return found
        if self._mcp is not None:
            if tool == "mcp":
                return (SOURCES_ROOT,)
            server = self._mcp.parent_of(tool)
            if server is not None:
                return (SOURCES_ROOT, "mcp", server)
            if self._mcp.knows(tool):
                return (SOURCES_ROOT, "mcp")
        return ()

    async def policy_name_known(self, name: str) -> bool:
        """Whether an admin tool policy may name ``name``: a registered tool, the sources
        root, an enabled MCP server's selector (``mcp__<id>``) or a tool name under one,
        (with the feature on) the OpenAPI family, an existing source or a tool under it, or
        (with credentials on) a credential destination's selector (``credentials__<id>``)."""
        if name in self._registry:
            return True
        if name == SOURCES_ROOT and (self._mcp is not None or self._openapi is not None):
            return True
        if self._mcp is not None and (name == "mcp" or self._mcp.knows(name)):
            return True
        if self._credentials is not None and self._credentials.policy_name_known(name):
            return True
        return self._openapi is not None and await self._openapi.policy_name_known(name)

    async def discover(self, *, agent: AgentRecord, member: str,
                       conversation_id: str = "") -> Discovered:
        """The source tools this run may use, discovered now as ``member`` (docs/mcp.md,
        docs/openapi-sources.md).

        Only sources the agent grants are contacted (R-066); each tool must be granted by the
        agent (its source or its exact name) and allowed to the member by admin policy, its
        ancestors included, at this instant. A source that fails gives nothing (R-065). In
        ``conversation_id``, the member's own choices there leave out what they name (R-311).
        """
        found = NOTHING_DISCOVERED
        if self._mcp is not None:
            servers = self._mcp.granted_servers(agent.id, agent.tool_ceiling)
            # A server bound to a credential destination is listed with the member's
            # remembered credential (docs/mcp.md, "Credentials").
            mcp_found = await self._mcp.discover(servers, member=member,
                                                 credentials=self._credentials)
            granted = tuple(
                t for t in mcp_found.tools if self._mcp.agent_grants(
                    self._mcp.servers[str(t.descriptor.extra["mcp_server"])], agent.id,
                    agent.tool_ceiling, t.descriptor.name))
            found = found + Discovered(granted, mcp_found.unavailable, mcp_found.reasons)
        if self._openapi is not None:
            found = found + await self._openapi.discover(member, agent.tool_ceiling)
        # A registered tool's name is never taken over by a source.
        candidates = [t for t in found.tools if t.descriptor.name not in self._registry]
        if not candidates:  # an agent granting no source: no policy to read
            return Discovered((), found.unavailable, found.reasons)
        allowed = await self.permissions.allowed_names(
            member, [t.descriptor.name for t in candidates])
        kept = tuple(t for t in candidates if t.descriptor.name in allowed)
        if kept and conversation_id:
            # The member's per-conversation choices: one more narrowing, never a grant.
            off = await ToolChoices(self._store).off_for(member, conversation_id)
            kept = tuple(t for t in kept if not left_out(
                t.descriptor.name, self._ancestors_of(t.descriptor.name), off))
        return Discovered(kept, found.unavailable, found.reasons)

    def attach_run_code(self, service: Any) -> None:
        """Make the kernel service reachable from the run_code tool (set at server start)."""
        self._run_code = service

    def attach_notebooks(self, service: Any) -> None:
        """The member's notebooks and their kernels, for the notebook tools and REST routes
        (``notebooks/service.py``; set at server start, when the server's managers exist)."""
        self._notebooks = service

    def attach_tasks(self, service: TaskTools) -> None:
        """The member's tasks for the task tools (set once the room lanes exist)."""
        self._task_tools = service

    @property
    def notebooks(self) -> Any:
        return self._notebooks

    @property
    def registry(self) -> ToolRegistry:
        return self._registry

    @property
    def store(self) -> Store:
        return self._store

    @property
    def guardrails(self) -> GuardrailChain | None:
        return self._guardrails

    @property
    def metrics(self) -> ToolMetrics | None:
        return self._metrics

    def member_services(self) -> ToolServices:
        """The services a call outside any run gets (Kaizen's own MCP endpoint): the member's
        stores, no kernel, no run catalog, no conversation resources."""
        return ToolServices(artifacts=self._artifacts, agents=self._agents,
                            notebooks=self._notebooks, tasks=self._task_tools,
                            documents=self._documents, history=self._history)

    def catalog(self, *, agent: AgentRecord, conversation: ConversationRecord, member: str,
                request_text: str = "", profile: PromptProfile = FULL,
                earned: Sequence[str] = (), attached: Sequence[str] = (),
                sources: Discovered = NOTHING_DISCOVERED) -> FrozenCatalog:
        """The run's frozen catalog under the model's prompt profile (its context budget
        defers tools behind tool_search; ``earned`` are the tools the turn's context names).
        ``sources`` are the run's discovered source tools, already narrowed to the agent's
        grant: they pass every filter of the catalog like any other tool."""
        source_descriptors = [t.descriptor for t in sources.tools]
        ceiling = {*agent.tool_ceiling, *(d.name for d in source_descriptors)}
        # The source catalog is a baseline read while a source family is configured, even
        # for an agent granting no source; without one it does not exist.
        if self._mcp is not None or self._openapi is not None:
            ceiling.add(SOURCE_CATALOG_NAME)
        else:
            ceiling.discard(SOURCE_CATALOG_NAME)
        return freeze_catalog(
            [*self._registry.descriptors(), *source_descriptors],
            agent_ceiling=ceiling,
            room_shared=conversation.shared,
            roster_is_only_initiator=conversation.participants == (member,),
            discovery_enabled=self._discovery,
            member_request=request_text,
            direct=profile.direct_tools,
            earned=earned,
            attached=attached,
            description_chars=profile.description_chars,
            # A turn's routing grant: an agent of a specialist mode calls its tool first.
            routed=ROUTED_FIRST_TOOL.get(agent.mode)
            if request_text and profile.routes_specialists else None,
        )

    def freeze(self, *, agent: AgentRecord, conversation: ConversationRecord, member: str,
               request_text: str, profile: PromptProfile = FULL,
               earned: Sequence[str] = (), attached: Sequence[str] = (),
               sources: Discovered = NOTHING_DISCOVERED) -> FrozenTools:
        catalog = self.catalog(agent=agent, conversation=conversation, member=member,
                               request_text=request_text, profile=profile, earned=earned,
                               attached=attached, sources=sources)
        shown = {t.name for t in catalog.first_step}
        deferred = tuple(catalog.projected[name] for name in catalog.deferred
                         if name not in shown)
        withheld = {}
        for name in catalog.names:
            registered = self._registry.get(name)
            if registered is not None and registered.descriptor.withheld_arguments:
                withheld[name] = registered.descriptor.withheld_arguments
        admitted_sources = {t.descriptor.name: t for t in sources.tools
                            if t.descriptor.name in catalog.descriptors}
        return FrozenTools(advertised=catalog.first_step, digest=catalog.digest,
                           required_tool=catalog.required_tool, catalog=catalog,
                           deferred=deferred, withheld_arguments=withheld,
                           sources=admitted_sources,
                           knowledge_scope=KnowledgeScope.from_stored(agent.knowledge_scope))

    async def prompt_attachments(self, prompt: str, *, agent: AgentRecord,
                                 conversation: ConversationRecord, member: str,
                                 sources: Discovered | None = None) -> ResolvedAttachments:
        """A saved prompt's step attachments resolved against what holds now: the registered
        tools, the member's policy and this agent's catalog in this room (R-206).
        ``sources``: the source tools already discovered for this run, else discovered here
        (source tools exist only as discovered now, as this member)."""
        if not has_tokens(prompt):
            return ResolvedAttachments(model_text=prompt)
        if sources is None:
            sources = await self.discover(agent=agent, member=member,
                                          conversation_id=conversation.id)
        catalog = self.catalog(agent=agent, conversation=conversation, member=member,
                               sources=sources)
        registered = {d.name: d.surface for d in (
            *self._registry.descriptors(), *(t.descriptor for t in sources.tools))}
        named = {t.ref.rpartition("/")[2] for t in tokens_in(prompt) if t.kind == "tool"}
        disabled = frozenset([name for name in sorted(named & registered.keys())
                              if not await self.permissions.allowed(member, name)])
        return resolve(prompt, AttachmentFacts(registered=registered,
                                               within_ceiling=frozenset(catalog.names),
                                               disabled=disabled))

    async def check_task_prompt(self, owner: str, conversation_id: str, prompt: str) -> None:
        """Refuse (AttachmentRejected, 422) a task prompt whose attachments the task's agent
        cannot use in its room now; a room the owner is not in is NotFound (R-207)."""
        if not has_tokens(prompt):
            return
        conversation = await self._store.conversations.get_for(conversation_id, owner)
        agent = await self._store.agents.get_visible(conversation.agent_id, owner)
        if agent is None:
            return  # the run itself fails as agent_unavailable; nothing to resolve against
        resolved = await self.prompt_attachments(prompt, agent=agent,
                                                 conversation=conversation, member=owner)
        if not resolved.ok:
            raise resolved.error()

    def caller(self, *, bundle: AuthorityBundle, tools: FrozenTools,
               cancelled: asyncio.Event,
               delegation: AgentDelegation | None = None) -> ToolCaller:
        catalog = tools.catalog
        assert isinstance(catalog, FrozenCatalog)
        registered_tools: dict[str, RegisteredTool] = {}
        for name in catalog.names:
            registered = self._registry.get(name) or tools.sources.get(name)
            if registered is not None:
                registered_tools[name] = registered

        # Grows as discovery reveals deferred tools, so a later search reports them callable.
        callable_now = {t.name for t in tools.advertised}
        deferred_names = {t.name for t in tools.deferred}
        services: ToolServices  # built below, with the bridge, before any call can run

        async def execute(tool: RegisteredTool, run_bundle: AuthorityBundle,
                          arguments: Mapping[str, Any], /) -> object:
            context = RunToolContext(run_bundle, services)
            return await tool.impl(context, **arguments)

        store = self._store

        async def roster_is_only_initiator(run_bundle: AuthorityBundle,
                                           facts: CallFactsView | None = None, /) -> bool:
            # The roster was read with this call's other facts at its authority check.
            if facts is not None and facts.member == run_bundle.member:
                return facts.only_initiator
            conversation = await store.runs.conversation_of(run_bundle.conversation_id)
            return conversation.participants == (run_bundle.member,)

        pipeline = ToolPipeline(
            tools=registered_tools,
            ceiling=catalog.names,
            authority=StoreAuthority(store, bundle),
            permissions=self.permissions,
            approval_modes=StoreApprovalModes(store),
            approvals=LeaseReleasingApprovals(self.approvals, self._run_code, {
                name: d.capability.value for name, d in catalog.descriptors.items()}),
            executor=execute,
            roster_is_only_initiator=roster_is_only_initiator,
            audit=StoreAudit(store),
            metrics=self._metrics,
            guardrails=self._guardrails,
            cancelled=cancelled,
            resources=self._resources,
            task_posture=self._task_posture,
            credentials=self._credentials,
        )

        async def call(run_bundle: AuthorityBundle, request: ToolCallRequest,
                       scope: CallScope | None = None, /) -> ToolCallResult:
            while True:
                try:
                    result = await pipeline.run(run_bundle, request, scope)
                    if request.name == TOOL_SEARCH_NAME and not result.failed:
                        result = _with_reveals(result, deferred_names, callable_now)
                    return result
                except ApprovalPending as pending:
                    try:
                        decision = await self._await_decision(pending.approval_id, cancelled)
                    except asyncio.CancelledError:
                        # A delegated turn cut off (out of time) while it waited: the parent
                        # carries on, so the request is withdrawn and no later decision runs
                        # it. A run's own wait is left as it is: the run is cancelled or
                        # stopping, and recovery settles a run that waited (resume.py).
                        if tools.delegated:
                            await asyncio.shield(self._withdraw(pending.approval_id))
                        raise
                    if decision == "denied":
                        return _declined(request, catalog)
                    # Approved: run the call again; the pipeline consumes the one-shot
                    # receipt and reruns every guardrail before executing.
                except CredentialPending as paused:
                    # The same wait for the member, for a credential form: however it
                    # ends, the call is re-issued and settles what the member did — it runs
                    # once with the submitted value, or is refused (expired, cancelled).
                    await self._await_credential(paused.request_id, cancelled)

        # A kernel may call back only the catalog's read tools, through this same pipeline;
        # starting another agent's turn is not a read a kernel makes.
        bridge = BridgeBinding(bundle, call, {
            name: d.capability for name, d in catalog.descriptors.items()
            if d.capability is Capability.READ and name != "run_code"
            and not delegates(d)})
        services = ToolServices(
            artifacts=self._artifacts, agents=self._agents, run_code=self._run_code,
            bridge=bridge, workspace_store=self._workspace_store, notebooks=self._notebooks,
            tasks=self._task_tools, catalog=catalog,
            documents=self._documents, history=self._history,
            callable_tools=callable_now,
            # The turn's admitted files (run_code projects exactly these, R-454).
            resources=tools.resources,
            # What the agent retrieves over, narrowing the member's access.
            knowledge_scope=tools.knowledge_scope,
            # Another agent's turn inside this run's authority (invoke_agent, R-060).
            delegation=delegation,
            extra=self._extra_services(tools))
        return call

    def _extra_services(self, tools: FrozenTools) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self._mcp is not None and tools.sources:
            # The run's MCP sessions: a server is connected (a stdio one started) at its
            # first call of the run and reused until idle (docs/mcp.md).
            extra[SESSIONS_SERVICE] = RunSessions(self._mcp)
        if self._openapi is not None:
            # The member's OpenAPI sources, for manage_openapi_sources.
            extra[OPENAPI_SOURCES_SERVICE] = self._openapi
        return extra

    async def _withdraw(self, approval_id: str) -> None:
        try:
            if await self.approvals.withdraw(approval_id):
                log.info("withdrew approval request %s: nothing waits for it", approval_id)
        except Exception:
            log.exception("could not withdraw approval request %s", approval_id)

    async def _await_credential(self, request_id: str, cancelled: asyncio.Event) -> None:
        """Until the paused call's form is submitted, cancelled or expired (this expires it
        when its time is up). A turn stopped meanwhile cancels the request, so its form is
        refused from then on (docs/credentials.md)."""
        requests = CredentialRequests(self._store)
        try:
            while True:
                paused = await requests.get(request_id)
                if paused is None or paused.status != "pending":
                    return
                if await requests.expire_if_due(request_id):
                    return
                if cancelled.is_set():
                    raise RunCancelled()
                await asyncio.sleep(APPROVAL_POLL_S)
        except (RunCancelled, asyncio.CancelledError):
            await asyncio.shield(self._close_paused(requests, request_id))
            raise

    @staticmethod
    async def _close_paused(requests: CredentialRequests, request_id: str) -> None:
        try:
            await requests.settle(request_id, "cancelled", SETTLED_BY_SERVER)
        except RequestClosed:
            pass
        except Exception:
            log.exception("could not close credential request %s", request_id)

    async def _await_decision(self, approval_id: str, cancelled: asyncio.Event) -> str:
        while True:
            status = await self.approvals.status(approval_id)
            if status in ("approved", "denied", "consumed", "missing"):
                return "denied" if status in ("denied", "missing") else "approved"
            if cancelled.is_set():
                raise RunCancelled()
            await asyncio.sleep(APPROVAL_POLL_S)


def _with_reveals(result: ToolCallResult, deferred: set[str],
                  callable_now: set[str]) -> ToolCallResult:
    """Deferred matches of a search become callable from the next step (R-297). The names
    come from the search's own projection but only frozen deferred tools count."""
    try:
        body = json.loads(result.content)
    except ValueError:
        return result
    named = body.get("newly_callable") if isinstance(body, dict) else None
    if not isinstance(named, list):
        return result
    revealed = tuple(n for n in named if isinstance(n, str) and n in deferred
                     and n not in callable_now)
    callable_now.update(revealed)
    return dataclasses.replace(result, reveals=revealed) if revealed else result


def _declined(request: ToolCallRequest, catalog: FrozenCatalog) -> ToolCallResult:
    descriptor = catalog.descriptors.get(request.name)
    capability = descriptor.capability if descriptor else Capability.UNDECLARED
    return ToolCallResult(
        call_id=request.call_id, name=request.name, outcome=ToolOutcome.ERROR,
        content="The member declined this call. Do not call it again; answer with what you "
                "have, or explain what you would need.",
        capability=capability,
    )


