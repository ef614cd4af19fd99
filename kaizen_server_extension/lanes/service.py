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
import hashlib
import json
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from kaizen_server_extension.lanes.context import build_context
from kaizen_server_extension.lanes.host import LivePublisher, RunHost, ToolCaller
from kaizen_server_extension.lanes.inbox import CompletionInbox, PresenceRegistry
from kaizen_server_extension.policy.synthesis import SYNTHESIS
from kaizen_server_extension.runtime.controller import TurnController
from kaizen_server_extension.runtime.port import (
    AdvertisedTool,
    AuthorityBundle,
    Budgets,
    CorrectionRule,
    ModelStepError,
    RunManifest,
    StepEvent,
    StepFinished,
    StepSnapshot,
)
from kaizen_server_extension.settings import SettingsError
from kaizen_server_extension.store.notifications import NotificationRepository
from kaizen_server_extension.store.records import AgentRecord, ConversationRecord, RunRecord
from kaizen_server_extension.store.runs import Admission, RunLane
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.store.usage import DailyTokenCapReached, UsageLedger

log = logging.getLogger("kaizen.lanes")

LEASE = timedelta(seconds=30)
RECOVERY_INTERVAL_S = 10.0
#: Lease length of an active run, in seconds (1-3600, default 30). The holder renews it every
#: quarter of that while it runs the turn; another replica recovers a run whose lease ran out.
LEASE_ENV = "KAIZEN_RUN_LEASE_SECONDS"


def lease_from_environ(environ: Mapping[str, str]) -> timedelta:
    raw = environ.get(LEASE_ENV, "").strip()
    if not raw:
        return LEASE
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 1 <= seconds <= 3600:  # also false for nan
        raise SettingsError(f"Invalid setting {LEASE_ENV}: must be a number of seconds "
                            "between 1 and 3600")
    return timedelta(seconds=seconds)


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


class ToolBackend(Protocol):
    """The tool side of admission and execution, as the lane sees it."""

    def freeze(self, *, agent: AgentRecord, conversation: ConversationRecord, member: str,
               request_text: str) -> FrozenTools: ...

    def caller(self, *, bundle: AuthorityBundle, tools: FrozenTools,
               cancelled: asyncio.Event) -> ToolCaller: ...


class ModelGatewayPort(Protocol):
    def stream_step(self, snapshot: StepSnapshot, *,
                    model: str | None = None) -> AsyncIterator[StepEvent]: ...


@dataclass(frozen=True, slots=True)
class LaneConfig:
    budgets: Budgets
    correction_rules: tuple[CorrectionRule, ...]
    default_model: str
    daily_tokens: int = 0  # LLM_PER_USER_DAILY_TOKENS; 0 = unlimited


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
    ) -> None:
        self.store = store
        self.lane = RunLane(store)
        self.lease = lease if lease is not None else lease_from_environ(os.environ)
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
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._draining: dict[str, asyncio.Task[None]] = {}
        self._runs: dict[str, tuple[asyncio.Task[Any], asyncio.Event]] = {}
        self._recovery: asyncio.Task[None] | None = None
        self._closing = False

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Recover stale runs, resume queued rooms, and keep watching for stale leases."""
        await self.recover_stale()
        for room in await self.lane.queued_rooms():
            self.wake(room)
        self._recovery = asyncio.create_task(self._recovery_loop(), name="kaizen-recovery")

    async def stop(self) -> None:
        self._closing = True
        tasks = [t for t, _ in self._runs.values()] + list(self._draining.values())
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
            return
        self._draining[conversation_id] = asyncio.create_task(
            self._drain(conversation_id), name=f"kaizen-lane-{conversation_id}"
        )

    async def _drain(self, conversation_id: str) -> None:
        try:
            while not self._closing:
                run = await self.lane.claim_next(conversation_id, self.owner, self.lease)
                if run is None:
                    return  # idle, or another run (maybe another process's) is active
                await self._execute(run)
        except Exception:
            log.exception("room lane %s stopped unexpectedly", conversation_id)
        finally:
            self._draining.pop(conversation_id, None)

    async def _execute(self, run: RunRecord) -> None:
        cancelled = asyncio.Event()
        task = asyncio.create_task(self._admit_and_run(run, cancelled),
                                   name=f"kaizen-run-{run.id}")
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
        run, text, accepted_model = await self.store.runs.admission_facts(run.id)
        conversation = await self.store.runs.conversation_of(run.conversation_id)
        agent = await self.store.agents.get_visible(conversation.agent_id, run.member)
        if agent is None:
            await self.lane.settle(run.id, "failed", "agent_unavailable", "kaizen",
                                   fence=run.fence)
            return
        member = await self.store.members.get(run.member)
        model = accepted_model or (member.model if member else None) or \
            self._config.default_model
        gateway = self._gateway()
        if gateway is None or not model:
            await self.lane.settle(
                run.id, "failed", "model_not_configured", "kaizen", fence=run.fence,
                data={"message": "No model is configured for this server. Set "
                      "KAIZEN_MODEL_BASE_URL and KAIZEN_MODEL, or run `kaizen-local-model "
                      "setup` for the embedded model, then send the message again."})
            return

        tools = self._tools.freeze(agent=agent, conversation=conversation, member=run.member,
                                   request_text=text)
        bundle = AuthorityBundle(
            run_id=run.id, conversation_id=run.conversation_id,
            input_position=run.input_position, member=run.member,
            agent_version_id=agent.version_id,
            audience_version=conversation.audience_version,
            resource_digest=resource_digest(conversation, agent, tools.digest),
            fence=run.fence,
        )
        admitted = await self.lane.admit(run.id, run.fence, Admission(
            agent_version_id=agent.version_id, audience_version=conversation.audience_version,
            resource_digest=bundle.resource_digest, catalog_digest=tools.digest, model=model,
        ), {"input_position": run.input_position, "agent_id": agent.id,
            "agent_version": agent.version, "model": model, "catalog_digest": tools.digest,
            "tools": [t.name for t in tools.advertised]})
        if not admitted:
            return  # cancelled or recovered before admission; already settled
        history = await self.store.journal.exchanges(run.conversation_id)
        manifest = RunManifest(
            bundle=bundle,
            context=build_context(agent.persona, history, current_input_id=run.input_id,
                                  shared=conversation.shared),
            catalog=tools.advertised,
            catalog_digest=tools.digest,
            budgets=self._config.budgets,
            synthesis=SYNTHESIS,
            correction_rules=self._config.correction_rules,
            required_tool=tools.required_tool,
            deferred=tools.deferred,
        )

        cap = self._config.daily_tokens

        async def model_stream(snapshot: StepSnapshot) -> AsyncIterator[StepEvent]:
            try:
                async with self._usage.guard(run.member, cap) as meter:
                    async for event in gateway.stream_step(snapshot, model=model):
                        if isinstance(event, StepFinished):
                            meter.add(event.usage.total_tokens)
                        yield event
            except DailyTokenCapReached:
                raise ModelStepError("daily_token_cap_reached", retryable=False) from None

        host = RunHost(
            store=self.store, lane=self.lane, bundle=bundle, model_stream=model_stream,
            call_tool=self._tools.caller(bundle=bundle, tools=tools, cancelled=cancelled),
            publish_live=self._publish_live, lease=self.lease,
        )
        await TurnController(host, manifest).run()

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
        recovered = 0
        for run in await self.lane.stale_runs():
            if await self.lane.recover(run, "kaizen"):
                recovered += 1
                log.warning("recovered run %s of a server that stopped mid-turn", run.id)
                await self._notify_settled(run.id)
                self.wake(run.conversation_id)
        return recovered

    async def _recovery_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.recovery_interval_s)
            try:
                await self.recover_stale()
                for room in await self.lane.queued_rooms():
                    self.wake(room)
            except Exception:
                log.exception("stale-run recovery failed; retrying")


def resource_digest(conversation: ConversationRecord, agent: AgentRecord,
                    catalog_digest: str) -> str:
    """Digest of what the run is authorized over: room, roster, agent version, catalog."""
    payload = json.dumps({
        "conversation": conversation.id,
        "participants": sorted(conversation.participants),
        "agent_version": agent.version_id,
        "knowledge_scope": agent.knowledge_scope,
        "catalog": catalog_digest,
    }, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()

