"""Conditional stream correction: the matcher and the controller's use of it."""

from __future__ import annotations

import pytest

from kaizen_server_extension.protocol.model import TextDelta, ThinkingDelta
from kaizen_server_extension.runtime.correction import CorrectionMatcher
from kaizen_server_extension.runtime.port import Budgets, CorrectionRule, TerminalStatus

from .fakes import FakeHost, calls, drive, finished, say

RULE = CorrectionRule(id="no-guarantee", pattern="I guarantee", reminder="REMINDER: no promises.")


# --- the matcher ----------------------------------------------------------------------


@pytest.mark.rule("R-019")
def test_matching_is_case_insensitive_and_literal() -> None:
    matcher = CorrectionMatcher(
        [CorrectionRule("dots", "a.*b", "r"), CorrectionRule("case", "StraSSe", "r")]
    )
    assert matcher.find("xx A.*B yy") is matcher.rules[0]
    assert matcher.find("aXXb") is None  # no regex semantics
    assert matcher.find("die straße") is matcher.rules[1]  # casefold: ß == ss
    assert matcher.find("nothing here") is None


@pytest.mark.rule("R-019")
def test_a_pattern_split_across_deltas_is_found() -> None:
    scanner = CorrectionMatcher([RULE]).scanner()
    assert scanner.feed("well, I gua") is None
    assert scanner.feed("RANTEE it") is RULE


@pytest.mark.rule("R-019")
def test_the_first_occurrence_wins_and_ties_go_to_the_earlier_rule() -> None:
    rules = [
        CorrectionRule("late", "bcd", "r"),
        CorrectionRule("early", "ab", "r"),
        CorrectionRule("same-end", "b", "r"),
    ]
    matcher = CorrectionMatcher(rules)
    # "ab" and "b" both end at index 1, before "bcd" ends: the lower index of those wins.
    assert matcher.find("abcd").id == "early"  # type: ignore[union-attr]
    assert CorrectionMatcher([]).find("anything") is None
    assert not CorrectionMatcher([CorrectionRule("empty", "", "r")])


@pytest.mark.rule("R-019")
@pytest.mark.parametrize("size", [1_000, 10_000, 100_000])
def test_scanning_cost_is_linear_on_adversarial_input(size: int) -> None:
    """Counts automaton moves instead of timing: patterns that share long prefixes with the
    input force fail-link walks, yet the moves never exceed 2 per input character. A
    backtracking matcher would do O(n * m) work here."""
    rules = [CorrectionRule(f"r{k}", "a" * k + "b", "r") for k in (10, 50, 200)]
    rules.append(CorrectionRule("ab-run", "ab" * 100 + "c", "r"))
    scanner = CorrectionMatcher(rules).scanner()
    text = ("a" * 199 + "c") * (size // 200) + "ab" * (size // 4)
    assert scanner.feed(text) is None
    assert scanner.transitions <= 2 * len(text)


# --- the controller -------------------------------------------------------------------


@pytest.mark.rule("R-012", "R-015", "R-016")
async def test_a_match_discards_the_response_records_only_the_id_and_resamples() -> None:
    host = FakeHost(
        [
            [ThinkingDelta("hidden musing"), TextDelta("Sure, i GUARANTEE success"), finished()],
            [ThinkingDelta("second thoughts"), TextDelta("It should work."), finished()],
        ]
    )
    outcome = await drive(host, correction_rules=(RULE,))

    assert outcome.status is TerminalStatus.COMPLETED
    assert outcome.answer == "It should work."
    assert host.of("correction.applied") == [{"step": 1, "rule_id": "no-guarantee", "attempt": 1}]
    seen = host.published_text()
    assert "GUARANTEE" not in seen and "hidden musing" not in seen  # never visible
    assert [t["text"] for t in host.of("thinking.delta")] == ["second thoughts"]
    first, second = host.snapshots
    assert second is not first
    assert second.messages[-1].content == "REMINDER: no promises."
    assert all("GUARANTEE" not in m.content for m in second.messages)


@pytest.mark.rule("R-015")
async def test_with_rules_nothing_is_visible_until_the_response_passes() -> None:
    host = FakeHost([say("Fine", " answer")])
    await drive(host, correction_rules=(RULE,))

    assert host.log.index("yield:StepFinished") < host.log.index("publish:answer.delta")


@pytest.mark.rule("R-022")
async def test_exhaustion_fails_the_turn_and_never_releases_the_rejected_text() -> None:
    host = FakeHost([say("I guarantee REJECTED-A"), say("I Guarantee REJECTED-B")])
    outcome = await drive(
        host, correction_rules=(RULE,), budgets=Budgets(correction_max_attempts=1)
    )

    assert outcome.status is TerminalStatus.FAILED
    assert outcome.reason == "correction_exhausted"
    assert "REJECTED" not in host.published_text()
    assert host.of("answer.delta") == [] and host.of("answer.committed") == []
    assert len(host.snapshots) == 2


@pytest.mark.rule("R-016", "R-017")
async def test_correction_attempts_are_capped_at_three() -> None:
    host = FakeHost([say("I guarantee") for _ in range(6)])
    outcome = await drive(
        host, correction_rules=(RULE,), budgets=Budgets(correction_max_attempts=9, max_cycles=20)
    )

    assert outcome.reason == "correction_exhausted"
    assert len(host.of("correction.applied")) == 3
    assert len(host.snapshots) == 4


@pytest.mark.rule("R-016")
async def test_resampling_stays_within_the_cycle_budget() -> None:
    host = FakeHost([calls(("c1", "search_docs")), [TextDelta("I guarantee"), finished()]])
    outcome = await drive(
        host, correction_rules=(RULE,), budgets=Budgets(max_cycles=1, correction_max_attempts=3)
    )

    # The only round was spent on tools; the synthesis step's rejection cannot resample.
    assert outcome.reason == "correction_exhausted"
    assert host.of("correction.applied") == []
    assert len(host.snapshots) == 2


@pytest.mark.rule("R-021")
async def test_text_released_in_an_earlier_step_is_never_rewound() -> None:
    host = FakeHost(
        [
            [TextDelta("Let me check."), *calls(("c1", "search_docs"))],
            [TextDelta("I guarantee it"), finished()],
            say("Checked: it works."),
        ]
    )
    outcome = await drive(host, correction_rules=(RULE,))

    assert outcome.answer == "Checked: it works."
    deltas = [d["text"] for d in host.of("answer.delta")]
    assert deltas == ["Let me check.", "Checked: it works."]
    last = host.snapshots[-1]
    assert any(m.role == "assistant" and m.content == "Let me check." for m in last.messages)
