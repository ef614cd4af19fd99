"""The room lane: one durable FIFO of accepted inputs per conversation, one active run.

``wake(conversation)`` is all a request does after accepting an input. The lane claims the
oldest queued run in the database (fence + lease), admits it with a fixed authority bundle,
and runs the turn controller in a detached task: no websocket or request owns it (R-028), and
the task keeps the bundle for the life of the run (R-029). When the run settles, the lane
claims the next input. Another server process on the same database can never start a second
run of the room: the claim fails in the database (R-024, R-027).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from kaizen_server_extension.host.bundle import admitted_bundle, recorded_admission, resource_digest
from kaizen_server_extension.host.delegation import (
    DEFAULT_DELEGATION_LIMITS,
    INVOKE_AGENT,
    DelegationLimits,
    RunDelegation,
)
from kaizen_server_extension.host.run_host import LivePublisher, RunHost, ToolCaller
from kaizen_server_extension.host.tool_backend import FrozenTools
from kaizen_server_extension.lanes.artifact_stream import UPDATE_TOOL, checkpointed_step
from kaizen_server_extension.lanes.context import (
    COMPLETE_TOOL,
    build_context,
    load_artifact_roster,
    roster_for,
)
from kaizen_server_extension.lanes.inbox import CompletionInbox, PresenceRegistry
from kaizen_server_extension.lanes.resume import RECOVERY_EVENTS, RunJournal
from kaizen_server_extension.logs import log_context
from kaizen_server_extension.models.profiles import FULL, PromptProfile
from kaizen_server_extension.notebooks.context import notebook_context
from kaizen_server_extension.notebooks.document import DEFAULT_CONTEXT_CHARS
from kaizen_server_extension.policy.grounding import compose_system_prompt
from kaizen_server_extension.policy.prompt_attachments import (
    ResolvedAttachments,
)
from kaizen_server_extension.policy.prompt_attachments import (
    directive_text as attachment_directives,
)
from kaizen_server_extension.policy.synthesis import SYNTHESIS
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.model import (
    ChatMessage,
    ModelStepError,
    StepEvent,
    StepFinished,
    StepSnapshot,
)
from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.resources import AdmittedResources
from kaizen_server_extension.runtime.port import Budgets, CorrectionRule, ResumePoint, RunManifest
from kaizen_server_extension.runtime.registry import (
    CONTROLLERS,
    DEFAULT_CONTROLLER,
    controller_for,
)
from kaizen_server_extension.store.attachments import AttachmentStore
from kaizen_server_extension.store.notifications import NotificationRepository
from kaizen_server_extension.store.records import AgentRecord, ConversationRecord, RunRecord
from kaizen_server_extension.store.runs import (
    LIVE_OWNER_SUFFIX,
    LIVENESS_LOCK_NAMESPACE,
    Admission,
    RunLane,
    owner_gone_from_this_host,
    this_host,
)
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.store.tasks import CHAT_POSTURE
from kaizen_server_extension.store.usage import DailyTokenCapReached, UsageLedger
from kaizen_server_extension.tools.manifest import STAGED_ARTIFACT_TOOLS
from kaizen_server_extension.tools.mcp_sources import NOTHING_DISCOVERED, Discovered
from kaizen_server_extension.tools.services import AgentDelegation

log = logging.getLogger("kaizen.lanes")

LEASE = timedelta(seconds=30)
#: The tool that reads a turn's attached files (docs/run_code.md, "Shared resources").
RUN_CODE_TOOL = "run_code"
RECOVERY_INTERVAL_S = 10.0
#: How often the database is asked whose holders are gone, when it can tell (PostgreSQL).
LIVENESS_INTERVAL_S = 1.0
#: How long a holder's liveness lock must stay gone before its runs are taken over: a
#: reconnecting replica takes its lock again well within it.
LIVENESS_GRACE_S = 1.5


class HolderLiveness(Protocol):
    """This process's liveness as the database holds it (events/postgres.py: the link's
    session advisory lock)."""

    def hold_advisory_lock(self, namespace: int, key: str) -> None: ...

    @property
    def holds_locks(self) -> bool: ...


class ToolBackend(Protocol):
    """The tool side of admission and execution, as the lane sees it."""

    async def discover(self, *, agent: AgentRecord, member: str,
                       conversation_id: str = "") -> Discovered: ...

    def freeze(self, *, agent: AgentRecord, conversation: ConversationRecord, member: str,
               request_text: str, profile: PromptProfile = FULL,
               earned: Sequence[str] = (), attached: Sequence[str] = (),
               sources: Discovered = NOTHING_DISCOVERED) -> FrozenTools: ...

    async def prompt_attachments(self, prompt: str, *, agent: AgentRecord,
                                 conversation: ConversationRecord, member: str,
                                 sources: Discovered | None = None
                                 ) -> ResolvedAttachments: ...

    def caller(self, *, bundle: AuthorityBundle, tools: FrozenTools,
               cancelled: asyncio.Event,
               delegation: AgentDelegation | None = None) -> ToolCaller: ...


class ModelGatewayPort(Protocol):
    def stream_step(self, snapshot: StepSnapshot, *,
                    model: str | None = None) -> AsyncIterator[StepEvent]: ...


@dataclass(frozen=True, slots=True)
class LaneConfig:
    budgets: Budgets
    correction_rules: tuple[CorrectionRule, ...]
    default_model: str
    daily_tokens: int = 0  # LLM_PER_USER_DAILY_TOKENS; 0 = unlimited
    notebook_context_chars: int = DEFAULT_CONTEXT_CHARS  # KAIZEN_NOTEBOOK_CONTEXT_CHARS
    #: The model provider's prompt profile (its context budget, models/profiles.py).
    prompt_profile: PromptProfile = FULL
    #: The bounds of invoke_agent's delegated turns (KAIZEN_DELEGATION_*).
    delegation: DelegationLimits = DEFAULT_DELEGATION_LIMITS


class LaneService:
    def __init__(
        self,
        *,
        store: Store,
        tools: ToolBackend,
        gateway: Callable[[], ModelGatewayPort | None],
        config: LaneConfig,
        publish_live: LivePublisher,
        lease: timedelta | None = None,
        inbox: CompletionInbox | None = None,
        liveness: HolderLiveness | None = None,
    ) -> None:
        self.store = store
        self.lane = RunLane(store)
        # KAIZEN_RUN_LEASE_SECONDS (settings.py), 30 s by default.
        self.lease = lease if lease is not None else LEASE
        # Stale leases are looked for a few times per lease, at most every RECOVERY_INTERVAL_S.
        self.recovery_interval_s = min(RECOVERY_INTERVAL_S,
                                       max(self.lease.total_seconds() / 3, 0.2))
        # Who watches which conversation here (events websockets): the inbox's attendance.
        self.presence = PresenceRegistry()
        self.inbox = inbox or CompletionInbox(NotificationRepository(store), self.presence)
        self._usage = UsageLedger(store)
        self._tools = tools
        self._gateway = gateway
        self._config = config
        self._publish_live = publish_live
        self._base_owner = f"{this_host()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # With a liveness lock, a crash is seen in seconds instead of after the lease.
        self._liveness = liveness
        if liveness is not None:
            liveness.hold_advisory_lock(LIVENESS_LOCK_NAMESPACE, self._live_owner)
            self.recovery_interval_s = min(self.recovery_interval_s, LIVENESS_INTERVAL_S)
        # Runs whose holder's liveness lock was seen gone, and when (monotonic).
        self._suspects: dict[tuple[str, int], float] = {}
        self._draining: dict[str, asyncio.Task[None]] = {}
        # Rooms woken while their drain was running (it claims once more before stopping).
        self._woken: set[str] = set()
        self._runs: dict[str, tuple[asyncio.Task[Any], asyncio.Event]] = {}
        self._recovery: asyncio.Task[None] | None = None
        # Runs this process took over from a dead holder, while they carry on here.
        self._recovered: dict[str, asyncio.Task[None]] = {}
        self._closing = False

    @property
    def _live_owner(self) -> str:
        return self._base_owner + LIVE_OWNER_SUFFIX

    @property
    def owner(self) -> str:
        """Who this process claims runs as: marked live while the database holds its
        liveness lock, so other replicas may judge it by that lock (store/runs.py)."""
        if self._liveness is not None and self._liveness.holds_locks:
            return self._live_owner
        return self._base_owner

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Recover stale runs, resume queued rooms, and keep watching for stale leases."""
        await self.recover_stale()
        for room in await self.lane.queued_rooms():
            self.wake(room)
        self._recovery = asyncio.create_task(self._recovery_loop(), name="kaizen-recovery")

    async def stop(self) -> None:
        self._closing = True
        tasks = [t for t, _ in self._runs.values()] + list(self._draining.values()) + \
            list(self._recovered.values())
        if self._recovery:
            tasks.append(self._recovery)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # --- waking and draining ------------------------------------------------------------

    def wake(self, conversation_id: str) -> None:
        if self._closing:
            return
        task = self._draining.get(conversation_id)
        if task is not None and not task.done():
            # The drain looks once more before it stops: this wake may have come after its
            # last claim found nothing (an input accepted meanwhile is never left waiting).
            self._woken.add(conversation_id)
            return
        with log_context(conversation_id=conversation_id):
            self._draining[conversation_id] = asyncio.create_task(
                self._drain(conversation_id), name=f"kaizen-lane-{conversation_id}"
            )

    async def _drain(self, conversation_id: str) -> None:
        try:
            while not self._closing:
                self._woken.discard(conversation_id)
                run = await self.lane.claim_next(conversation_id, self.owner, self.lease)
                if run is None:
                    if conversation_id in self._woken:
                        continue  # woken while claiming: an input may have come since
                    return  # idle, or another run (maybe another process's) is active
                await self._execute(run)
        except Exception:
            log.exception("room lane %s stopped unexpectedly", conversation_id)
        finally:
            self._draining.pop(conversation_id, None)

    async def _execute(self, run: RunRecord, *, recovered: bool = False) -> None:
        """Run one claimed run (or a recovered one, taken over from a dead holder) to its
        terminal here, holding its lease meanwhile."""
        cancelled = asyncio.Event()
        work = self._resume_and_run if recovered else self._admit_and_run
        # The run's task (and every task it starts) logs with the run's ids.
        with log_context(conversation_id=run.conversation_id, run_id=run.id):
            task = asyncio.create_task(work(run, cancelled), name=f"kaizen-run-{run.id}")
        self._runs[run.id] = (task, cancelled)
        keeper = asyncio.create_task(self._keep_lease(run, task, cancelled),
                                     name=f"kaizen-lease-{run.id}")
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if self._closing:
                raise
        except Exception:
            log.exception("run %s failed outside the controller", run.id)
            await self.lane.settle(run.id, "failed", "internal_error", "kaizen",
                                   fence=run.fence)
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await keeper
            self._runs.pop(run.id, None)
        await self._notify_settled(run.id)

    async def _keep_lease(self, run: RunRecord, task: asyncio.Task[Any],
                          cancelled: asyncio.Event) -> None:
        """Renew the run's lease while this process runs it, whatever the turn waits on
        (a long tool, a slow model step, a member's approval): the lease says "the holder
        is alive", so only a dead or cut-off holder loses it. When the run stops being ours
        (cancelled or recovered elsewhere), stop the local task now rather than at its next
        journal write. Renewing every quarter of the lease lets a holder miss three renewals
        in a row (a stalled loop, a slow database) before another replica may take over."""
        period = self.lease.total_seconds() / 4
        while True:
            await asyncio.sleep(period)
            try:
                ours = await self.lane.extend_lease(run.id, run.fence, self.lease)
            except Exception:
                log.warning("could not renew the lease of run %s; retrying", run.id,
                            exc_info=True)
                continue
            if not ours:
                cancelled.set()
                task.cancel()
                return

    async def _notify_settled(self, run_id: str) -> None:
        """The completion inbox hears of every settlement this process saw (one row per run,
        however many processes report it)."""
        try:
            await self.inbox.run_settled(run_id)
        except Exception:
            log.exception("could not record the completion notice of run %s", run_id)

    async def _admit_and_run(self, run: RunRecord, cancelled: asyncio.Event) -> None:
        facts = await self.store.runs.admission_facts(run.id)
        run, text, accepted_model = facts.run, facts.text, facts.model
        conversation = await self.store.runs.conversation_of(run.conversation_id)
        agent = await self.store.agents.get_visible(conversation.agent_id, run.member)
        if agent is None:
            await self.lane.settle(run.id, "failed", "agent_unavailable", "kaizen",
                                   fence=run.fence)
            return
        member = await self.store.members.get(run.member)
        model = accepted_model or (member.model if member else None) or \
            self._config.default_model
        compress = member is not None and member.tool_result_compression
        gateway = self._gateway()
        if gateway is None or not model:
            await self.lane.settle(
                run.id, "failed", "model_not_configured", "kaizen", fence=run.fence,
                data={"message": "No model is configured for this server. Set "
                      "KAIZEN_MODEL_BASE_URL and KAIZEN_MODEL, or run `kaizen-local-model "
                      "setup` for the embedded model, then send the message again."})
            return

        # The attached files: a changed list is a different bundle.
        resources = await AttachmentStore(self.store).for_input(run.input_id)
        # A task's firing runs in its server-owned posture.
        posture = facts.posture
        tools, attachments = await self._freeze(run, agent, conversation, text, resources,
                                                posture)
        if not attachments.ok:
            # A saved prompt's attachment that cannot be used blocks before any step.
            await self.lane.settle(run.id, "failed", "attachment_invalid", "kaizen",
                                   fence=run.fence,
                                   data={"message": attachments.error().message})
            return
        admission = Admission(
            agent_version_id=agent.version_id, audience_version=conversation.audience_version,
            resource_digest=resource_digest(conversation, agent, tools.digest, resources),
            catalog_digest=tools.digest, model=model)
        bundle = admitted_bundle(run, admission, posture)
        admitted = await self.lane.admit(run.id, run.fence, admission, {
            "input_position": run.input_position, "agent_id": agent.id,
            "agent_version": agent.version, "model": model, "catalog_digest": tools.digest,
            "tools": [t.name for t in tools.advertised],
            "correction": correction_binding(self._config),
            "controller": DEFAULT_CONTROLLER,
            "prompt_profile": self._config.prompt_profile.name,
            **({"posture": posture} if posture != "chat" else {}),
            # The member's opt-in, fixed for the run (a recovery reads it back from here).
            **({"compression": True} if compress else {})})
        if not admitted:
            return  # cancelled or recovered before admission; already settled
        if resources:  # the run audit's bounded resource list
            await AttachmentStore(self.store).audit_admitted(
                run.member, run.conversation_id, run.id, resources)
        manifest = await self._manifest(run, bundle, agent, conversation, tools,
                                        compress=compress)

        await self._drive_turn(run, bundle, tools, manifest, model, gateway, cancelled,
                               mode=agent.mode)

    async def _freeze(self, run: RunRecord, agent: AgentRecord,
                      conversation: ConversationRecord, text: str,
                      resources: AdmittedResources,
                      posture: str) -> tuple[FrozenTools, ResolvedAttachments]:
        """The run's frozen tools under the model's prompt profile. A profile with a context
        budget defers what the turn does not name; what its own context names is earned onto
        the first step: attached files (only run_code reads them) and an unfinished artifact
        version (update_artifact completes it, R-299), so the prompt never names a tool the
        catalog hides (R-300). A task's saved prompt may attach tools with structural tokens:
        resolved now, against this member, agent and room (R-206); the admitted ones are on
        the first step of this run only (R-208). In chat a token is only text (R-205)."""
        # The run's source tools (MCP servers, OpenAPI sources) are discovered now, once, as
        # the run's member; a recovered run discovers again, and a changed inventory changes
        # the digest, so it is settled rather than resumed with tools it was not admitted with.
        sources = await self._tools.discover(agent=agent, member=run.member,
                                             conversation_id=run.conversation_id)
        attachments = ResolvedAttachments(model_text=text)
        if posture != CHAT_POSTURE:
            attachments = await self._tools.prompt_attachments(
                text, agent=agent, conversation=conversation, member=run.member,
                sources=sources)
        profile = self._config.prompt_profile
        earned: list[str] = []
        if profile.defers_tools:
            if resources:
                earned.append(RUN_CODE_TOOL)
            roster = await load_artifact_roster(self.store, run.member, run.conversation_id)
            if any(entry.unfinished for entry in roster.entries):
                earned.append(COMPLETE_TOOL)
        tools = self._tools.freeze(agent=agent, conversation=conversation, member=run.member,
                                   request_text=text, profile=profile, earned=tuple(earned),
                                   attached=attachments.tools if attachments.ok else (),
                                   sources=sources)
        return dataclasses.replace(tools, resources=resources), attachments

    async def first_step_prefix(self, agent_id: str) -> StepSnapshot | None:
        """What a new private conversation with ``agent_id`` sends before the member's words:
        its system prompt and first-step tools. An in-process model evaluates this once at
        start-up, so the first question reuses it instead of reading it cold (the prompt is
        most of a small CPU model's first step). None when the agent does not exist."""
        agent = await self.store.agents.get_visible(agent_id, None)
        if agent is None:
            return None
        now = datetime.now(UTC)
        room = ConversationRecord(id="", owner="", agent_id=agent_id, title="", shared=False,
                                  audience_version=1, last_seq=0, participants=("",),
                                  created_at=now, updated_at=now)
        tools = self._tools.freeze(agent=agent, conversation=room, member="", request_text="",
                                   profile=self._config.prompt_profile)
        # As build_context composes it for a room with no artifacts yet (no roster).
        system = compose_system_prompt(agent.persona, None,
                                       compact=self._config.prompt_profile.compact_prompt)
        return StepSnapshot(step=1, messages=(ChatMessage(role="system", content=system),),
                            tools=tools.advertised)

    async def _manifest(self, run: RunRecord, bundle: AuthorityBundle, agent: AgentRecord,
                        conversation: ConversationRecord, tools: FrozenTools, *,
                        compress: bool) -> RunManifest:
        """What the controller runs with: the same for an admitted and a resumed run."""
        history = await self.store.journal.exchanges(run.conversation_id)
        roster = await roster_for(self.store, run.member, run.conversation_id,
                                  tools.advertised)
        # Attached notebooks, at their pinned versions, as the model reads them.
        attached = await notebook_context(self.store, run.member, run.conversation_id,
                                          tools.resources, self._config.notebook_context_chars)
        return RunManifest(
            bundle=bundle,
            context=build_context(agent.persona, history, current_input_id=run.input_id,
                                  # A saved prompt's tokens read as directives.
                                  rewrite_current=None if bundle.posture == CHAT_POSTURE
                                  else attachment_directives,
                                  shared=conversation.shared, roster=roster,
                                  attachments=attached,
                                  compact=self._config.prompt_profile.compact_prompt),
            catalog=tools.advertised,
            catalog_digest=tools.digest,
            budgets=self._config.budgets,
            synthesis=SYNTHESIS,
            correction_rules=self._config.correction_rules,
            required_tool=tools.required_tool,
            deferred=tools.deferred,
            staged_protocol=STAGED_ARTIFACT_TOOLS.intersection(
                tool.name for tool in (*tools.advertised, *tools.deferred)),
            compress_tool_results=compress,
        )

    async def _drive_turn(self, run: RunRecord, bundle: AuthorityBundle, tools: FrozenTools,
                          manifest: RunManifest, model: str, gateway: ModelGatewayPort,
                          cancelled: asyncio.Event, resume: ResumePoint | None = None,
                          controller_name: str = DEFAULT_CONTROLLER,
                          mode: str = "chat") -> None:
        """The turn controller over this run's trusted host, from the start or from the
        point a recovery rebuilt from the journal."""
        cap = self._config.daily_tokens
        # How the run's frozen catalog declares update_artifact (None: not in this run's).
        update_tool = tools.declared(UPDATE_TOOL)

        async def model_stream(snapshot: StepSnapshot) -> AsyncIterator[StepEvent]:
            try:
                async with self._usage.guard(run.member, cap) as meter:
                    # update_artifact arguments are checkpointed as they stream.
                    async for event in checkpointed_step(
                            gateway, snapshot, model=model, store=self.store, owner=run.member,
                            conversation_id=run.conversation_id, run_id=run.id,
                            update_tool=update_tool):
                        if isinstance(event, StepFinished):
                            meter.add(event.usage.total_tokens)
                        yield event
            except DailyTokenCapReached:
                raise ModelStepError("daily_token_cap_reached", retryable=False) from None

        # invoke_agent's child turns, within this run's member, selection, budgets and
        # approvals (host/delegation.py, R-060); a resumed run keeps counting its delegations.
        delegation = RunDelegation(
            store=self.store, lane=self.lane, lease=self.lease, bundle=bundle, tools=tools,
            backend=self._tools, model_stream=model_stream, cancelled=cancelled,
            budgets=self._config.budgets, correction_rules=self._config.correction_rules,
            limits=self._config.delegation,
            compact_prompt=self._config.prompt_profile.compact_prompt,
            compress_tool_results=manifest.compress_tool_results,
            calls_made=sum(1 for r in (resume.results if resume is not None else ())
                           if r.name == INVOKE_AGENT))
        host = RunHost(
            store=self.store, lane=self.lane, bundle=bundle, model_stream=model_stream,
            call_tool=self._tools.caller(bundle=bundle, tools=tools, cancelled=cancelled,
                                         delegation=delegation),
            publish_live=self._publish_live, lease=self.lease,
            read_tools=tools.read_tools, withheld_arguments=tools.withheld_arguments,
            settled=resume.results if resume is not None else (),
            # The grounding guard reads the agent's mode and the turn's attached files.
            mode=mode, attached_evidence=bool(tools.resources),
        )
        controller = controller_for(controller_name, host, manifest, resume=resume)
        if controller is None:  # only a recovery can name one; it checked already
            await self.lane.settle(run.id, "failed", "controller_unavailable", "kaizen",
                                   fence=run.fence)
            return
        await controller.run()

    # --- cancel and recovery -------------------------------------------------------------

    async def cancel(self, run_id: str, member: str) -> RunRecord:
        """Settle the run ``cancelled`` (compare-and-set) and stop its task if it runs here.
        A runner in another process notices at its next journal write or heartbeat."""
        record = await self.lane.cancel(run_id, member)
        local = self._runs.get(run_id)
        if local is not None:
            task, cancelled = local
            cancelled.set()
            task.cancel()
        self.wake(record.conversation_id)
        return record

    async def recover_stale(self) -> int:
        """Take over each run whose holder is gone and carry it on here: resumed after its
        committed steps, or settled when it cannot be (see :meth:`_resume_and_run`).

        A holder is gone when its lease ran out (a crash, a lost database), at once when it
        was a process of this host that no longer runs (a restarted server), and within
        seconds when the database released its liveness lock (PostgreSQL: the holder's
        connection ended), once the lock has stayed gone for ``LIVENESS_GRACE_S``."""
        recovered = 0
        for stale in await self.lane.stale_runs():
            recovered += await self._take_over(stale, holder_gone=False)
        now = asyncio.get_running_loop().time()
        seen: set[tuple[str, int]] = set()
        for orphan in await self.lane.orphaned_runs():
            key = (orphan.id, orphan.fence)
            seen.add(key)
            if owner_gone_from_this_host(orphan.lease_owner):
                recovered += await self._take_over(orphan, holder_gone=True)
                continue
            first_seen = self._suspects.setdefault(key, now)
            if now - first_seen >= LIVENESS_GRACE_S:
                recovered += await self._take_over(orphan, holder_gone=True)
        self._suspects = {k: t for k, t in self._suspects.items() if k in seen}
        return recovered

    async def _take_over(self, stale: RunRecord, *, holder_gone: bool) -> int:
        if stale.id in self._runs:
            return 0  # ours, running here
        run = await self.lane.take_over(stale, self.owner, self.lease, holder_gone=holder_gone)
        if run is None:
            return 0  # another replica took it, or its holder renewed just in time
        log.warning("took over run %s of a server that stopped mid-turn (%s)", run.id,
                    "its holder is gone" if holder_gone else "its lease ran out")
        self._spawn_recovered(run)
        return 1

    def _spawn_recovered(self, run: RunRecord) -> None:
        async def carry_on() -> None:
            try:
                await self._execute(run, recovered=True)
            finally:
                self._recovered.pop(run.id, None)
                self.wake(run.conversation_id)

        self._recovered[run.id] = asyncio.create_task(carry_on(),
                                                      name=f"kaizen-recovered-{run.id}")

    async def _resume_and_run(self, run: RunRecord, cancelled: asyncio.Event) -> None:
        """Resume a taken-over run from its journal (R-054) or settle it once.

        * Never admitted (the crash came between claim and admission): admitted now, as
          any claimed run.
        * Its answer was committed (the crash came before the terminal): settled
          ``completed`` without asking the model anything.
        * A dispatched call whose outcome is unknown could have changed something (a write,
          sensitive or undeclared tool): it is rebuilt as an error and the run settles
          ``failed`` as interrupted, never replayed (R-446).
        * The run cannot continue under its own admission (agent version, audience,
          catalog, model or correction rules changed; it waited on an approval; its one
          synthesis grant was in flight; a call had closed the turn): settled likewise.
        * Otherwise each dangling read is rebuilt as an error, ``run.resumed`` is journaled
          and the controller continues after the committed steps, on the same run id,
          within what is left of its budgets.
        """
        facts = await self.store.runs.admission_facts(run.id)
        run, text, posture = facts.run, facts.text, facts.posture
        if run.agent_version_id is None:
            await self._admit_and_run(run, cancelled)
            return
        journal = RunJournal.read(await self.lane.run_events(
            run.id, run.conversation_id, (*RECOVERY_EVENTS, "run.admitted")))
        admitted = next((e.data for e in journal.events if e.type == "run.admitted"), {})
        if journal.answer is not None and not journal.dangling:
            await self._settle_recovered(run, [], "completed", "answered", {})
            return

        conversation = await self.store.runs.conversation_of(run.conversation_id)
        agent = await self.store.agents.get_visible(conversation.agent_id, run.member)
        gateway = self._gateway()
        frozen = None if agent is None else await self._freeze(
            run, agent, conversation, text,
            # The same attached files the run was admitted with.
            await AttachmentStore(self.store).for_input(run.input_id), posture)
        # A prompt attachment that no longer resolves: the admission does not hold.
        tools = frozen[0] if frozen is not None and frozen[1].ok else None
        capability = {t.name: t.capability
                      for t in (tools.advertised + tools.deferred if tools else ())}
        ambiguous = [c.name for c in journal.dangling
                     if capability.get(c.name) is not Capability.READ]
        rebuilt = [c.rebuilt(capability.get(c.name)) for c in journal.dangling]
        if ambiguous:
            await self._settle_recovered(run, rebuilt, "failed", "interrupted", {
                "dangling_calls": len(rebuilt), "ambiguous_calls": ambiguous,
                "message": INTERRUPTED_WRITE_MESSAGE})
            return

        # Runs admitted before the choice was journaled all used the turn engine.
        controller_name = admitted.get("controller", DEFAULT_CONTROLLER)
        obstacle: str | None = None
        if agent is None or tools is None or gateway is None or not run.model:
            obstacle = "admission_unavailable"
        elif controller_name not in CONTROLLERS:
            obstacle = "controller_unavailable"  # never moved to another controller
        elif (agent.version_id != run.agent_version_id
              or conversation.audience_version != run.audience_version
              or tools.digest != run.catalog_digest
              or resource_digest(conversation, agent, tools.digest, tools.resources)
              != run.resource_digest
              or admitted.get("correction") != correction_binding(self._config)):
            obstacle = "admission_changed"  # the admission stays fixed
        elif run.status != "running":
            obstacle = "awaiting_approval"
        elif journal.synthesis_started:
            obstacle = "synthesis_interrupted"  # the grant is never repeated
        elif journal.turn_closed or journal.answer is not None:
            obstacle = "turn_closed"
        compress = admitted.get("compression") is True
        point = journal.resume_point(rebuilt, self._config.correction_rules, compress=compress)
        if point is None:
            obstacle = obstacle or "admission_changed"
        admission = recorded_admission(run)
        if obstacle is not None or point is None or agent is None or tools is None \
                or gateway is None or run.model is None or admission is None:
            await self._settle_recovered(run, rebuilt, "failed", "interrupted", {
                "dangling_calls": len(rebuilt), "not_resumed": obstacle or "unknown",
                "message": INTERRUPTED_MESSAGE})
            return

        resumed = await self.lane.close_dangling(run.id, run.fence, rebuilt, "kaizen", resumed={
            "fence": run.fence, "controller": controller_name, "dangling_calls": len(rebuilt),
            "steps_committed": point.rounds_used, "next_step": point.steps_started + 1})
        if not resumed:
            return  # cancelled or taken over again meanwhile: whoever did settles it
        # The bundle the run was admitted with, field for field.
        bundle = admitted_bundle(run, admission, posture)
        manifest = await self._manifest(run, bundle, agent, conversation, tools,
                                        compress=compress)
        await self._drive_turn(run, bundle, tools, manifest, run.model, gateway, cancelled,
                               resume=point, controller_name=str(controller_name),
                               mode=agent.mode)

    async def _settle_recovered(self, run: RunRecord, rebuilt: list[dict[str, Any]],
                                status: str, reason: str, data: dict[str, Any]) -> None:
        settled = await self.lane.close_dangling(run.id, run.fence, rebuilt, "kaizen",
                                                 terminal=(status, reason, data))
        if settled:
            log.warning("recovered run %s settled %s (%s)", run.id, status,
                        data.get("not_resumed") or data.get("ambiguous_calls") or reason)

    async def _recovery_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.recovery_interval_s)
            try:
                await self.recover_stale()
                for room in await self.lane.queued_rooms():
                    self.wake(room)
            except Exception:
                log.exception("stale-run recovery failed; retrying")


INTERRUPTED_MESSAGE = ("The server stopped while this turn was running, and it could not be "
                       "resumed. Please send the message again.")
INTERRUPTED_WRITE_MESSAGE = (
    "The server stopped while an action that may change something was running, so its "
    "outcome is unknown and it was not repeated. Please check the activity before trying "
    "again.")


def correction_binding(config: LaneConfig) -> dict[str, Any]:
    """The exact correction rule set and attempt limit a run is admitted with, as journaled
    in ``run.admitted``: a recovery resumes the run only under the same binding (R-020)."""
    rules = [[r.id, r.pattern, r.reminder] for r in config.correction_rules]
    digest = hashlib.sha256(json.dumps(rules, separators=(",", ":")).encode()).hexdigest()
    return {"rule_ids": [r.id for r in config.correction_rules], "digest": digest,
            "max_attempts": config.budgets.correction_max_attempts}
