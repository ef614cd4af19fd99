"""The pure applier: concrete hunks + a before-image → the after-image (HASHLINE.md §4, §6).

All hunks of a section address one frozen before-image. Registers are read and written in
authored order (``Registers`` is the call's working copy). Output is produced per original
line L in the order: rows inserted by ``<L``, replacement rows of a span starting at L, line L
unless consumed, rows inserted by ``>L``; head rows come first and tail rows last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kaizen_hashline.errors import HashlineError
from kaizen_hashline.syntax import Hunk

GapKind = Literal["head", "tail", "before", "after"]


@dataclass(slots=True)
class Registers:
    """The call's working copy of the clipboard.

    The anonymous register lives for one call; named registers come from, and after the
    commit go back to, the trusted session state.
    """

    named: dict[str, tuple[str, ...]] = field(default_factory=dict)
    anonymous: tuple[str, ...] | None = None
    pending_anonymous: int = 0  # unlabeled CUTs since the last unlabeled paste

    @classmethod
    def from_session(cls, named: Mapping[str, Sequence[str]]) -> Registers:
        return cls(named={k: tuple(v) for k, v in named.items()})

    def cut(self, name: str | None, rows: Sequence[str]) -> None:
        if name is None:
            self.anonymous = tuple(rows)
            self.pending_anonymous += 1
        else:
            self.named[name] = tuple(rows)

    def paste(self, name: str | None, *, span: bool, where: str,
              warnings: list[str]) -> tuple[str, ...] | None:
        """The rows to paste, or None for a named gap paste of an empty register (no-op)."""
        if name is None:
            if span:  # the parser already refuses this shape
                raise HashlineError(f"{where}: an anonymous register cannot be pasted over a "
                                    "span; name it", code="colonless_span_put")
            if self.anonymous is None:
                raise HashlineError(f"{where}: nothing to paste: no CUT has filled the "
                                    "anonymous register in this call", code="empty_paste")
            if self.pending_anonymous >= 2:
                raise HashlineError(f"{where}: ambiguous paste: {self.pending_anonymous} "
                                    "unlabeled CUTs are pending; label them (CUT … @name, "
                                    "PUT … @name)", code="ambiguous_paste")
            self.pending_anonymous = 0
            return self.anonymous
        rows = self.named.get(name)
        if rows is None or (span and not rows):
            if span:
                raise HashlineError(
                    f"{where}: register @{name} is empty or unknown; a span paste of nothing "
                    f"would delete the span (known: {self._known()})", code="empty_register")
            warnings.append(f"{where}: register @{name} is empty or unknown, nothing pasted "
                            f"(known: {self._known()})")
            return None
        return rows

    def _known(self) -> str:
        return ", ".join(f"@{k}" for k in sorted(self.named)) or "none"


@dataclass(slots=True)
class Concrete:
    """A hunk with its locator resolved to concrete lines of the base text.

    Exactly one of ``span`` (inclusive, consumed) and ``gap`` is set.
    """

    hunk: Hunk
    span: tuple[int, int] | None = None
    gap: tuple[GapKind, int] | None = None
    # For ``>N*``: the resolved block, whose lines are anchors for stale recovery.
    block_span: tuple[int, int] | None = None

    @property
    def label(self) -> str:
        return f"{self.hunk.render()} (edit line {self.hunk.line_no})"


@dataclass(slots=True)
class Applied:
    rows: list[str]
    # For each output row: the 1-based base line it is, or None for an inserted row.
    provenance: list[int | None]
    warnings: list[str]


def apply_hunks(base: Sequence[str], hunks: Sequence[Concrete],
                registers: Registers) -> Applied:
    """Apply ``hunks`` (authored order) to ``base``; registers are updated in place."""
    n = len(base)
    warnings: list[str] = []
    consumed: dict[int, int] = {}  # line -> index into hunks
    replacement: dict[int, tuple[int, list[str]]] = {}  # start line -> (hunk index, rows)
    spans: dict[int, tuple[int, int]] = {}  # hunk index -> span
    before: dict[int, list[str]] = {}
    after: dict[int, list[str]] = {}
    head: list[str] = []
    tail: list[str] = []

    for index, item in enumerate(hunks):
        hunk = item.hunk
        if item.span is not None:
            start, end = item.span
            if not (1 <= start <= end <= n):
                raise HashlineError(
                    f"{item.label}: line {start if start > n or start < 1 else end} does not "
                    f"exist (the file has {n} lines)", code="out_of_range")
            for line in (start, end):
                other = consumed.get(line)
                if other is None:
                    continue
                if spans.get(other) == (start, end) and not hunks[other].hunk.uses_register:
                    warnings.append(f"{hunks[other].label} is replaced by the later "
                                    f"{item.label} on the same lines")
                    for ln in range(start, end + 1):
                        consumed.pop(ln, None)
                    replacement.pop(start, None)
                    spans.pop(other, None)
                    break
            for line in range(start, end + 1):
                other = consumed.get(line)
                if other is not None:
                    raise HashlineError(
                        f"{item.label} and {hunks[other].label} both consume line {line}; "
                        "every original line may be replaced, cut or pasted over by one hunk "
                        "only", code="overlapping_hunks")
            rows: list[str]
            if hunk.verb == "CUT":
                registers.cut(hunk.register, base[start - 1:end])
                rows = []
            elif hunk.paste:
                pasted = registers.paste(hunk.register, span=True, where=item.label,
                                         warnings=warnings)
                rows = list(pasted or ())
            else:
                rows = list(hunk.body or ())
            for line in range(start, end + 1):
                consumed[line] = index
            spans[index] = (start, end)
            replacement[start] = (index, rows)
            continue
        assert item.gap is not None
        kind, line = item.gap
        if kind in ("before", "after") and not 1 <= line <= n:
            raise HashlineError(f"{item.label}: line {line} does not exist (the file has {n} "
                                "lines)", code="out_of_range")
        if hunk.paste:
            pasted = registers.paste(hunk.register, span=False, where=item.label,
                                     warnings=warnings)
            if pasted is None:
                continue
            rows = list(pasted)
        else:
            rows = list(hunk.body or ())
        if kind == "head":
            head.extend(rows)
        elif kind == "tail":
            tail.extend(rows)
        elif kind == "before":
            before.setdefault(line, []).extend(rows)
        else:
            after.setdefault(line, []).extend(rows)

    out: list[str] = []
    prov: list[int | None] = []

    def emit(rows: Sequence[str]) -> None:
        out.extend(rows)
        prov.extend([None] * len(rows))

    emit(head)
    for line in range(1, n + 1):
        emit(before.get(line, ()))
        if line in replacement:
            emit(replacement[line][1])
        if line not in consumed:
            out.append(base[line - 1])
            prov.append(line)
        emit(after.get(line, ()))
    emit(tail)
    return Applied(out, prov, warnings)
