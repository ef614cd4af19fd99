"""The trusted side of :class:`HostPort` for one admitted run.

Every call first compares the presented bundle with the admitted one, field by field; any
difference is rejected, not reconciled (R-007). Durable trace events are journaled only
while the run is still ours (status active, fence unchanged), in the same transaction as
that check.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

from kaizen_server_extension.policy.redaction import redact
from kaizen_server_extension.runtime.port import (
    AuthorityBundle,
    AuthorityRejected,
    RunCancelled,
    StepEvent,
    StepSnapshot,
    TerminalOutcome,
    ToolCallRequest,
    ToolCallResult,
    TraceEvent,
)
from kaizen_server_extension.store.policy import (
    HeldAudit,
    begin_call,
    current_call,
    end_call,
    open_call,
    write_audit_rows,
)
from kaizen_server_extension.store.runs import RunLane
from kaizen_server_extension.store.store import Store

log = logging.getLogger("kaizen.lanes")

#: Trace kinds that are shown live but never stored (API.md: live only).
LIVE_ONLY = frozenset({"answer.delta", "thinking.delta"})

ModelStream = Callable[[StepSnapshot], AsyncIterator[StepEvent]]
ToolCaller = Callable[[AuthorityBundle, ToolCallRequest], Awaitable[ToolCallResult]]
LivePublisher = Callable[[str, str, dict[str, Any]], None]


#: Longest argument text journaled for observers; the tool still gets the whole of it.
MAX_SHOWN_ARGUMENT_CHARS = 4000


def shown_arguments(raw: object) -> object:
    """Arguments as observers may see them: parsed when JSON, credentials redacted, bounded."""
    if not isinstance(raw, str):
        return None
    try:
        value: object = json.loads(raw)
    except ValueError:
        value = raw
    shown = redact(value)
    text = json.dumps(shown, ensure_ascii=False)
    if len(text) > MAX_SHOWN_ARGUMENT_CHARS:
        return {"truncated": True, "preview": text[:MAX_SHOWN_ARGUMENT_CHARS]}
    return shown


class RunHost:
    def __init__(
        self,
        *,
        store: Store,
        lane: RunLane,
        bundle: AuthorityBundle,
        model_stream: ModelStream,
        call_tool: ToolCaller,
        publish_live: LivePublisher,
        lease: timedelta,
    ) -> None:
        self._store = store
        self._lane = lane
        self._admitted = bundle
        self._model_stream = model_stream
        self._call_tool = call_tool
        self._publish_live = publish_live
        self._lease = lease

    def _verify(self, bundle: AuthorityBundle) -> None:
        differing = self._admitted.differing_fields(bundle)
        if differing:
            log.warning("run %s: rejected a call whose authority bundle differs in %s",
                        self._admitted.run_id, ", ".join(differing))
            raise AuthorityRejected(differing)

    # --- HostPort ---------------------------------------------------------------------

    async def model_step(self, bundle: AuthorityBundle,
                         snapshot: StepSnapshot) -> AsyncIterator[StepEvent]:
        self._verify(bundle)
        async for event in self._model_stream(snapshot):
            yield event

    async def call_tool(self, bundle: AuthorityBundle,
                        request: ToolCallRequest) -> ToolCallResult:
        self._verify(bundle)
        # Normally ``publish("tool.requested")`` opened this call's scope in this task; a call
        # without one still gets its own, so its audit row joins the settlement all the same.
        scope = current_call(bundle.run_id, request.call_id) or begin_call(
            bundle.run_id, request.call_id)
        try:
            result = await self._call_tool(bundle, request)
        except BaseException:
            # Not settled (cancelled, rejected): whatever audit the call left is written now.
            await write_audit_rows(self._store, scope.release())
            raise
        finally:
            end_call()
        await self._journal(bundle, "tool.settled", {
            "step": request.step, "call_id": result.call_id, "name": result.name,
            "outcome": result.outcome.value, "capability": result.capability.value,
            "failure_domain": result.failure_domain.value, "content": result.content,
            "closes_turn": result.closes_turn,
        }, audit=scope.release())
        return result

    async def publish(self, bundle: AuthorityBundle, event: TraceEvent) -> None:
        self._verify(bundle)
        data = dict(event.data)
        if event.kind in LIVE_ONLY:
            self._publish_live(bundle.conversation_id, event.kind,
                               {"run_id": bundle.run_id, **data})
            return
        if event.kind == "tool.requested":
            data["arguments"] = shown_arguments(data.get("arguments"))
            await self._open_call(bundle, data)
            return
        await self._journal(bundle, event.kind, data,
                            steps=1 if event.kind == "model.step.started" else 0)

    async def publish_terminal(self, bundle: AuthorityBundle,
                               outcome: TerminalOutcome) -> bool:
        self._verify(bundle)
        data: dict[str, Any] = {}
        if outcome.answer and outcome.status.value != "completed":
            data["message"] = outcome.answer  # the member-facing fallback sentence
        return await self._lane.settle(bundle.run_id, outcome.status.value, outcome.reason,
                                       bundle.member, fence=bundle.fence, data=data)

    async def heartbeat(self, bundle: AuthorityBundle) -> None:
        self._verify(bundle)
        if not await self._lane.extend_lease(bundle.run_id, bundle.fence, self._lease):
            raise RunCancelled()

    # --- helpers ----------------------------------------------------------------------

    async def _journal(self, bundle: AuthorityBundle, kind: str, data: dict[str, Any], *,
                       steps: int = 0, audit: list[HeldAudit] | None = None) -> None:
        """Journal one event while the run is ours; ``audit`` rows go in the same
        transaction, and are written even when the run is no longer ours (the call they
        record happened all the same)."""
        try:
            async with self._store.transaction() as tx:
                conversation = await self._lane.check_live(tx, bundle.run_id, bundle.fence,
                                                           steps=steps)
                if conversation is not None:
                    await tx.append_event(conversation, kind, bundle.member, data,
                                          run_id=bundle.run_id)
                for row in audit or ():
                    await row.write(tx)
        except Exception:
            await write_audit_rows(self._store, audit or [])
            raise
        if conversation is None:
            raise RunCancelled()

    async def _open_call(self, bundle: AuthorityBundle, data: dict[str, Any]) -> None:
        """Journal ``tool.requested`` (the dispatched call crash recovery closes, R-264) and,
        in the same transaction, read the facts the call's checks re-resolve at call time:
        the run's claim and fence, the room's audience and roster, the member's approval mode
        and the tool's admin policy (R-005, R-204, R-222). The call that follows in this task
        uses them once, so a revocation still holds from the next call on."""
        async with self._store.transaction() as tx:
            opened = await open_call(tx, bundle.run_id, bundle.fence, str(data.get("name")))
            if opened is None:
                raise RunCancelled()
            conversation, facts = opened
            await tx.append_event(conversation, "tool.requested", bundle.member, data,
                                  run_id=bundle.run_id)
        begin_call(bundle.run_id, str(data.get("call_id")), facts)
