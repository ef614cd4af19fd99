"""Conditional stream correction: case-insensitive literal matching in linear time (R-019).

Operators author a few literal response patterns (already bounded before the manifest is
written, R-018). The controller feeds a step's answer text through a :class:`CorrectionScanner`
as it streams; the first pattern found decides the correction. No regular expressions are
involved: the patterns form an Aho-Corasick automaton over their case-folded text, so scanning
costs O(len(text)) transitions however the patterns overlap, plus O(total pattern length) to
build. ``str.casefold`` maps each code point independently, so folding chunk by chunk gives the
same text as folding the whole response, and a pattern split across two deltas is still found.

This is a model-quality mechanism, not an authorization control (R-023, R-096): nothing here
can grant, approve or execute anything.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from kaizen_server_extension.runtime.port import CorrectionRule

_ROOT = 0


class CorrectionMatcher:
    """The automaton for one run's fixed rule set (built once, shared by every step)."""

    def __init__(self, rules: Sequence[CorrectionRule]) -> None:
        self.rules: tuple[CorrectionRule, ...] = tuple(rules)
        self._goto: list[dict[str, int]] = [{}]
        self._fail: list[int] = [_ROOT]
        # The lowest rule index that ends at this state (directly or through fail links).
        self._out: list[int | None] = [None]
        for index, rule in enumerate(self.rules):
            self._insert(rule.pattern.casefold(), index)
        self._link()

    def __bool__(self) -> bool:
        return any(out is not None for out in self._out)

    def _insert(self, pattern: str, index: int) -> None:
        if not pattern:
            return  # an empty pattern would match everything: it is not a usable rule
        state = _ROOT
        for char in pattern:
            nxt = self._goto[state].get(char)
            if nxt is None:
                nxt = len(self._goto)
                self._goto[state][char] = nxt
                self._goto.append({})
                self._fail.append(_ROOT)
                self._out.append(None)
            state = nxt
        current = self._out[state]
        self._out[state] = index if current is None else min(current, index)

    def _link(self) -> None:
        queue: deque[int] = deque(self._goto[_ROOT].values())
        while queue:
            state = queue.popleft()
            for char, child in self._goto[state].items():
                fallback = self._fail[state]
                while fallback != _ROOT and char not in self._goto[fallback]:
                    fallback = self._fail[fallback]
                self._fail[child] = self._goto[fallback].get(char, _ROOT)
                inherited = self._out[self._fail[child]]
                own = self._out[child]
                if inherited is not None and (own is None or inherited < own):
                    self._out[child] = inherited
                queue.append(child)

    def scanner(self) -> CorrectionScanner:
        """A fresh scan state for one response."""
        return CorrectionScanner(self)

    def find(self, text: str) -> CorrectionRule | None:
        """The rule whose pattern occurs first in ``text`` (ties: the earlier rule)."""
        return self.scanner().feed(text)


class CorrectionScanner:
    """Incremental scan of one response. ``transitions`` counts automaton moves, so a test can
    check the linear bound by counting work instead of timing it."""

    def __init__(self, matcher: CorrectionMatcher) -> None:
        self._matcher = matcher
        self._state = _ROOT
        self.matched: CorrectionRule | None = None
        self.transitions = 0

    def feed(self, text: str) -> CorrectionRule | None:
        """Scan the next chunk; returns the matched rule once one is found (then sticky)."""
        if self.matched is not None:
            return self.matched
        goto, fail, out = self._matcher._goto, self._matcher._fail, self._matcher._out
        state = self._state
        for char in text.casefold():
            # Each fail move strictly shortens the current match depth, and each character
            # adds at most one level, so the moves over a whole response are at most 2n.
            while state != _ROOT and char not in goto[state]:
                state = fail[state]
                self.transitions += 1
            state = goto[state].get(char, _ROOT)
            self.transitions += 1
            hit = out[state]
            if hit is not None:
                self._state = state
                self.matched = self._matcher.rules[hit]
                return self.matched
        self._state = state
        return None
