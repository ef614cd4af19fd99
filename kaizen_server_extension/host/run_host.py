"""The trusted side of :class:`HostPort` for one admitted run.

Every call first compares the presented bundle with the admitted one, field by field; any
difference is rejected, not reconciled (R-007). Durable trace events are journaled only
while the run is still ours (status active, fence unchanged), in the same transaction as
that check. Each of those transactions is one unit run straight on the driver
(store/units.py; on PostgreSQL one statement, store/run_journal.py): they are the store's
hot path, two per tool call.

Durability: the records of a call to a tool that may have effects (anything but a read) are
committed durably before the call runs and after it settles: crash recovery needs to know
that a write was dispatched (R-264). The records of a read, and of model steps, may commit
without waiting for PostgreSQL's log flush; the next durable commit flushes them, and only a
crash of the database server in between loses them (SQLite's WAL mode gives the same
guarantee for every commit: see store/engine.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, Protocol

from kaizen_server_extension.host.store_ports import HeldCallAudit
from kaizen_server_extension.policy.citations import (
    check_citations,
    evidence_references,
    retrieved_sources,
    with_sources,
)
from kaizen_server_extension.policy.grounding import (
    NO_SUPPORT_ANSWER,
    NO_SUPPORT_REASON,
    SEARCH_MODE,
    Retrieved,
    unsupported_answer,
)
from kaizen_server_extension.policy.redaction import redact, redact_text, withhold
from kaizen_server_extension.protocol.authority import (
    AuthorityBundle,
    AuthorityRejected,
    verify_bundle,
)
from kaizen_server_extension.protocol.errors import RunCancelled
from kaizen_server_extension.protocol.model import StepEvent, StepSnapshot
from kaizen_server_extension.protocol.model_facing import ECHO_REASON, directives_in, echoes
from kaizen_server_extension.protocol.tools import StoredFile, ToolCallRequest, ToolCallResult
from kaizen_server_extension.runtime.fallback import fallback_message
from kaizen_server_extension.runtime.port import TerminalOutcome, TerminalStatus, TraceEvent
from kaizen_server_extension.store.calls import CallFacts, HeldAudit, write_audit_rows
from kaizen_server_extension.store.run_journal import (
    journal_while_live,
    one_statement,
    open_call_journaled,
)
from kaizen_server_extension.store.runs import RunLane
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.tools import canvas
from kaizen_server_extension.tools.ports import CallScope

log = logging.getLogger("kaizen.lanes")

#: Trace kinds that are shown live but never stored (API.md: live only).
LIVE_ONLY = frozenset({"answer.delta", "thinking.delta"})

ModelStream = Callable[[StepSnapshot], AsyncIterator[StepEvent]]
LivePublisher = Callable[[str, str, dict[str, Any]], None]


class ToolCaller(Protocol):
    """A run's guarded tool caller: ``scope`` is what the dispatcher read for the call and
    where its audit goes (none: the call's checks read their own, its audit is written at
    once)."""

    def __call__(self, bundle: AuthorityBundle, request: ToolCallRequest,
                 scope: CallScope | None = None, /) -> Awaitable[ToolCallResult]: ...


#: Longest argument text journaled for observers; the tool still gets the whole of it.
MAX_SHOWN_ARGUMENT_CHARS = 4000


def shown_arguments(raw: object, withheld: frozenset[str] = frozenset()) -> object:
    """Arguments as observers may see them: parsed when JSON, what the tool keeps in the
    backend (``withheld``, R-225) reduced to its size, credentials redacted, bounded."""
    if not isinstance(raw, str):
        return None
    try:
        value: object = json.loads(raw)
    except ValueError:
        # Not JSON: the tool will refuse it, but its text may still be what it withholds.
        value = {"withheld": True, "chars": len(raw)} if withheld else raw
    shown = redact(withhold(value, withheld))
    text = json.dumps(shown, ensure_ascii=False)
    if len(text) > MAX_SHOWN_ARGUMENT_CHARS:
        return {"truncated": True, "preview": text[:MAX_SHOWN_ARGUMENT_CHARS]}
    return shown


#: The tool whose calls declare their output files up front (``artifact_targets``, R-235), so
#: each declared name can be shown as a generation placeholder before the call runs (R-236).
GENERATING_TOOL = "run_code"


def generation_placeholders(name: str, raw_arguments: object) -> list[dict[str, str]] | None:
    """The non-downloadable placeholders a call publishes before it runs (R-236): one per
    declared target of a run_code call whose arguments pass the tool's own schema and target
    rules, under the normalised name its file would be stored by (redacted like the journaled
    arguments). None for any other tool, and for arguments the tool refuses: such a call
    settles before anything runs, so nothing is being generated. Never read from the raw
    text of an invalid call."""
    if name != GENERATING_TOOL or not isinstance(raw_arguments, str):
        return None
    # Imported here: the kernel package is loaded only where run_code is in use.
    from kaizen_kernel.schema import RunCodeArgumentsError, parse_arguments

    try:
        arguments = parse_arguments(raw_arguments)
    except RunCodeArgumentsError:
        return None
    return [{"target": redact_text(target)} for target in arguments.artifact_targets]


def stored_files_data(files: tuple[StoredFile, ...]) -> list[dict[str, Any]]:
    """The ``files`` of ``tool.settled``: each durable file by the declared target it fills,
    named as the placeholder named it (R-236)."""
    return [{"target": redact_text(f.target), "artifact_id": f.artifact_id,
             "version": f.version, "filename": redact_text(f.filename),
             "media_type": f.media_type} for f in files]


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
        read_tools: frozenset[str] = frozenset(),
        withheld_arguments: Mapping[str, frozenset[str]] | None = None,
        settled: Iterable[ToolCallResult] = (),
        mode: str = "chat",
        attached_evidence: bool = False,
        delegation: Mapping[str, Any] | None = None,
    ) -> None:
        self._store = store
        self._lane = lane
        self._admitted = bundle
        self._model_stream = model_stream
        self._call_tool = call_tool
        self._publish_live = publish_live
        self._lease = lease
        # Tools of the frozen catalog that only read: their records need not be flushed.
        self._read_tools = read_tools
        # Per frozen tool, the arguments observers never see.
        self._withheld = withheld_arguments or {}
        # What each call's checks read when its ``tool.requested`` was journaled, by call id,
        # until the call is dispatched (``call_tool`` hands them to it, once).
        self._opened: dict[str, CallFacts] = {}
        # The publication guard's memory: this run's settled results (those a resumed run
        # settled earlier included) and the model-facing text they carried.
        self._settled: list[ToolCallResult] = []
        self._model_facing: list[str] = []
        self._refused_answer = False
        # The agent's mode and whether the turn has attached files: what the grounding
        # guard reads besides the settled calls.
        self._mode = mode
        self._attached_evidence = attached_evidence
        # Set for a delegated child's host: every event it journals carries this marker, so
        # observers and recovery tell the child's activity from the run's own.
        self._delegation = dict(delegation) if delegation is not None else None
        # (settled calls read, unsupported then): the grounding guard's last reading.
        self._support_read: tuple[int, bool] = (-1, False)
        for result in settled:
            self._remember(result)

    def _remember(self, result: ToolCallResult) -> None:
        self._settled.append(result)
        for text in (*result.model_facing, *directives_in(result.content)):
            if text not in self._model_facing:
                self._model_facing.append(text)

    def _verify(self, bundle: AuthorityBundle) -> None:
        try:
            verify_bundle(self._admitted, bundle)
        except AuthorityRejected as rejected:
            log.warning("run %s: rejected a call whose authority bundle differs in %s",
                        self._admitted.run_id, ", ".join(rejected.fields))
            raise

    # --- HostPort ---------------------------------------------------------------------

    async def model_step(self, bundle: AuthorityBundle,
                         snapshot: StepSnapshot) -> AsyncIterator[StepEvent]:
        self._verify(bundle)
        async for event in self._model_stream(snapshot):
            yield event

    async def call_tool(self, bundle: AuthorityBundle,
                        request: ToolCallRequest) -> ToolCallResult:
        self._verify(bundle)
        # Normally ``publish("tool.requested")`` read this call's facts; a call without them
        # has its authority check read its own. Its audit joins the settlement either way.
        audit = HeldCallAudit(self._store)
        scope = CallScope(facts=self._opened.pop(request.call_id, None), audit=audit)
        try:
            result = await self._call_tool(bundle, request, scope)
        except BaseException:
            # Not settled (cancelled, rejected): whatever audit the call left is written now.
            await write_audit_rows(self._store, audit.release())
            raise
        # The canvas is materialized with the event that publishes it. One that cannot be
        # shown is dropped and its on-screen claims withdrawn; the outcome stands (R-277,
        # The model gets the very content journaled, so a resumed run reads the same.
        shown = canvas.materialize(result, run_id=bundle.run_id)
        result = shown.result
        settled: dict[str, Any] = {
            "step": request.step, "call_id": result.call_id, "name": result.name,
            "outcome": result.outcome.value, "capability": result.capability.value,
            "failure_domain": result.failure_domain.value, "content": result.content,
            "closes_turn": result.closes_turn,
        }
        if result.delegated:
            # The call handed work to another agent, whose own activity the run's calls do
            # not show: a fallback asks the member to check it, after a resume too.
            settled["delegated"] = True
        if result.denied is not None:
            # The typed reason a protocol operation was refused before it ran.
            settled["denied"] = result.denied.value
        if result.files or request.name == GENERATING_TOOL:
            # What the call's placeholders become; a declared target without an entry was not
            # produced, and its placeholder goes.
            settled["files"] = stored_files_data(result.files)
        if shown.data is not None:
            settled["canvas"] = shown.data
        elif shown.dropped:
            settled["canvas_dropped"] = True
        durable = request.name not in self._read_tools
        try:
            await self._journal(bundle, "tool.settled", settled, audit=audit.release(),
                                durable=durable)
        except RunCancelled:
            raise
        except Exception as exc:
            if shown.data is None:
                raise
            # Journaling the canvas failed (nothing was committed, and the failed attempt
            # wrote the audit rows on its own): the call settles all the same, without it.
            result = canvas.drop(result, f"journal_failed: {type(exc).__name__}",
                                 run_id=bundle.run_id).result
            del settled["canvas"]
            settled.update(content=result.content, canvas_dropped=True)
            await self._journal(bundle, "tool.settled", settled, durable=durable)
        self._remember(result)
        return result

    async def publish(self, bundle: AuthorityBundle, event: TraceEvent) -> None:
        self._verify(bundle)
        data = dict(event.data)
        if event.kind == "answer.delta" and self._unsupported():
            # A grounded turn without support publishes the no-support statement instead of
            # this text (vetted_answer), so its guess is not streamed to observers either.
            return
        if event.kind in LIVE_ONLY:
            self._publish_live(bundle.conversation_id, event.kind,
                               {"run_id": bundle.run_id, **data})
            return
        if event.kind == "tool.settled":
            # Only the backend settles a call (``call_tool`` journals the outcome and the
            # stored files): one published by the controller could forge either.
            log.warning("run %s: dropped a tool.settled published by the controller",
                        bundle.run_id)
            return
        if event.kind == "tool.requested":
            # Placeholders are the backend's own reading of the validated arguments; anything
            # the controller put under that name is discarded.
            data.pop("placeholders", None)
            placeholders = generation_placeholders(str(data.get("name")), data.get("arguments"))
            if placeholders is not None:
                data["placeholders"] = placeholders
            data["arguments"] = shown_arguments(
                data.get("arguments"), self._withheld.get(str(data.get("name")), frozenset()))
            await self._open_call(bundle, data)
            return
        if event.kind == "answer.committed" and echoes(str(data.get("text", "")),
                                                       self._model_facing):
            # The publication guard: text addressed to the model is never the
            # member's answer, whatever the controller decided. The terminal says plainly
            # what failed instead (publish_terminal).
            log.warning("run %s: refused an answer that repeats model-facing text",
                        bundle.run_id)
            self._refused_answer = True
            return
        if event.kind == "answer.committed":
            text, notes = self.vetted_answer(str(data.get("text", "")))
            data.update(notes, text=text)
        await self._journal(bundle, event.kind, data,
                            steps=1 if event.kind == "model.step.started" else 0,
                            durable=False)

    def vetted_answer(self, text: str) -> tuple[str, dict[str, Any]]:
        """The answer as it may be published, and what the guards changed (journaled with it).

        * Citation discipline (R-071): a Kaizen reference the answer cites must be one this
          turn's own successful tool results carried; any other is removed
          (policy/citations.py).
        * Grounding (R-103): a grounded turn that found no support publishes the policy's
          statement that it found none instead of what the model wrote (policy/grounding.py).
        """
        notes: dict[str, Any] = {}
        run_id = self._admitted.run_id
        if self._unsupported():
            if text.strip() != NO_SUPPORT_ANSWER:
                log.warning("run %s: a grounded answer without support was replaced by the "
                            "policy's no-support statement", run_id)
                notes.update(grounding=NO_SUPPORT_REASON, replaced_chars=len(text))
            return NO_SUPPORT_ANSWER, notes
        succeeded = [(r.name, r.content) for r in self._settled if not r.failed]
        checked = check_citations(text, evidence_references(succeeded))
        if checked.removed:
            log.warning("run %s: removed %d citation(s) not among this turn's evidence",
                        run_id, len(checked.removed))
            notes["citations_removed"] = len(checked.removed)
        if self._mode != SEARCH_MODE:
            return checked.text, notes
        # A Search answer points at what it rests on, cited by the model or else listed here.
        answer, listed = with_sources(checked.text, retrieved_sources(succeeded))
        if listed:
            notes["sources_listed"] = listed
        return answer, notes

    def _unsupported(self) -> bool:
        """Whether this turn is grounded and, with what it has settled so far, unsupported
        (R-103). Read once per settled call, not once per streamed delta."""
        if self._support_read[0] != len(self._settled):
            self._support_read = (len(self._settled), unsupported_answer(
                self._mode, (Retrieved(r.name, r.content, r.failed, r.evidence)
                                for r in self._settled),
                attached_evidence=self._attached_evidence))
        return self._support_read[1]

    def settled_results(self) -> tuple[ToolCallResult, ...]:
        """This host's settled results so far (a delegated child's evidence)."""
        return tuple(self._settled)

    async def publish_terminal(self, bundle: AuthorityBundle,
                               outcome: TerminalOutcome) -> bool:
        self._verify(bundle)
        if outcome.status is TerminalStatus.COMPLETED and (
                self._refused_answer or echoes(outcome.answer or "", self._model_facing)):
            outcome = TerminalOutcome(TerminalStatus.FAILED, ECHO_REASON,
                                      fallback_message(ECHO_REASON, self._settled))
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
                       steps: int = 0, audit: list[HeldAudit] | None = None,
                       durable: bool) -> None:
        """Journal one event while the run is ours; ``audit`` rows go in the same
        transaction, and are written even when the run is no longer ours (the call they
        record happened all the same)."""
        notify = self._store.notifies
        if self._delegation is not None:
            data = {**data, "delegation": self._delegation}
        held = audit or []
        try:
            conversation = await self._store.run(
                journal_while_live(bundle.run_id, bundle.fence, kind, bundle.member, data,
                                   steps=steps, audit=held, notify=notify),
                durable=durable, single_statement=one_statement(notify, held))
        except Exception:
            await write_audit_rows(self._store, held)
            raise
        if conversation is None:
            raise RunCancelled()

    async def _open_call(self, bundle: AuthorityBundle, data: dict[str, Any]) -> None:
        """Journal ``tool.requested`` (the dispatched call crash recovery closes, R-264) and,
        in the same transaction, read the facts the call's checks re-resolve at call time:
        the run's claim and fence, the room's audience and roster, the member's approval mode
        and the tool's admin policy (R-005, R-204, R-222). The call that follows in this task
        uses them once, so a revocation still holds from the next call on."""
        name = str(data.get("name"))
        notify = self._store.notifies
        if self._delegation is not None:
            data = {**data, "delegation": self._delegation}
        facts = await self._store.run(
            open_call_journaled(bundle.run_id, bundle.fence, name, bundle.member, data,
                                notify=notify),
            durable=name not in self._read_tools, single_statement=notify)
        if facts is None:
            raise RunCancelled()
        self._opened[str(data.get("call_id"))] = facts
