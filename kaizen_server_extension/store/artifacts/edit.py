"""The narrow Hashline subset artifact edits use (HASHLINE.md §2, §3, §4): the content tag, the
numbered view, and ranged ``PUT A.=B:`` / ``CUT A.=B`` hunks on one displayed base.

Artifacts are not sandbox files (R-089): there are no paths, registers, gap inserts, syntax
blocks, REM or MV here, and no stale-anchor recovery. Every number refers to the displayed
immutable version; a hunk that overlaps another or leaves the file is refused before anything
is applied, and the hunks apply bottom-up as one edit (R-092, R-161).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal


def normalize(text: str) -> str:
    """Hashline's text normalization (imported on first use: the Hashline package is not
    loaded at start-up, tests/test_lazy_imports.py)."""
    from kaizen_hashline.text import normalize as hashline_normalize

    return hashline_normalize(text)


def compute_tag(text: str) -> str:
    from kaizen_hashline.text import compute_tag as hashline_tag

    return hashline_tag(text)


MAX_HUNKS = 32
MAX_WINDOW_LINES = 400

class EditError(ValueError):
    """A patch that cannot apply: its message tells the model what to fix."""


def content_tag(text: str) -> str:
    """The four-hex tag of the whole normalized text: a lookup key, never a credential.
    The same tag as a workspace file with this text (one Hashline implementation)."""
    return compute_tag(normalize(text))


def split_lines(text: str) -> list[str]:
    """Addressable lines: the newline that ends the text is not a line of its own."""
    text = normalize(text)
    if not text:
        return []
    if text.endswith("\n"):
        text = text[:-1]
    return text.split("\n")


def numbered_window(text: str, start: int, count: int) -> tuple[str, int, int]:
    """Rows ``N:TEXT`` from ``start`` for at most ``count`` lines: (rows, total, last line)."""
    lines = split_lines(text)
    total = len(lines)
    count = max(1, min(count, MAX_WINDOW_LINES))
    if total == 0:
        return "", 0, 0
    if start < 1 or start > total:
        raise EditError(f"start_line {start} is outside the artifact (it has {total} lines).")
    end = min(total, start + count - 1)
    rows = "\n".join(f"{n}:{lines[n - 1]}" for n in range(start, end + 1))
    return rows, total, end


@dataclass(frozen=True, slots=True)
class Hunk:
    op: Literal["PUT", "CUT"]
    start: int
    end: int
    rows: tuple[str, ...] = ()


_LINE = r"([1-9][0-9]*)"
_HEADER = re.compile(r"^\[([^#\r\n\]]*)#([0-9A-Fa-f]{4})\]\s*$")
_PUT = re.compile(rf"^\s*PUT\s+{_LINE}\.={_LINE}\s*:\s*$")
_CUT = re.compile(rf"^\s*CUT\s+{_LINE}\.={_LINE}\s*$")
_KEYWORD = re.compile(r"^\s*(PUT|CUT|REM|MV)(\s|:|$)")
_SUPPORTED = ("Artifact edits support only ranged hunks: 'PUT A.=B:' followed by '+' rows, and "
              "'CUT A.=B'")


def parse_hunks(patch: str, *, expected_tag: str) -> list[Hunk]:
    """Parse ranged PUT/CUT hunks; an optional ``[artifact#TAG]`` header must carry the tag."""
    hunks: list[Hunk] = []
    current: tuple[int, int] | None = None  # an open PUT and its range
    rows: list[str] = []
    pending_blanks = 0

    def close_put() -> None:
        nonlocal current, rows, pending_blanks
        if current is not None:
            if not rows:
                raise EditError(f"PUT {current[0]}.={current[1]}: has no '+' rows; to delete "
                                f"lines use CUT {current[0]}.={current[1]}.")
            hunks.append(Hunk("PUT", current[0], current[1], tuple(rows)))
        current, rows, pending_blanks = None, [], 0

    seen_header = False
    for raw in normalize(patch).split("\n"):
        line = raw
        stripped = line.strip()
        if stripped in ("*** Begin Patch",):
            continue
        if stripped in ("*** End Patch", "*** Abort"):
            break
        if current is not None and line.startswith("+"):
            rows.extend([""] * pending_blanks)
            pending_blanks = 0
            rows.append(line[1:])
            continue
        if not stripped:
            if current is not None:
                pending_blanks += 1
            continue
        header = _HEADER.match(stripped)
        if header:
            if seen_header or hunks or current is not None:
                raise EditError("An artifact edit has exactly one section; put the header "
                                "first, once.")
            seen_header = True
            if header.group(2).upper() != expected_tag.upper():
                raise EditError(f"The header tag #{header.group(2).upper()} does not match "
                                f"the artifact's tag #{expected_tag}; read it again.")
            continue
        put, cut = _PUT.match(line), _CUT.match(line)
        if put or cut:
            close_put()
            match = put or cut
            assert match is not None
            start, end = int(match.group(1)), int(match.group(2))
            if end < start:
                raise EditError(f"Range {start}.={end} ends before it starts.")
            if cut:
                hunks.append(Hunk("CUT", start, end))
            else:
                current = (start, end)
            continue
        if _KEYWORD.match(line):
            raise EditError(f"{_SUPPORTED}; not {stripped[:60]!r}.")
        if line.startswith("+"):
            raise EditError("A '+' row must follow a 'PUT A.=B:' header.")
        raise EditError(f"Unexpected line {stripped[:60]!r}. {_SUPPORTED}.")
    close_put()
    if not hunks:
        raise EditError(f"The edit contains no hunks. {_SUPPORTED}.")
    if len(hunks) > MAX_HUNKS:
        raise EditError(f"One edit may contain at most {MAX_HUNKS} hunks; this one has "
                        f"{len(hunks)}.")
    return hunks


def apply_hunks(base: str, hunks: list[Hunk]) -> str:
    """Check bounds and overlap against the base, then apply bottom-up as one edit."""
    text = normalize(base)
    lines = split_lines(text)
    total = len(lines)
    ordered = sorted(hunks, key=lambda h: (h.start, h.end))
    for hunk in ordered:
        if hunk.end > total:
            raise EditError(f"Line {hunk.end} does not exist: the displayed version has "
                            f"{total} lines.")
    for before, after in pairwise(ordered):
        if after.start <= before.end:
            raise EditError(f"Hunks {before.start}.={before.end} and {after.start}.="
                            f"{after.end} overlap; each line may be changed by one hunk.")
    for hunk in reversed(ordered):
        lines[hunk.start - 1:hunk.end] = list(hunk.rows)
    if not lines:
        return ""
    joined = "\n".join(lines)
    return joined + "\n" if text.endswith("\n") or not text else joined
