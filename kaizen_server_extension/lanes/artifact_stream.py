"""What one model step's streamed artifact-tool arguments may leave behind.

A provider streams a tool call's arguments as fragments. For ``update_artifact`` the target is
an owner-resolved artifact, so as soon as the buffered text names a complete ``artifact_id``
the private building row opens (owner-only; a foreign or missing id opens nothing) and every
later fragment advances it, fenced by owner, run and call. A cut stream interrupts that row,
which the next turn's retry resumes (R-245). ``create_artifact`` fragments are only buffered in
memory: no incomplete create opens a durable checkpoint, so an interrupted create leaves
nothing (R-109, R-111); a completed one is parsed strictly by the pipeline as one ordinary call.

The completed call still goes through the ordinary guarded pipeline; ``update_artifact`` then
freezes the same row (:meth:`UpdateCheckpoints.freeze`). Only a step that advertises
``update_artifact`` is observed, so an unauthorized call never opens anything. Nor is a step
whose update would first wait for the member's decision under their approval mode: the next
version may open only after that approval (R-244), so the call's fragments stay in memory and
its row opens when the approved call completes, in the transaction that freezes it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol, cast

from kaizen_server_extension.host.store_ports import StoreApprovalModes
from kaizen_server_extension.models.assembly import ToolArgumentsDelta
from kaizen_server_extension.policy.approvals import decide
from kaizen_server_extension.policy.declared import DeclaredTool
from kaizen_server_extension.protocol.errors import MemberError
from kaizen_server_extension.protocol.model import StepEvent, StepFinished, StepSnapshot
from kaizen_server_extension.store.artifacts.checkpoints import (
    CheckpointRecord,
    CheckpointScope,
    UpdateCheckpoints,
)
from kaizen_server_extension.store.store import Store

log = logging.getLogger(__name__)

UPDATE_TOOL = "update_artifact"
# A complete string value for the key; a prefix of the id is never enough to open a row.
_ARTIFACT_ID = re.compile(r'"artifact_id"\s*:\s*"([A-Za-z0-9_-]{1,64})"')


@dataclass
class _Call:
    name: str
    buffered: list[str] = field(default_factory=list)
    checkpoint: CheckpointRecord | None = None
    # The stream named an id the member does not own: nothing opens for this call.
    unresolvable: bool = False


class ArtifactArgumentStream:
    """Observes one step's tool-call argument fragments for one member's turn."""

    def __init__(self, checkpoints: UpdateCheckpoints, *, owner: str, conversation_id: str,
                 run_id: str) -> None:
        self._checkpoints = checkpoints
        self._owner = owner
        self._conversation = conversation_id
        self._run = run_id
        self._calls: dict[str, _Call] = {}

    def _scope(self, call_id: str) -> CheckpointScope:
        return CheckpointScope(self._owner, self._conversation, self._run, call_id)

    async def fragment(self, call_id: str, name: str, text: str) -> None:
        """One argument fragment of ``call_id`` as it arrives."""
        call = self._calls.setdefault(call_id, _Call(name))
        call.buffered.append(text)
        if call.name != UPDATE_TOOL or call.unresolvable:
            return  # creates (and every other tool) are only buffered in memory
        if call.checkpoint is None:
            match = _ARTIFACT_ID.search("".join(call.buffered))
            if match is None:
                return
            try:
                call.checkpoint = await self._checkpoints.open(self._scope(call_id),
                                                               match.group(1))
            except MemberError:
                call.unresolvable = True  # foreign, missing or busy: the call fails later
                return
            text = "".join(call.buffered)
        held = call.checkpoint
        call.checkpoint = await self._checkpoints.advance(
            self._scope(call_id), held.checkpoint_id, held.fence, text)

    def arguments(self, call_id: str) -> str:
        """The complete buffered arguments of a finished call."""
        return "".join(self._calls[call_id].buffered)

    def checkpoint(self, call_id: str) -> CheckpointRecord | None:
        call = self._calls.get(call_id)
        return call.checkpoint if call is not None else None

    async def interrupted(self) -> None:
        """The stream was cut: building rows become resumable; buffered creates are gone."""
        for call_id, call in self._calls.items():
            if call.checkpoint is not None:
                held = call.checkpoint
                try:
                    await self._checkpoints.interrupt(self._scope(call_id), held.checkpoint_id,
                                                      held.fence)
                except MemberError:
                    pass  # already taken over by a later holder: theirs now
        self._calls.clear()


class _StepStreams(Protocol):
    def stream_step(self, snapshot: StepSnapshot, *,
                    model: str | None = None) -> AsyncIterator[StepEvent]: ...


async def checkpointed_step(gateway: _StepStreams, snapshot: StepSnapshot, *, model: str,
                            store: Store, owner: str, conversation_id: str, run_id: str,
                            update_tool: DeclaredTool | None) -> AsyncIterator[StepEvent]:
    """One model step's events, with live update_artifact arguments checkpointed.

    A gateway without ``stream_step_with_arguments`` (or a step that does not advertise
    update_artifact, or whose update would wait for an approval) streams exactly as before.
    The fragments are consumed here; the turn controller sees only the ordinary events. A step
    that ends without ``StepFinished`` (cut, failed, cancelled, or abandoned by its consumer)
    interrupts what it opened.
    """
    with_arguments = cast(
        "Callable[..., AsyncIterator[StepEvent | ToolArgumentsDelta]] | None",
        getattr(gateway, "stream_step_with_arguments", None))
    if with_arguments is None or update_tool is None \
            or UPDATE_TOOL not in {t.name for t in snapshot.tools} \
            or await _update_waits_for_approval(store, owner, update_tool):
        async for event in gateway.stream_step(snapshot, model=model):
            yield event
        return
    watcher: ArtifactArgumentStream | None = ArtifactArgumentStream(
        UpdateCheckpoints(store), owner=owner, conversation_id=conversation_id, run_id=run_id)
    finished = False
    try:
        async for streamed in with_arguments(snapshot, model=model):
            if isinstance(streamed, ToolArgumentsDelta):
                if watcher is not None:
                    watcher = await _observe(watcher, streamed)
                continue
            finished = finished or isinstance(streamed, StepFinished)
            yield streamed
    finally:
        if watcher is not None and not finished:
            await _interrupt(watcher)


async def _update_waits_for_approval(store: Store, owner: str, update_tool: DeclaredTool) -> bool:
    """Whether ``owner``'s update_artifact call (as the run's frozen catalog declares it)
    would wait for their decision under their current approval mode. A mode that cannot be
    read counts as asking, as the pipeline treats it, so no row opens ahead of a decision
    that may be required."""
    try:
        mode = await StoreApprovalModes(store).mode_for(owner)
    except Exception:
        log.warning("approval mode unreadable; not checkpointing this step", exc_info=True)
        return True
    return decide(mode, update_tool).needs_approval


async def _observe(watcher: ArtifactArgumentStream,
                   event: ToolArgumentsDelta) -> ArtifactArgumentStream | None:
    try:
        await watcher.fragment(event.call_id, event.name, event.text)
        return watcher
    except Exception:
        # The checkpoint is a recovery aid: losing it must not fail the model step. The
        # completed call still freezes through the ordinary update path.
        log.warning("artifact checkpoint observer stopped for this step", exc_info=True)
        await _interrupt(watcher)
        return None


async def _interrupt(watcher: ArtifactArgumentStream) -> None:
    try:
        await watcher.interrupted()
    except Exception:
        log.warning("could not mark an artifact checkpoint interrupted", exc_info=True)



