"""Stale-anchor recovery (HASHLINE.md §7.2 b): relocate unchanged anchors onto one region.

The retained snapshot (old) and the live file (new) are diffed line by line
(``difflib.SequenceMatcher`` without autojunk). Every anchor line must be an unchanged line;
per contiguous run of anchors the context rule must hold; and all anchors must shift by one
and the same offset. Anything else is refused before anything is written.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kaizen_hashline.errors import HashlineError


@dataclass(frozen=True, slots=True)
class Remap:
    offset: int


MAX_DIFF_REGION = 20_000


def line_map(old: Sequence[str], new: Sequence[str]) -> dict[int, int]:
    """1-based old line → 1-based new line, for every line the diff keeps unchanged.

    The common prefix and suffix are matched directly; only the changed middle goes through
    ``SequenceMatcher`` (quadratic in the worst case), and a middle larger than
    ``MAX_DIFF_REGION`` lines on both sides maps nothing there (recovery then refuses).
    """
    head = 0
    limit = min(len(old), len(new))
    while head < limit and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < limit - head and old[len(old) - 1 - tail] == new[len(new) - 1 - tail]:
        tail += 1
    mapping: dict[int, int] = {i + 1: i + 1 for i in range(head)}
    for k in range(tail):
        mapping[len(old) - k] = len(new) - k
    old_mid = list(old[head:len(old) - tail])
    new_mid = list(new[head:len(new) - tail])
    if old_mid and new_mid and min(len(old_mid), len(new_mid)) <= MAX_DIFF_REGION:
        matcher = difflib.SequenceMatcher(None, old_mid, new_mid, autojunk=False)
        for block in matcher.get_matching_blocks():
            for k in range(block.size):
                mapping[head + block.a + k + 1] = head + block.b + k + 1
    return mapping


def runs(lines: Iterable[int]) -> list[tuple[int, int]]:
    ordered = sorted(set(lines))
    out: list[tuple[int, int]] = []
    for line in ordered:
        if out and out[-1][1] + 1 == line:
            out[-1] = (out[-1][0], line)
        else:
            out.append((line, line))
    return out


def remap(old: Sequence[str], new: Sequence[str], anchors: Iterable[int], *,
          path: str) -> Remap:
    """The single offset moving every anchor from ``old`` to ``new``, or a refusal."""
    anchor_set = set(anchors)
    if not anchor_set:
        return Remap(0)
    mapping = line_map(old, new)
    changed = sorted(a for a in anchor_set if a not in mapping)
    if changed:
        shown = ", ".join(str(a) for a in changed[:10])
        raise HashlineError(
            f"{path} changed since the read: anchor line(s) {shown} of the tagged snapshot were "
            "changed or deleted; re-read the file and edit with the new tag",
            code="stale_tag")
    old_count = Counter(old)
    new_count = Counter(new)
    offsets: set[int] = set()
    for start, end in runs(anchor_set):
        shift = mapping[start] - start
        for line in range(start, end + 1):
            if mapping[line] - line != shift:
                raise _ambiguous(path, line)
        duplicate = any(old_count[old[line - 1]] > 1 or new_count[old[line - 1]] > 1
                        for line in range(start, end + 1))
        neighbours = [ln for ln in (start - 1, end + 1) if 1 <= ln <= len(old)]
        agreeing = [ln for ln in neighbours
                    if ln in mapping and mapping[ln] - ln == shift]
        if duplicate:
            ok = bool(neighbours) and len(agreeing) == len(neighbours)
        else:
            ok = bool(agreeing)
        if not ok:
            raise _ambiguous(path, start)
        offsets.add(shift)
    if len(offsets) != 1:
        raise HashlineError(
            f"{path} changed since the read and the anchors would move by different amounts "
            f"({', '.join(f'{o:+d}' for o in sorted(offsets))}); only one contiguous region can "
            "be relocated. Re-read the file and edit with the new tag",
            code="ambiguous_anchor")
    return Remap(offsets.pop())


def _ambiguous(path: str, line: int) -> HashlineError:
    return HashlineError(
        f"{path} changed since the read and anchor line {line} cannot be relocated without "
        "ambiguity (its surroundings moved or it repeats); re-read the file and edit with the "
        "new tag", code="ambiguous_anchor")
