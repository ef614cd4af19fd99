"""Read and edit one workspace with Hashline: the orchestration over the pure parts.

``read_file`` renders the ``[PATH#TAG]`` view and records the full normalized text (plus the
lines actually displayed) in trusted state. ``edit_files`` parses a program, preflights every
section (path checks, tag authority, seen-line guard, block resolution, stale recovery,
register sequencing, in-memory apply, size limits, destination checks) before anything is
written, then commits all sections as one :class:`~kaizen_hashline.fs.Transaction` and
only then updates snapshots and publishes named registers.

Stricter than the TypeScript reference, on purpose (tags are not authority, R-082):

* a tag must have been issued for that path in this (actor, conversation) namespace, even
  when the live file still hashes to it (the reference accepts any matching tag);
* REM and MV-only sections need the live file to be exactly the tagged version;
* the seen-line guard runs on the stale path too (against the tagged snapshot) and is always
  on; a version whose seen set is empty guards every anchor;
* writes are all-or-nothing (the reference reports half-written calls).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kaizen_hashline import render
from kaizen_hashline.apply import Concrete, Registers, apply_hunks
from kaizen_hashline.blocks import BlockResult, resolve_block
from kaizen_hashline.errors import HashlineError
from kaizen_hashline.fs import (
    MAX_FILE_BYTES,
    FileData,
    Remove,
    Step,
    Transaction,
    WorkspaceFS,
    Write,
    canonical_path,
)
from kaizen_hashline.recovery import line_map, remap
from kaizen_hashline.state import Version, WorkspaceKey, WorkspaceState
from kaizen_hashline.syntax import (
    BlockLoc,
    GapLoc,
    Hunk,
    Move,
    Section,
    SpanLoc,
    parse,
)
from kaizen_hashline.syntax import (
    Remove as RemoveOp,
)
from kaizen_hashline.text import Lines, TextFormat, compute_tag, decode, join_lines

BlockResolver = Callable[[str, Sequence[str], int], BlockResult]
MAX_REVEAL_LINES = 40


# --- read ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ReadResult:
    path: str
    tag: str
    total_lines: int
    start: int
    end: int
    text: str
    bom: bool
    eol: str

    @property
    def next_start(self) -> int | None:
        return self.end + 1 if self.end < self.total_lines else None

    def to_payload(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "path": self.path, "tag": self.tag, "header": render.header(self.path, self.tag),
            "total_lines": self.total_lines, "start": self.start, "end": self.end,
            "truncated": self.next_start is not None or self.start > 1,
            "line_endings": self.eol, "bom": self.bom, "text": self.text,
        }
        if self.next_start is not None:
            body["next_start"] = self.next_start
        return body


def _load(fs: WorkspaceFS, path: str) -> tuple[FileData, str, TextFormat]:
    data = fs.read(path)
    if data is None:
        raise HashlineError(f"{path} does not exist in the workspace. Hashline edits existing "
                            "files; create new files with run_code", code="not_found")
    text, fmt = decode(data.data)
    return data, text, fmt


def read_file(fs: WorkspaceFS, state: WorkspaceState, key: WorkspaceKey, path: str,
              start: int = 1, limit: int = render.MAX_READ_LINES) -> ReadResult:
    """The numbered view of ``path`` from ``start``; records the snapshot and shown lines."""
    canon = canonical_path(path)
    if not isinstance(start, int) or start < 1:
        raise HashlineError("start is a 1-based line number", code="invalid_arguments")
    limit = max(1, min(int(limit), render.MAX_READ_LINES))
    with state.exclusive(key):
        _, text, fmt = _load(fs, canon)
        lines = Lines.of(text)
        total = len(lines)
        if total and start > total:
            raise HashlineError(f"start={start} is past the end: {canon} has {total} lines",
                                code="out_of_range")
        tag = compute_tag(text)
        view = render.render_view(canon, tag, lines.rows, start, limit)
        # A row cut for length still counts as shown: its start was displayed, and the
        # line can then be replaced as a whole.
        version = state.record(key, canon, text, seen=view.shown, tag=tag)
        footer = ""
        if view.end < total:
            footer = (f"\n[lines {start}-{view.end} of {total}; read more with "
                      f"start={view.end + 1}]")
        return ReadResult(canon, version.tag, total, start, view.end, view.text + footer,
                          fmt.bom, fmt.eol)


# --- edit ---------------------------------------------------------------------------------

@dataclass(slots=True)
class SectionResult:
    path: str
    tag: str | None
    previous_tag: str
    status: str  # edited | moved | deleted
    moved_to: str | None = None
    resolutions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_payload(self) -> dict[str, Any]:
        body: dict[str, Any] = {"path": self.moved_to or self.path, "status": self.status,
                                "previous_tag": self.previous_tag}
        if self.tag is not None:
            body["tag"] = self.tag
            body["header"] = render.header(self.moved_to or self.path, self.tag)
        if self.moved_to:
            body["moved_from"] = self.path
        if self.resolutions:
            body["resolutions"] = self.resolutions
        if self.warnings:
            body["warnings"] = self.warnings
        return body


@dataclass(slots=True)
class EditResult:
    sections: list[SectionResult]
    diff: str
    diff_truncated: bool
    warnings: list[str]

    def summary(self) -> str:
        out: list[str] = []
        for sec in self.sections:
            if sec.status == "deleted":
                out.append(f"Deleted {sec.path}")
                continue
            out.append(render.header(sec.moved_to or sec.path, sec.tag or ""))
            out.extend(sec.resolutions)
            if sec.moved_to:
                out.append(f"Moved to {sec.moved_to}")
        return "\n".join(out)

    def to_payload(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "summary": self.summary(),
            "sections": [s.to_payload() for s in self.sections],
            "diff": self.diff,
            "diff_truncated": self.diff_truncated,
        }
        if self.warnings:
            body["warnings"] = self.warnings
        return body


@dataclass(slots=True)
class _Merged:
    section: Section
    path: str
    raw: str
    last_index: int


@dataclass(slots=True)
class _Prepared:
    path: str
    previous_tag: str
    live: FileData
    live_text: str
    fmt: TextFormat
    new_text: str | None  # None for REM
    new_seen: set[int]
    dest: str | None
    remove: bool
    resolutions: list[str]
    warnings: list[str]


def _merge(sections: Sequence[Section]) -> list[_Merged]:
    merged: list[_Merged] = []
    by_path: dict[str, _Merged] = {}
    for index, sec in enumerate(sections):
        path = canonical_path(sec.path)
        if sec.tag is None:
            raise HashlineError(f"[{sec.path}] has no tag: copy the [PATH#TAG] header from "
                                "read_workspace", code="missing_tag")
        existing = by_path.get(path)
        if existing is None:
            entry = _Merged(Section(sec.path, sec.tag, sec.line_no, list(sec.items)), path,
                            sec.path.strip(), index)
            merged.append(entry)
            by_path[path] = entry
            continue
        if existing.raw != sec.path.strip():
            raise HashlineError(f"[{existing.raw}] and [{sec.path}] name the same file; use one "
                                "header spelling", code="duplicate_path")
        if existing.section.tag != sec.tag:
            raise HashlineError(f"{path} appears with two tags (#{existing.section.tag} and "
                                f"#{sec.tag}); one call edits one snapshot of a file",
                                code="conflicting_tags")
        interleaved = existing.last_index != index - 1
        if interleaved and any(isinstance(i, Hunk) and i.uses_register
                               for i in existing.section.items + sec.items):
            raise HashlineError(f"{path} has sections on both sides of another file's section "
                                "and uses registers; merging would reorder the clipboard. Put "
                                "the file's operations in one section",
                                code="clipboard_interleaved_sections")
        existing.section.items.extend(sec.items)
        existing.last_index = index
    for entry in merged:
        ops = entry.section.file_ops
        if len(ops) > 1:
            raise HashlineError(f"{entry.path}: a file takes at most one REM or MV",
                                code="multiple_file_ops")
        if ops and isinstance(ops[0], RemoveOp) and entry.section.hunks:
            raise HashlineError(f"{entry.path}: REM must be the only operation for the file",
                                code="rem_takes_no_body")
    return merged


class _Editor:
    def __init__(self, fs: WorkspaceFS, state: WorkspaceState, key: WorkspaceKey,
                 resolver: BlockResolver) -> None:
        self.fs = fs
        self.state = state
        self.key = key
        self.resolver = resolver

    # --- errors that show the live file ----------------------------------------------------

    def _mismatch(self, path: str, message: str, code: str, expected: str, live_text: str,
                  anchors: Sequence[int]) -> HashlineError:
        lines = Lines.of(live_text)
        live_tag = compute_tag(live_text)
        text = (f"{message} (expected #{expected}, live file is "
                f"{render.header(path, live_tag)}; edit with that header or re-read)")
        context, shown = render.context_rows(lines.rows, anchors,
                                             budget=render.room_left(text))
        # Only rows that fit in the model-visible message count as shown.
        self.state.record(self.key, path, live_text, seen=shown, tag=live_tag)
        if context:
            text += "\n" + context
        return HashlineError(text, code=code)

    # --- one section -------------------------------------------------------------------------

    def prepare(self, entry: _Merged, registers: Registers) -> _Prepared:
        sec = entry.section
        tag = sec.tag or ""
        path = entry.path
        warnings: list[str] = []
        live = self.fs.read(path)
        if live is None:
            path = self._recover_path(path, tag)
            warnings.append(f"{entry.path} does not exist; the tag #{tag} was read at {path}, "
                            "editing that file")
            live = self.fs.read(path)
            if live is None:
                raise HashlineError(f"{path} does not exist in the workspace",
                                    code="not_found")
        live_text, fmt = decode(live.data)
        found = self.state.lookup(self.key, path, tag)
        hunks = sec.hunks
        if found is None:
            raise self._mismatch(
                path, f"{path}: tag #{tag} is not from this session (it was never issued for "
                "this file here)", "unknown_tag", tag, live_text, _authored_anchors(hunks))
        version, newest = found
        fresh = version.text == live_text
        remove = any(isinstance(i, RemoveOp) for i in sec.items)
        move = next((i for i in sec.items if isinstance(i, Move)), None)
        if not fresh and (remove or not hunks):
            raise self._mismatch(
                path, f"{path} changed since the read; REM and MV need the file exactly as "
                "read", "stale_tag", tag, live_text, [])
        if remove:
            return _Prepared(path, tag, live, live_text, fmt, None, set(), None, True, [],
                             warnings)
        snapshot = Lines.of(version.text)
        concretes, guard_anchors = self._locate(path, snapshot, hunks)
        self._guard_seen(path, version, snapshot, guard_anchors)
        resolutions: list[str] = []
        concretes = self._resolve_blocks(path, snapshot, concretes, resolutions, warnings)
        live_lines = Lines.of(live_text)
        if not fresh:
            anchors = _anchors(concretes)
            try:
                shift = remap(snapshot.rows, live_lines.rows, anchors, path=path).offset
            except HashlineError as exc:
                raise self._mismatch(path, str(exc), exc.code, tag, live_text,
                                     sorted(anchors)) from None
            concretes = [_shifted(c, shift) for c in concretes]
            if not anchors:
                warnings.append(f"the tag #{tag} was stale; the head/tail insert was applied "
                                "to the current file")
            elif shift == 0 and newest:
                warnings.append("recovered (external change): the anchors did not move")
            elif shift == 0:
                warnings.append("recovered from an earlier in-session snapshot")
            else:
                warnings.append(f"recovered by remapping anchors ({shift:+d} lines); check the "
                                "diff")
        applied = apply_hunks(live_lines.rows, concretes, registers)
        warnings.extend(applied.warnings)
        final_newline = live_lines.final_newline or not live_lines.rows
        new_text = join_lines(applied.rows, final_newline)
        if new_text == live_text and hunks:
            if not fresh:
                raise self._mismatch(path, f"{path} changed since the read and the remapped "
                                     "edit changes nothing", "stale_tag", tag, live_text, [])
            if move is None:
                raise HashlineError(f"{path}: the edit changes nothing (nothing written); "
                                    "re-read the file if you expected a change", code="no_op")
        if len(fmt.encode(new_text)) > MAX_FILE_BYTES:
            raise HashlineError(f"{path} would grow past 2 MiB; nothing was written",
                                code="file_too_large")
        if fresh:
            live_seen = set(version.seen)
        else:
            mapping = line_map(snapshot.rows, live_lines.rows)
            live_seen = {mapping[s] for s in version.seen if s in mapping}
        new_seen = {i + 1 for i, origin in enumerate(applied.provenance)
                    if origin is None or origin in live_seen}
        dest = None
        if move is not None:
            dest = canonical_path(move.dest)
            if dest == path:
                raise HashlineError(f"MV {move.dest}: the destination is the file itself",
                                    code="move_to_same_path")
        return _Prepared(path, tag, live, live_text, fmt, new_text, new_seen, dest, False,
                         resolutions, warnings)

    def _recover_path(self, path: str, tag: str) -> str:
        name = posixpath.basename(path)
        candidates = [p for p in self.state.paths_with_tag(self.key, tag)
                      if p != path and posixpath.basename(p) == name]
        if len(candidates) > 1:
            raise HashlineError(f"{path} does not exist and the tag #{tag} matches several "
                                f"files named {name} ({', '.join(sorted(candidates)[:5])}); "
                                "use the exact path", code="ambiguous_recovery")
        if not candidates:
            raise HashlineError(f"{path} does not exist in the workspace. Hashline edits "
                                "existing files; create new files with run_code",
                                code="not_found")
        return canonical_path(candidates[0])  # revalidated; the read walks it no-follow

    def _locate(self, path: str, snapshot: Lines,
                hunks: Sequence[Hunk]) -> tuple[list[Concrete], list[int]]:
        """Check every locator against the tagged snapshot; the seen-guard anchors."""
        n = len(snapshot)
        out: list[Concrete] = []
        guard: list[int] = []

        def need(line: int, hunk: Hunk) -> None:
            if not 1 <= line <= n:
                raise HashlineError(f"{path}: {hunk.render()} (edit line {hunk.line_no}): line "
                                    f"{line} does not exist (the file has {n} lines)",
                                    code="out_of_range")

        for hunk in hunks:
            loc = hunk.locator
            if isinstance(loc, SpanLoc):
                end = loc.end
                if end == n + 1 and snapshot.final_newline and loc.start <= n:
                    end = n  # a range reaching the terminal-newline sentinel stops before it
                need(loc.start, hunk)
                need(end, hunk)
                guard.extend(range(loc.start, end + 1))
                out.append(Concrete(hunk, span=(loc.start, end)))
            elif isinstance(loc, BlockLoc):
                need(loc.line, hunk)
                guard.append(loc.line)
                out.append(Concrete(hunk, span=(loc.line, loc.line)))
            elif isinstance(loc, GapLoc):
                if loc.tail:
                    out.append(Concrete(hunk, gap=("tail", 0)))
                elif loc.head:
                    out.append(Concrete(hunk, gap=("head", 0)))
                else:
                    assert loc.line is not None
                    need(loc.line, hunk)
                    guard.append(loc.line)
                    out.append(Concrete(hunk, gap=("before" if loc.side == "<" else "after",
                                                   loc.line)))
        return out, guard

    def _guard_seen(self, path: str, version: Version, snapshot: Lines,
                    anchors: Sequence[int]) -> None:
        unseen = sorted(set(anchors) - version.seen)
        if not unseen:
            return
        message = (f"{path}: the edit anchors on line(s) {render.compress(unseen)} that no read "
                   "displayed. ")
        shown_note = ("They are shown below and now count as seen: check them and send the "
                      "edit again.")
        budget = render.room_left(message + shown_note)
        rows: list[str] = []
        used = 0
        complete = len(unseen) <= MAX_REVEAL_LINES
        for line in unseen[:MAX_REVEAL_LINES]:
            text = snapshot.rows[line - 1]
            row = f"{line}:{text}"
            if len(text) > render.MAX_ERROR_LINE_CHARS or used + len(row) + 1 > budget:
                complete = False
                break
            rows.append(row)
            used += len(row) + 1
        if complete:
            self.state.mark_seen(self.key, path, version, unseen)
            message += shown_note + "\n" + "\n".join(rows)
        else:
            message += (f"Read them first: read_workspace(path={path!r}, start={unseen[0]}, "
                        f"limit={min(render.MAX_READ_LINES, unseen[-1] - unseen[0] + 1)}).")
        raise HashlineError(message, code="unseen_anchor")

    def _resolve_blocks(self, path: str, snapshot: Lines, concretes: list[Concrete],
                        resolutions: list[str], warnings: list[str]) -> list[Concrete]:
        out: list[Concrete] = []
        for item in concretes:
            hunk = item.hunk
            loc = hunk.locator
            if isinstance(loc, BlockLoc):
                span = self._block(path, snapshot, loc.line, hunk, after=False)
                assert span is not None
                resolutions.append(f"{hunk.render()} resolved lines {span[0]}-{span[1]} "
                                   f"({span[1] - span[0] + 1} lines)")
                out.append(Concrete(hunk, span=span))
            elif isinstance(loc, GapLoc) and loc.block:
                assert loc.line is not None
                span = self._block(path, snapshot, loc.line, hunk, after=True)
                if span is None:
                    warnings.append(f"{hunk.render()}: no block could be resolved at line "
                                    f"{loc.line}; treated as >{loc.line}")
                    out.append(item)
                    continue
                resolutions.append(f"{hunk.render()} block {span[0]}-{span[1]}; the body "
                                   f"lands after line {span[1]}")
                out.append(Concrete(hunk, gap=("after", span[1]), block_span=span))
            else:
                out.append(item)
        return out

    def _block(self, path: str, snapshot: Lines, line: int, hunk: Hunk,
               *, after: bool) -> tuple[int, int] | None:
        result = self.resolver(path, snapshot.rows, line)
        if result.span is not None:
            return result.span
        label = f"{hunk.render()} (edit line {hunk.line_no})"
        if result.reason == "single_line":
            hint = f"; the enclosing block opens at line {result.suggestion} " \
                   f"({result.suggestion}*)" if result.suggestion else ""
            raise HashlineError(f"{path}: {label}: line {line} opens a one-line node; use the "
                                f"plain form {line}.={line}{hint}", code="block_single_line")
        if after:
            return None
        if result.reason == "unsupported":
            raise HashlineError(f"{path}: {label}: no syntax-block resolver for this file type; "
                                "use a range A.=B", code="block_resolver_unavailable")
        if result.reason == "blank":
            hint = f"; the next block opens at line {result.suggestion} ({result.suggestion}*)" \
                if result.suggestion else ""
            raise HashlineError(f"{path}: {label}: line {line} is blank{hint}",
                                code="block_unresolved")
        hint = f"; the enclosing block opens at line {result.suggestion} " \
               f"({result.suggestion}*)" if result.suggestion else "; use a range A.=B"
        raise HashlineError(f"{path}: {label}: no block opens on line {line} "
                            f"({result.reason.replace('_', ' ')}){hint}",
                            code="block_unresolved")


def _authored_anchors(hunks: Sequence[Hunk]) -> list[int]:
    out: list[int] = []
    for hunk in hunks:
        loc = hunk.locator
        if isinstance(loc, SpanLoc):
            out.extend([loc.start, loc.end])
        elif isinstance(loc, BlockLoc):
            out.append(loc.line)
        elif loc.line is not None and not loc.head:
            out.append(loc.line)
    return out


def _anchors(concretes: Sequence[Concrete]) -> set[int]:
    out: set[int] = set()
    for item in concretes:
        if item.span is not None:
            out.update(range(item.span[0], item.span[1] + 1))
        elif item.gap is not None and item.gap[0] in ("before", "after"):
            if item.block_span is not None:
                out.update(range(item.block_span[0], item.block_span[1] + 1))
            out.add(item.gap[1])
    return out


def _shifted(item: Concrete, shift: int) -> Concrete:
    if shift == 0:
        return item
    if item.span is not None:
        return Concrete(item.hunk, span=(item.span[0] + shift, item.span[1] + shift))
    assert item.gap is not None
    kind, line = item.gap
    if kind in ("before", "after"):
        return Concrete(item.hunk, gap=(kind, line + shift))
    return item


def edit_files(fs: WorkspaceFS, state: WorkspaceState, key: WorkspaceKey, program: str, *,
               resolver: BlockResolver = resolve_block) -> EditResult:
    """Apply a Hashline program to the workspace: everything or nothing."""
    parsed = parse(program)
    merged = _merge(parsed.sections)
    with state.exclusive(key):
        editor = _Editor(fs, state, key, resolver)
        registers = Registers.from_session(state.registers(key))
        prepared: list[_Prepared] = []
        sources: set[str] = set()
        for entry in merged:
            item = editor.prepare(entry, registers)
            if item.path in sources:
                raise HashlineError(f"two sections resolve to {item.path}", code="duplicate_path")
            sources.add(item.path)
            prepared.append(item)
        steps = _plan(fs, prepared, sources)
        Transaction(fs, steps).commit()
        return _publish(state, key, prepared, registers, parsed.warnings)


def _plan(fs: WorkspaceFS, prepared: Sequence[_Prepared], sources: set[str]) -> list[Step]:
    steps: list[Step] = []
    dests: set[str] = set()
    for item in prepared:
        if item.dest is not None:
            if item.dest in dests or item.dest in sources:
                raise HashlineError(f"MV {item.dest}: another operation of this edit already "
                                    "targets that path", code="duplicate_destination")
            dests.add(item.dest)
    for item in prepared:
        mode = item.live.mode
        if item.remove:
            steps.append(Remove(item.path, item.live.identity, item.live))
            continue
        assert item.new_text is not None
        data = item.fmt.encode(item.new_text)
        if item.dest is None:
            steps.append(Write(item.path, data, mode, item.live.identity, item.live))
            continue
        info = fs.lstat(item.dest)
        backup = None
        if info is not None:
            backup = fs.read(item.dest)  # refuses symlinks, directories, oversize files
            if backup is None:
                raise HashlineError(f"MV {item.dest}: the destination changed during the edit",
                                    code="concurrent_change")
            item.warnings.append(f"MV overwrote the existing {item.dest}")
        steps.append(Write(item.dest, data, mode, backup.identity if backup else None, backup))
        steps.append(Remove(item.path, item.live.identity, item.live))
    return steps


def _publish(state: WorkspaceState, key: WorkspaceKey, prepared: Sequence[_Prepared],
             registers: Registers, warnings: list[str]) -> EditResult:
    diff = render.DiffBuilder()
    results: list[SectionResult] = []
    for item in prepared:
        old_rows = Lines.of(item.live_text).rows
        if item.remove:
            state.drop(key, item.path)
            diff.add(item.path, "/dev/null", old_rows, ())
            results.append(SectionResult(item.path, None, item.previous_tag, "deleted",
                                         warnings=item.warnings))
            continue
        assert item.new_text is not None
        target = item.dest or item.path
        if item.dest is not None:
            state.move(key, item.path, item.dest)
        version = state.record(key, target, item.new_text, seen=item.new_seen)
        diff.add(item.path, target, old_rows, Lines.of(item.new_text).rows)
        results.append(SectionResult(item.path, version.tag, item.previous_tag,
                                     "moved" if item.dest else "edited", item.dest,
                                     item.resolutions, item.warnings))
    state.publish_registers(key, registers.named)
    return EditResult(results, diff.text(), diff.truncated, list(warnings))
