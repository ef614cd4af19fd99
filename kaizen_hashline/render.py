"""What the model sees: the ``[PATH#TAG]`` view, mismatch context rows, bounded diffs."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kaizen_hashline.limits import MAX_READ_LINES as MAX_READ_LINES
from kaizen_hashline.recovery import runs

MAX_READ_CHARS = 120_000
MAX_LINE_CHARS = 4000
MAX_DIFF_LINES = 400
MAX_DIFF_CHARS = 40_000
# MemberSafeError messages are cut at 500 characters by the pipeline: context and reveals that
# claim lines were "shown" must fit well inside that.
MAX_ERROR_CONTEXT_CHARS = 300
MAX_ERROR_LINE_CHARS = 120
MAX_ERROR_MESSAGE_CHARS = 490


def room_left(message: str) -> int:
    """Characters left for rows after ``message`` within the model-visible error budget."""
    return max(0, min(MAX_ERROR_CONTEXT_CHARS, MAX_ERROR_MESSAGE_CHARS - len(message) - 1))


def header(path: str, tag: str) -> str:
    return f"[{path}#{tag}]"


def compress(lines: Iterable[int]) -> str:
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs(lines))


@dataclass(frozen=True, slots=True)
class View:
    text: str
    start: int
    end: int  # last displayed line (start - 1 when none)
    shown: frozenset[int]
    cut_lines: int


def render_view(path: str, tag: str, rows: Sequence[str], start: int, limit: int) -> View:
    """``[PATH#TAG]`` then ``N:TEXT`` rows from ``start``, at most ``limit`` lines."""
    out = [header(path, tag)]
    chars = len(out[0])
    shown: set[int] = set()
    cut = 0
    end = start - 1
    for number in range(start, min(len(rows), start + limit - 1) + 1):
        text = rows[number - 1]
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + f"…[+{len(text) - MAX_LINE_CHARS} chars]"
            cut += 1
        row = f"{number}:{text}"
        if shown and chars + len(row) + 1 > MAX_READ_CHARS:
            break
        out.append(row)
        chars += len(row) + 1
        shown.add(number)
        end = number
    return View("\n".join(out), start, end, frozenset(shown), cut)


def context_rows(rows: Sequence[str], anchors: Iterable[int], *, radius: int = 2,
                 budget: int = MAX_ERROR_CONTEXT_CHARS) -> tuple[str, set[int]]:
    """``N:TEXT`` rows ±radius around anchors (anchors marked ``*``), ``...`` between runs.

    Returns the text and the lines displayed in full (a row cut for length is not).
    """
    anchor_set = {a for a in anchors if 1 <= a <= len(rows)}
    wanted: set[int] = set()
    for a in anchor_set:
        wanted.update(range(max(1, a - radius), min(len(rows), a + radius) + 1))
    out: list[str] = []
    full: set[int] = set()
    used = 0
    previous: int | None = None
    for number in sorted(wanted):
        text = rows[number - 1]
        whole = len(text) <= MAX_ERROR_LINE_CHARS
        shown_text = text if whole else text[:MAX_ERROR_LINE_CHARS] + "…"
        row = f"{'*' if number in anchor_set else ''}{number}:{shown_text}"
        if previous is not None and number != previous + 1:
            row = "...\n" + row
        if used + len(row) + 1 > budget:
            out.append("…")
            break
        out.append(row)
        used += len(row) + 1
        previous = number
        if whole:
            full.add(number)
    return "\n".join(out), full


@dataclass(slots=True)
class DiffBuilder:
    """Unified diffs (difflib) of every section, bounded in lines and characters."""

    max_lines: int = MAX_DIFF_LINES
    max_chars: int = MAX_DIFF_CHARS
    truncated: bool = False
    _out: list[str] = field(default_factory=list)
    _chars: int = 0

    def add(self, old_path: str, new_path: str, old: Sequence[str], new: Sequence[str]) -> None:
        for line in difflib.unified_diff(list(old), list(new), fromfile=f"a/{old_path}",
                                         tofile=f"b/{new_path}", lineterm="", n=2):
            if len(self._out) >= self.max_lines or self._chars + len(line) + 1 > self.max_chars:
                self.truncated = True
                return
            self._out.append(line)
            self._chars += len(line) + 1

    def text(self) -> str:
        body = "\n".join(self._out)
        if self.truncated:
            body += "\n…[diff truncated; read the files for the full result]"
        return body
