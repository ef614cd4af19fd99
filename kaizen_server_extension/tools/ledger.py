"""Per-turn memory of tool calls: duplicates, repeated failures, refusals and tool health.

One :class:`TurnLedger` belongs to one run and lives in the trusted host's memory; nothing in
it outlives the turn, so asking again in a later turn gets a genuine second copy (R-284). The
ledger only decides and remembers; the pipeline turns its decisions into results.

Rules, each written once here rather than inside whichever tool was abused:

* **Duplicate writes** (R-279..R-288). A tool that declared ``repeat_creates_object`` whose name
  and byte-identical arguments already *succeeded* in an earlier step of this turn does not run;
  the earlier result comes back as ``suppressed``. Identical calls in the same step both run
  (the model asked for two). Failed writes and approval cards are never recorded as successes.
* **Identical failed input** (R-273). A call byte-identical to one that failed, with no
  successful call of any tool since, is refused: resending what just failed is never the
  repair, whoever's failure it was. A success in between may have changed the world (the file
  the program needed now exists), so it clears the memory. A ``tool_search`` changes nothing,
  so it does not: this bound stays separate from the discovery bound (R-259).
* **Tool health** (R-270, R-271). A tool's own failures on :data:`DEFAULT_HEALTH_LIMIT`
  genuinely different requests cut it off for the rest of the turn. Relayed caller failures
  never count; the same failing request counts once.
* **Escalating refusals** (R-289, R-290). Every refusal and suppression is a result, never a
  closed turn; after :data:`DEFAULT_COACHING_REFUSALS` of them for one tool the wording stops
  coaching and tells the model to stop calling the tool and answer with what it has.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from kaizen_server_extension.protocol.tools import (
    FailureDomain,
    ToolCallRequest,
    ToolCallResult,
    ToolOutcome,
)
from kaizen_server_extension.tools.catalog import TOOL_SEARCH_NAME
from kaizen_server_extension.tools.types import ToolDescriptor

# Three distinct own failures: one can be bad luck, two a bad argument pattern, three is a tool
# that cannot do its job this turn.
DEFAULT_HEALTH_LIMIT = 3
# Two coaching refusals per tool, then the closing wording.
DEFAULT_COACHING_REFUSALS = 2

_Key = tuple[str, str]  # (tool name, raw argument text): byte identity, no normalization


@dataclass(frozen=True, slots=True)
class LedgerDecision:
    """The ledger's answer to a call that must not run."""

    outcome: ToolOutcome  # SUPPRESSED or ERROR
    content: str
    reason_code: str
    escalated: bool = False


@dataclass(slots=True)
class _Success:
    step: int
    content: str


@dataclass
class TurnLedger:
    health_limit: int = DEFAULT_HEALTH_LIMIT
    coaching_refusals: int = DEFAULT_COACHING_REFUSALS
    _successes: dict[_Key, _Success] = field(default_factory=dict)
    _failed_since_success: set[_Key] = field(default_factory=set)
    _own_failures: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    _refusals: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))

    # --- decisions -------------------------------------------------------------------------

    def check(self, descriptor: ToolDescriptor, request: ToolCallRequest) -> LedgerDecision | None:
        """Refuse or suppress the call, or None to let it run."""
        name, key = request.name, (request.name, request.arguments)
        if self.is_cut_off(name):
            return self._refuse(
                name, "tool_cut_off",
                f"{name} has failed on {self.health_limit} different requests in this turn and "
                "is unavailable for the rest of it. Use another tool or answer with what you "
                "have.",
            )
        if key in self._failed_since_success:
            return self._refuse(
                name, "identical_failure_refused",
                f"This exact {name} call just failed, and sending the same input again will "
                "not fix it. Change the arguments, use another tool, or answer with what you "
                "have.",
            )
        earlier = self._successes.get(key) if descriptor.repeat_creates_object else None
        if earlier is not None and earlier.step != request.step:
            return self._suppress(name, earlier)
        return None

    def is_cut_off(self, name: str) -> bool:
        return len(self._own_failures.get(name, ())) >= self.health_limit

    # --- memory ----------------------------------------------------------------------------

    def record(
        self, descriptor: ToolDescriptor, request: ToolCallRequest, result: ToolCallResult
    ) -> None:
        """Remember a call that reached validation or execution (not refusals or approvals)."""
        key = (request.name, request.arguments)
        if result.outcome is ToolOutcome.OK:
            if request.name != TOOL_SEARCH_NAME:
                self._failed_since_success.clear()
            if descriptor.repeat_creates_object:
                self._successes.setdefault(key, _Success(request.step, result.content))
            return
        if not result.failed:
            return
        self._failed_since_success.add(key)
        if result.failure_domain is FailureDomain.TOOL:
            self._own_failures[request.name].add(request.arguments)

    # --- wording ---------------------------------------------------------------------------

    def _escalate(self, name: str) -> bool:
        self._refusals[name] += 1
        return self._refusals[name] > self.coaching_refusals

    def _closing(self, name: str) -> str:
        return (f"Stop calling {name}: it has been refused repeatedly in this turn. Answer the "
                "member now with what you have.")

    def _refuse(self, name: str, code: str, coaching: str) -> LedgerDecision:
        escalated = self._escalate(name)
        content = self._closing(name) if escalated else coaching
        return LedgerDecision(ToolOutcome.ERROR, content, code, escalated)

    def _suppress(self, name: str, earlier: _Success) -> LedgerDecision:
        escalated = self._escalate(name)
        note = (
            f"Nothing new was created: an identical {name} call already succeeded earlier in "
            "this turn, and its result is repeated above. Refer to what exists; if a second "
            "copy is really wanted, vary the arguments."
        )
        if escalated:
            note = f"{note} {self._closing(name)}"
        return LedgerDecision(
            ToolOutcome.SUPPRESSED, f"{earlier.content}\n\n{note}", "duplicate_suppressed",
            escalated,
        )
