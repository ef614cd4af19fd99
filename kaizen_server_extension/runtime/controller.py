"""The turn controller: orders model steps and tool requests, and nothing more.

It is untrusted by design (spec: Runtime pipelines, R-004). It holds no data, secrets,
identity, policy or executors: it reads a fixed :class:`RunManifest` and talks to the trusted
backend only through :class:`HostPort`, presenting ``manifest.bundle`` unchanged on every call
(R-006, R-007, R-009).

Split of work with the backend
------------------------------
The controller publishes these trace events (``TraceEvent.data`` keys in brackets):

* ``model.step.started`` [step, attempt, synthesis] — before every provider exchange,
  retries included;
* ``thinking.delta`` [step, text] — live, or on release of a correction-buffered response;
  thinking never enters model history or a retry payload (R-011);
* ``answer.delta`` [step, text] — live without correction rules, on release with them; never
  while a required tool is pending;
* ``retry.scheduled`` [step, attempt, reason] — a pre-commit retry of the same snapshot; the
  reason is the content-free error code or ``empty_response``;
* ``correction.applied`` [step, rule_id, attempt] — the rule id only, never the rejected text;
* ``tool.requested`` [step, call_id, name, arguments] — immediately before
  ``HostPort.call_tool``; ``arguments`` is the raw text, which the backend redacts and bounds
  before anything stores or shows it;
* ``answer.committed`` [step, text, model, usage{prompt_tokens, completion_tokens,
  total_tokens, cost}] — just before the terminal publication;
* ``protocol.failed`` [step, protocol, reason, call_id, name, calls_not_run] — once, when a
  step asked for a staged operation it was not offered (below), just before the terminal.

The backend owns everything consequential: ``tool.settled`` (it alone knows the outcome,
duration and capability and writes the audit row), approvals, the duplicate-write and
identical-failure bounds, per-tool deadlines, usage settlement, and the compare-and-set
terminal behind ``publish_terminal``. The controller proposes exactly one terminal; when the
backend answers ``False`` (recovery or cancel settled first) it stands down quietly (R-014).

Budgets as counted here
-----------------------
``max_cycles`` bounds *rounds*: a step that dispatched tool calls, a step rejected by a
correction rule, and a step that ignored a pending required tool each use one round. A pre-commit
retry re-sends the same snapshot object and uses no round. When the rounds are spent — or the
model stops without writing an answer — the one synthesis grant runs (R-043, R-045); it is
never repeated (R-044).

Staged creation has its own allowance (``staged_protocol_rounds``, 52; R-039, R-074): a tool
round whose every call is one of ``manifest.staged_protocol`` (begin/append/finalize/discard
of a draft) draws from it instead of ``max_cycles``, so a large artifact written in bounded
pieces leaves the general budget to the rest of the turn. A round that mixes in any other
tool is a general round, and a staged round once the allowance is spent draws from the
general budget, so the two together still cap the turn. The draft's byte, sequence, owner and
fence checks are the backend's and apply to every call whichever budget paid for its round.

Unoffered staged operations (R-252): a step can ask for a staged operation that its own
advertisement did not offer — the agent has no staged writer, the step was narrowed to a
required tool, or it is the tool-less synthesis step (a stale captured step still writing its
draft). The step is then not run at all: its first such call goes to the backend marked
``refused`` (``ToolCallRequest.refused``), which journals it ``tool.requested`` and
``tool.settled`` denied with the typed reason ``staged_protocol_unavailable`` and runs
nothing; the controller publishes one ``protocol.failed`` and ends the turn ``failed`` with
that reason. It neither asks the model again nor goes to synthesis: the spec stops the attempt
rather than drive a repeated model-call loop, and an open draft stays as it is for a later
fenced turn. A name outside the staged protocol keeps the ordinary paths (the pipeline's
ceiling denial, or being held on a required-tool step).

Resuming: a recovery hands a :class:`ResumePoint` rebuilt from the journal (R-054). The
controller starts from it — committed tool rounds in the transcript, step numbers, rounds and
corrections already used — so no committed step is asked of the model again.

Inactivity: each awaited model event must arrive within ``inactivity_ms`` of the last healthy
event (measured on the injected ``clock``). While tool calls are in flight they hold the lease:
the controller heartbeats the backend every third of the budget instead of timing them out
(R-265); the backend's per-tool deadline bounds each call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kaizen_server_extension.protocol.authority import AuthorityRejected
from kaizen_server_extension.protocol.errors import RunCancelled
from kaizen_server_extension.protocol.model import (
    ModelStepError,
    StepEvent,
    StepFinished,
    StepSnapshot,
    TextDelta,
    ThinkingDelta,
    ToolCallEmitted,
)
from kaizen_server_extension.protocol.model_facing import (
    ECHO_REASON,
    ECHO_REMINDER,
    ECHO_RULE_ID,
    MAX_ECHO_RESTEPS,
    directives_in,
    echoes,
)
from kaizen_server_extension.protocol.tools import (
    STAGED_PROTOCOL_GROUP,
    STAGED_PROTOCOL_OPERATIONS,
    AdvertisedTool,
    ProtocolFailure,
    ToolCall,
    ToolCallRequest,
    ToolCallResult,
)
from kaizen_server_extension.runtime.compression import model_bound
from kaizen_server_extension.runtime.context import Transcript
from kaizen_server_extension.runtime.correction import CorrectionMatcher
from kaizen_server_extension.runtime.fallback import fallback_message
from kaizen_server_extension.runtime.port import (
    CorrectionRule,
    HostPort,
    ResumePoint,
    RunManifest,
    TerminalOutcome,
    TerminalStatus,
    TraceEvent,
    TraceKind,
)

log = logging.getLogger(__name__)

TOOL_SEARCH = "tool_search"
MAX_SEARCHES_WITHOUT_PROGRESS = 4
CORRECTION_ATTEMPTS_CAP = 3  # the setting is capped at 3 whatever the manifest says

#: Returned (not published) when the run was cancelled: whoever cancelled settles it.
CANCELLED = TerminalOutcome(TerminalStatus.CANCELLED, "cancelled")
#: Returned when ``publish_terminal`` said someone else settled the run first.
STOOD_DOWN = TerminalOutcome(TerminalStatus.CANCELLED, "stood_down")

HELD_CALL = "Not run: this step must call the tool `{tool}` first."
NOT_RUN = "Not run: the turn is closing."
REQUIRED_NUDGE = "Call the tool `{tool}` now; this request requires it."


class _Stop(Exception):
    """Internal control flow: end the run with this outcome."""

    def __init__(self, outcome: TerminalOutcome) -> None:
        super().__init__(outcome.reason)
        self.outcome = outcome


@dataclass
class _Attempt:
    """What one provider exchange produced so far."""

    text: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    committed: bool = False  # answer text reached the member: no automatic retry
    matched: CorrectionRule | None = None
    buffered: bool = False  # held until the whole response passed (corrections, echoes)

    @property
    def answer(self) -> str:
        return "".join(self.text)

    @property
    def empty(self) -> bool:
        """Neither text nor a tool call; thinking alone does not count (R-008, R-010)."""
        return not self.answer.strip() and not self.calls


@dataclass(frozen=True)
class _Sample:
    """The accepted result of one step (after its pre-commit retries)."""

    step: int
    text: str = ""
    calls: tuple[ToolCall, ...] = ()
    corrected_by: CorrectionRule | None = None
    # The reply repeated model-facing text and held no call: it is never committed.
    echoed: bool = False


class TurnController:
    """Runs one admitted turn to exactly one proposed terminal outcome."""

    def __init__(
        self,
        port: HostPort,
        manifest: RunManifest,
        *,
        clock: Callable[[], float] = time.monotonic,
        resume: ResumePoint | None = None,
    ) -> None:
        self._port = port
        self._manifest = manifest
        self._bundle = manifest.bundle
        self._clock = clock
        budgets = manifest.budgets
        self._max_cycles = max(0, budgets.max_cycles)
        self._staged_allowance = max(0, budgets.staged_protocol_rounds)
        self._staged_tools = manifest.staged_protocol
        self._max_retries = max(0, budgets.max_step_retries)
        self._max_parallel = max(1, budgets.max_parallel_tools)
        self._max_corrections = min(
            max(0, budgets.correction_max_attempts), CORRECTION_ATTEMPTS_CAP
        )
        self._inactivity_s = max(budgets.inactivity_ms, 1) / 1000
        self._matcher = CorrectionMatcher(manifest.correction_rules)
        # A required tool absent from the frozen catalog creates no requirement.
        self._required_tools: tuple[AdvertisedTool, ...] = tuple(
            t for t in manifest.catalog if t.name == manifest.required_tool
        )
        self._required = manifest.required_tool if self._required_tools else None

        self._transcript = Transcript(manifest.context)
        self._advertised: tuple[AdvertisedTool, ...] = manifest.catalog
        self._results: list[ToolCallResult] = []
        self._step = 0
        self._rounds = 0
        self._staged_rounds = 0
        self._corrections = 0
        self._echoes = 0
        # Text addressed to the model in this run (tool-result directives, the instructions
        # appended here): an answer that repeats it is never committed (model_facing.py).
        self._directives: list[str] = []
        self._searches = 0
        self._granted = False
        self._started = False
        self._last_healthy = clock()
        self._prompt_tokens = 0
        self._completion_tokens = 0
        self._cost: float | None = None
        self._model: str | None = None
        #: True once this controller's terminal won the compare-and-set; False when it stood
        #: down or the run was cancelled; None while running.
        self.settled: bool | None = None
        if resume is not None:
            self._resume_from(resume)

    def _resume_from(self, point: ResumePoint) -> None:
        """Continue a recovered run after the steps its earlier holder committed (R-054):
        their history is replayed into the transcript, not re-asked of the model, and the
        rounds, corrections and step numbers they used stay used."""
        self._transcript = Transcript((*self._manifest.context, *point.messages))
        self._step = point.steps_started
        # The journal counts every committed round alike; the staged ones among them were
        # paid from the staged allowance, exactly as _count_tool_round decided live.
        for message in point.messages:
            if message.role == "assistant" and self._is_staged_round(message.tool_calls):
                self._staged_rounds += 1
        self._rounds = max(0, point.rounds_used - self._staged_rounds)
        self._corrections = point.corrections_used
        self._results = list(point.results)
        for message in point.messages:
            if message.role == "system":
                self._directives.append(message.content)
        for result in point.results:
            self._note_directives(result)
            if result.name == TOOL_SEARCH:
                self._searches += 1
            elif not result.failed:
                self._searches = 0
        if point.required_attempted:
            self._required = None

    def _note_directives(self, result: ToolCallResult) -> None:
        for text in (*result.model_facing, *directives_in(result.content)):
            if text not in self._directives:
                self._directives.append(text)

    def _instruct(self, text: str) -> None:
        """Append a server-authored instruction; it is model-facing text from now on."""
        self._transcript.add_instruction(text)
        if text not in self._directives:
            self._directives.append(text)

    def _reveal(self, names: Sequence[str]) -> None:
        """Advertise deferred tools the backend revealed, from the next step on (R-297).
        Only names frozen into this run's deferred set can appear; the grant never grows."""
        shown = {t.name for t in self._advertised}
        extra = tuple(t for t in self._manifest.deferred
                      if t.name in names and t.name not in shown)
        if extra:
            self._advertised = self._advertised + extra

    # --- entry point ----------------------------------------------------------------

    async def run(self) -> TerminalOutcome:
        """Drive the turn and settle it; returns the outcome this controller published,
        :data:`CANCELLED` or :data:`STOOD_DOWN`."""
        if self._started:
            raise RuntimeError("a TurnController runs once")
        self._started = True
        try:
            outcome = await self._drive()
        except _Stop as stop:
            outcome = stop.outcome
        except RunCancelled:
            self.settled = False
            return CANCELLED  # the canceller settles; nothing more from us
        except AuthorityRejected:
            outcome = self._failed("authority_rejected")
        except Exception:
            log.exception("turn controller error in run %s", self._bundle.run_id)
            outcome = self._failed("controller_error")
        return await self._settle(outcome)

    async def _settle(self, outcome: TerminalOutcome) -> TerminalOutcome:
        try:
            won = await self._port.publish_terminal(self._bundle, outcome)
        except (RunCancelled, AuthorityRejected):
            won = False
        self.settled = won
        return outcome if won else STOOD_DOWN

    # --- the loop ---------------------------------------------------------------------

    async def _drive(self) -> TerminalOutcome:
        while True:
            if self._rounds >= self._max_cycles:
                if self._required is not None:
                    return self._failed("required_tool_not_called")
                return await self._synthesize()
            required = self._required
            tools = self._required_tools if required else self._advertised
            snapshot = self._transcript.snapshot(self._next_step(), tools, required_tool=required)
            # While a required tool is pending its answer text is suppressed.
            sample = await self._sample(snapshot, publish_text=required is None)
            if sample.corrected_by is not None:
                await self._correct(sample.step, sample.corrected_by)
                continue
            if sample.echoed:
                await self._reject_echo(sample.step)
                continue
            await self._stop_on_unoffered_staged(sample, tools)
            if required is not None and all(c.name != required for c in sample.calls):
                self._hold_for_required(sample.calls, required)
                continue
            if not sample.calls:
                if sample.text.strip():
                    return await self._commit(sample)
                return await self._synthesize()  # stopped without an answer
            self._count_tool_round(sample.calls)
            await self._run_tools(sample, text=sample.text if required is None else "")

    def _is_staged_round(self, calls: Sequence[ToolCall]) -> bool:
        """Whether a round with ``calls`` is paid from the staged allowance: only staged
        protocol calls, and allowance left (R-039)."""
        return (bool(calls) and self._staged_rounds < self._staged_allowance
                and all(call.name in self._staged_tools for call in calls))

    def _count_tool_round(self, calls: Sequence[ToolCall]) -> None:
        if self._is_staged_round(calls):
            self._staged_rounds += 1
        else:
            self._rounds += 1

    def _next_step(self) -> int:
        self._step += 1
        return self._step

    async def _synthesize(self) -> TerminalOutcome:
        """The one forced synthesis step, without tools (R-043..R-048)."""
        if self._granted:  # every path through here settles the run
            raise RuntimeError("the synthesis grant is never repeated")
        self._granted = True
        evidence = any(r.evidence for r in self._results)
        texts = self._manifest.synthesis
        if evidence:
            instruction = texts.with_evidence
        elif any(r.failed for r in self._results):
            instruction = texts.without_evidence_after_failure
        else:
            instruction = texts.without_evidence
        if instruction not in self._directives:
            self._directives.append(instruction)
        while True:
            snapshot = self._transcript.snapshot(self._next_step(), (), instruction=instruction)
            sample = await self._sample(snapshot, publish_text=True, synthesis=True)
            if sample.corrected_by is not None:
                await self._correct(sample.step, sample.corrected_by)
                continue
            if sample.echoed:
                # The grant is not repeated: say plainly what failed instead.
                return self._failed(ECHO_REASON)
            if sample.text.strip():
                return await self._commit(sample)
            if sample.calls:
                # No tool was offered here, so a staged call is a stale step still writing a
                # draft; anything else is tool activity without a final answer, which
                # is non-delivery. Either way nothing is dispatched.
                await self._stop_on_unoffered_staged(sample, ())
                return self._failed("non_delivery")
            if evidence:
                return self._failed("empty_response")
            return self._outcome(TerminalStatus.ANSWER_UNAVAILABLE, "answer_unavailable")

    async def _correct(self, step: int, rule: CorrectionRule) -> None:
        """Discard the rejected response, record only the rule id, append the reminder
        (R-016); resample only within both budgets, else fail without releasing (R-022).

        The rejected step uses a round. Rejecting the last regular round leaves the resample
        to the synthesis grant; rejecting the grant itself once the rounds are spent fails."""
        self._rounds += 1
        if self._corrections >= self._max_corrections or self._rounds > self._max_cycles:
            raise _Stop(self._failed("correction_exhausted"))
        self._corrections += 1
        await self._publish(
            "correction.applied",
            {"step": step, "rule_id": rule.id, "attempt": self._corrections},
        )
        self._instruct(rule.reminder)

    async def _reject_echo(self, step: int) -> None:
        """The reply repeated model-facing text (a repair instruction) as its answer: it is
        discarded unseen. The step is asked again once, with a reminder, at the cost of a
        round; after that the turn ends saying plainly what failed and why (R-022, R-023)."""
        self._rounds += 1
        if self._echoes >= MAX_ECHO_RESTEPS:
            raise _Stop(self._failed(ECHO_REASON))
        self._echoes += 1
        await self._publish(
            "correction.applied",
            {"step": step, "rule_id": ECHO_RULE_ID, "attempt": self._echoes},
        )
        self._instruct(ECHO_REMINDER)

    async def _stop_on_unoffered_staged(
        self, sample: _Sample, offered: Sequence[AdvertisedTool]
    ) -> None:
        """Stop the attempt when the step asked for a staged operation that ``offered`` (what
        this step advertised) did not include (R-252).

        Only the first such call is sent, marked ``refused``, for the backend to journal as
        denied with the typed reason; no other call of the step is requested, and exactly one
        ``protocol.failed`` is published however many staged calls the step held. The turn
        then ends: asking again would only repeat the stale step."""
        names = {t.name for t in offered}
        stale = next((c for c in sample.calls
                      if c.name in STAGED_PROTOCOL_OPERATIONS and c.name not in names), None)
        if stale is None:
            return
        reason = ProtocolFailure.STAGED_PROTOCOL_UNAVAILABLE
        await self._publish(
            "tool.requested", {"step": sample.step, "call_id": stale.call_id,
                               "name": stale.name, "arguments": stale.arguments}
        )
        result = await self._port.call_tool(
            self._bundle,
            ToolCallRequest(stale.call_id, stale.name, stale.arguments, sample.step,
                            refused=reason),
        )
        self._touch()
        self._results.append(result)
        await self._publish(
            "protocol.failed",
            {"step": sample.step, "protocol": STAGED_PROTOCOL_GROUP, "reason": reason.value,
             "call_id": stale.call_id, "name": stale.name,
             "calls_not_run": len(sample.calls) - 1},
        )
        raise _Stop(self._failed(reason.value))

    def _hold_for_required(self, calls: tuple[ToolCall, ...], required: str) -> None:
        """A reply that did not call the pending required tool costs a round and is asked
        again; substitute calls are held, never dispatched, and prose stays suppressed (R-304).
        """
        self._rounds += 1
        if calls:
            self._transcript.add_assistant("", calls)
            for call in calls:
                self._transcript.add_tool_result(call, HELD_CALL.format(tool=required))
            self._directives.append(HELD_CALL.format(tool=required))
        self._instruct(REQUIRED_NUDGE.format(tool=required))

    async def _commit(self, sample: _Sample) -> TerminalOutcome:
        if echoes(sample.text, self._directives):  # never reached through _sample; kept tight
            return self._failed(ECHO_REASON)
        await self._publish(
            "answer.committed",
            {
                "step": sample.step,
                "text": sample.text,
                "model": self._model,
                "usage": {
                    "prompt_tokens": self._prompt_tokens,
                    "completion_tokens": self._completion_tokens,
                    "total_tokens": self._prompt_tokens + self._completion_tokens,
                    "cost": self._cost,
                },
            },
        )
        return TerminalOutcome(TerminalStatus.COMPLETED, "answered", sample.text)

    def _failed(self, reason: str) -> TerminalOutcome:
        return self._outcome(TerminalStatus.FAILED, reason)

    def _outcome(self, status: TerminalStatus, reason: str) -> TerminalOutcome:
        """A non-answer terminal carries the member-facing fallback text in ``answer``."""
        return TerminalOutcome(status, reason, fallback_message(reason, self._results))

    # --- one model step -----------------------------------------------------------------

    async def _sample(
        self, snapshot: StepSnapshot, *, publish_text: bool, synthesis: bool = False
    ) -> _Sample:
        """One step with its bounded pre-commit retries, each re-sending ``snapshot`` itself
        (R-008, R-009)."""
        retries = 0
        while True:
            attempt = _Attempt()
            await self._publish(
                "model.step.started",
                {"step": snapshot.step, "attempt": retries + 1, "synthesis": synthesis},
            )
            try:
                await self._stream(snapshot, attempt, publish_text=publish_text)
            except ModelStepError as error:
                # Deterministic failures are never replayed; nothing is retried after a
                # commit or past the retry budget.
                if not error.retryable or attempt.committed or retries >= self._max_retries:
                    raise _Stop(self._failed(error.code)) from None
                reason = error.code
            else:
                if attempt.matched is not None:
                    return _Sample(snapshot.step, corrected_by=attempt.matched)
                if not attempt.empty:
                    if attempt.answer.strip() and echoes(attempt.answer, self._directives):
                        # Model-facing text is never shown: a reply with calls keeps them
                        # without its text; an answer alone is rejected.
                        if not attempt.calls:
                            return _Sample(snapshot.step, echoed=True)
                        attempt.text = []
                    await self._release(snapshot.step, attempt, publish_text=publish_text)
                    return _Sample(snapshot.step, attempt.answer, tuple(attempt.calls))
                if retries >= self._max_retries:
                    return _Sample(snapshot.step)
                reason = "empty_response"
            retries += 1
            await self._publish(
                "retry.scheduled",
                {"step": snapshot.step, "attempt": retries + 1, "reason": reason},
            )

    async def _stream(
        self, snapshot: StepSnapshot, attempt: _Attempt, *, publish_text: bool
    ) -> None:
        # Correction rules, or model-facing text in the transcript: hold everything until the
        # whole response passed.
        buffered = bool(self._matcher) or bool(self._directives)
        attempt.buffered = buffered
        scanner = self._matcher.scanner() if self._matcher else None
        self._touch()
        stream = self._port.model_step(self._bundle, snapshot)
        try:
            while (event := await self._next_event(stream)) is not None:
                if isinstance(event, ThinkingDelta):
                    if buffered:
                        attempt.thinking.append(event.text)
                    else:
                        await self._publish(
                            "thinking.delta", {"step": snapshot.step, "text": event.text}
                        )
                elif isinstance(event, TextDelta):
                    attempt.text.append(event.text)
                    if scanner is not None and scanner.feed(event.text) is not None:
                        attempt.matched = scanner.matched  # buffered thinking dies here
                        return
                    if publish_text and not buffered:
                        await self._stream_text(snapshot.step, attempt, event.text)
                elif isinstance(event, ToolCallEmitted):
                    attempt.calls.append(event.call)  # dispatched only after the step ends
                elif isinstance(event, StepFinished):
                    self._record_usage(event)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    async def _stream_text(self, step: int, attempt: _Attempt, text: str) -> None:
        """Live text: leading whitespace is held back so that an all-blank reply stays an
        empty, retryable exchange instead of a commit."""
        if attempt.committed:
            await self._publish("answer.delta", {"step": step, "text": text})
        elif text.strip():
            attempt.committed = True
            await self._publish("answer.delta", {"step": step, "text": attempt.answer})

    async def _release(self, step: int, attempt: _Attempt, *, publish_text: bool) -> None:
        """A buffered response passed its correction rules: show it now (R-015)."""
        if not attempt.buffered:
            return
        for text in attempt.thinking:
            await self._publish("thinking.delta", {"step": step, "text": text})
        if publish_text and attempt.answer:
            attempt.committed = True
            await self._publish("answer.delta", {"step": step, "text": attempt.answer})

    async def _next_event(self, stream: AsyncIterator[StepEvent]) -> StepEvent | None:
        remaining = self._inactivity_s - (self._clock() - self._last_healthy)
        if remaining <= 0:
            raise _Stop(self._failed("inactivity_budget_exhausted"))
        try:
            async with asyncio.timeout(remaining):
                event = await anext(stream)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            raise _Stop(self._failed("inactivity_budget_exhausted")) from None
        if self._clock() - self._last_healthy > self._inactivity_s:
            raise _Stop(self._failed("inactivity_budget_exhausted"))
        self._touch()
        return event

    def _touch(self) -> None:
        self._last_healthy = self._clock()

    def _record_usage(self, finished: StepFinished) -> None:
        self._prompt_tokens += finished.usage.prompt_tokens
        self._completion_tokens += finished.usage.completion_tokens
        if finished.usage.cost is not None:
            self._cost = (self._cost or 0.0) + finished.usage.cost
        if finished.model is not None:
            self._model = finished.model

    # --- tools ------------------------------------------------------------------------

    async def _run_tools(self, sample: _Sample, *, text: str) -> None:
        required = self._required
        plan = [(call, required is None or call.name == required) for call in sample.calls]
        self._transcript.add_assistant(text, sample.calls)
        settled = await self._dispatch(sample.step, [call for call, runs in plan if runs])
        if required is not None:
            self._required = None  # attempted: the full catalog is back next step
        outcomes = iter(settled)
        for call, runs in plan:
            if not runs:
                content = HELD_CALL.format(tool=required)
            else:
                result = next(outcomes)
                content = NOT_RUN if result is None else model_bound(
                    result, enabled=self._manifest.compress_tool_results)
            self._transcript.add_tool_result(call, content)

        done = [r for r in settled if r is not None]
        closing = next((r for r in done if r.closes_turn), None)
        if closing is not None:
            raise _Stop(self._failed(closing.close_reason or "tool_closed_turn"))
        for result in done:
            if result.name == TOOL_SEARCH:
                self._searches += 1
            elif not result.failed:
                self._searches = 0  # a successful call to another tool resets
        if self._searches >= MAX_SEARCHES_WITHOUT_PROGRESS:
            raise _Stop(self._failed("tool_discovery_exhausted"))

    async def _dispatch(self, step: int, calls: Sequence[ToolCall]) -> list[ToolCallResult | None]:
        """Run calls at most ``max_parallel_tools`` at a time (a server-side bound the model
        cannot choose, R-295), heartbeating while any is in flight. A call not yet started
        when another one closes the turn is not dispatched (``None``)."""
        gate = asyncio.Semaphore(self._max_parallel)
        closing = False

        async def one(call: ToolCall) -> ToolCallResult | None:
            nonlocal closing
            async with gate:
                if closing:
                    return None
                await self._publish(
                    "tool.requested", {"step": step, "call_id": call.call_id, "name": call.name,
                                       "arguments": call.arguments}
                )
                result = await self._port.call_tool(
                    self._bundle,
                    ToolCallRequest(call.call_id, call.name, call.arguments, step),
                )
                self._touch()
                self._results.append(result)
                self._note_directives(result)
                self._reveal(result.reveals)
                closing = closing or result.closes_turn
                return result

        if not calls:
            return []
        tasks = [asyncio.create_task(one(call)) for call in calls]
        calls_done = asyncio.gather(*tasks)
        beat = asyncio.create_task(self._heartbeat())
        racing: set[asyncio.Future[Any]] = {calls_done, beat}
        try:
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            if beat.done():
                beat.result()  # raises RunCancelled (or whatever stopped the heartbeat)
            return list(calls_done.result())
        finally:
            pending: list[asyncio.Future[Any]] = [beat, *tasks]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, calls_done, return_exceptions=True)

    async def _heartbeat(self) -> None:
        """Hold the inactivity lease while tool calls run (R-265)."""
        period = max(self._inactivity_s / 3, 0.001)
        while True:
            await asyncio.sleep(period)
            await self._port.heartbeat(self._bundle)
            self._touch()

    async def _publish(self, kind: TraceKind, data: dict[str, Any]) -> None:
        await self._port.publish(self._bundle, TraceEvent(kind, data))
