"""Parser for the G4 Hashline edit language (HASHLINE.md §3).

``parse(text)`` turns an edit program into :class:`Program`: sections (``[PATH#TAG]``), each
holding hunks (``PUT`` / ``CUT``) and file operations (``REM`` / ``MV``) in authored order.
The parser is pure and bounded; it never touches the filesystem. Every refusal is a
:class:`HashlineError` whose code names the construct (``empty_insert``,
``colon_on_register_put`` …), mirroring the reference's message constants (§11).

Leniency (§12) kept, each with a warning: the range separators ``..``, ``-``, ``…`` (and a lone
``.`` or ``=``) for ``.=``; a single number as a one-line range (``PUT 5:``, ``CUT 5``); a
dangling separator (``PUT 5.=:``); a colon after ``CUT``; an empty span ``PUT A.=B:`` as a
delete. Leniency that rewrites row text (auto-prefixing body rows, stripping pasted ``N:``
prefixes, dropping diff ``-`` rows) is not implemented: such input is refused with a message
that says how to write it, so nothing is written that the model did not spell out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from kaizen_hashline.errors import HashlineError
from kaizen_hashline.limits import MAX_PROGRAM_CHARS as MAX_PROGRAM_CHARS

MAX_SECTIONS = 64
MAX_ITEMS = 2000
MAX_RANGE_LINES = 100_000
MAX_SAFE_INTEGER = 2**53 - 1
REGISTER_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

_KEYWORD = re.compile(r"^[ \t]*(PUT|CUT|REM|MV)(?=[ \t:]|$)(.*)$")
_TAG = re.compile(r"[0-9A-Fa-f]{4}")
_REGISTER_SUFFIX = re.compile(r"^(.*?)[ \t]*@([^ \t@]*)$")
_GAP = re.compile(r"^([<>])[ \t]*(\d+|\$)(\*?)$")
_SPAN = re.compile(r"^(\d+)(?:[ \t]*(\.=|\.\.|…|-|\.|=)[ \t]*(\d*))?[ \t]*(\*?)$")
_BARE_NUMBERS = re.compile(r"^\d+([ \t]+\d+)?$")
_READ_ROW = re.compile(r"^\d+[:|]")
_DIFF_SENTINEL = re.compile(r"^(\*\*\* (Update|Add|Delete|Move) File|\*\*\* |@@|--- |diff --git)")

Side = Literal["<", ">"]


@dataclass(frozen=True, slots=True)
class SpanLoc:
    """``A.=B`` (inclusive, original numbering)."""

    start: int
    end: int

    def render(self) -> str:
        return f"{self.start}.={self.end}"


@dataclass(frozen=True, slots=True)
class BlockLoc:
    """``N*``: the syntax block that opens on line N."""

    line: int

    def render(self) -> str:
        return f"{self.line}*"


@dataclass(frozen=True, slots=True)
class GapLoc:
    """``<N``, ``>N``, ``>N*`` (``block``) or ``>$`` (``line`` is None)."""

    side: Side
    line: int | None
    block: bool = False

    def render(self) -> str:
        return f"{self.side}{'$' if self.line is None else self.line}{'*' if self.block else ''}"

    @property
    def head(self) -> bool:
        return self.side == "<" and self.line == 1

    @property
    def tail(self) -> bool:
        return self.line is None


Locator = SpanLoc | BlockLoc | GapLoc


@dataclass(slots=True)
class Hunk:
    """One ``PUT`` or ``CUT``.

    * ``PUT loc:`` + rows → ``body`` is the rows (span: replace; gap: insert).
    * ``PUT gap`` / ``PUT gap @r`` → ``paste``; ``register`` None is the anonymous register.
    * ``PUT span @r`` → span paste (``paste`` with a ``register``).
    * ``CUT span`` / ``CUT span @r`` → ``register`` None is the anonymous register.
    """

    verb: Literal["PUT", "CUT"]
    locator: Locator
    register: str | None = None
    paste: bool = False
    body: list[str] | None = None
    line_no: int = 0  # 1-based line of the header in the program

    @property
    def uses_register(self) -> bool:
        return self.verb == "CUT" or self.paste

    def render(self) -> str:
        out = f"{self.verb} {self.locator.render()}"
        if self.register is not None:
            out += f" @{self.register}"
        if self.body is not None:
            out += ":"
        return out


@dataclass(frozen=True, slots=True)
class Remove:
    line_no: int = 0


@dataclass(frozen=True, slots=True)
class Move:
    dest: str
    line_no: int = 0


Item = Hunk | Remove | Move


@dataclass(slots=True)
class Section:
    path: str
    tag: str | None
    line_no: int
    items: list[Item] = field(default_factory=list)

    @property
    def hunks(self) -> list[Hunk]:
        return [i for i in self.items if isinstance(i, Hunk)]

    @property
    def file_ops(self) -> list[Remove | Move]:
        return [i for i in self.items if isinstance(i, Remove | Move)]


@dataclass(slots=True)
class Program:
    sections: list[Section]
    warnings: list[str] = field(default_factory=list)


def _fail(message: str, code: str, line_no: int | None = None) -> HashlineError:
    where = f"line {line_no} of the edit: " if line_no else ""
    return HashlineError(where + message, code=code)


def _parse_line_number(text: str, line_no: int) -> int:
    if text.startswith("0"):
        raise _fail(f"line numbers start at 1 and have no leading zeros (got {text!r})",
                    "invalid_line_number", line_no)
    value = int(text)
    if value > MAX_SAFE_INTEGER:
        raise _fail(f"line number {text} is too large", "invalid_line_number", line_no)
    return value


def parse_header(line: str, line_no: int) -> Section:
    """``[PATH#TAG]`` (trailing blanks allowed). ``[PATH]`` parses with tag None."""
    stripped = line.rstrip()
    if not stripped.startswith("[") or not stripped.endswith("]"):
        raise _fail("a section header is written [PATH#TAG] with nothing after the ]",
                    "malformed_header", line_no)
    inner = stripped[1:-1]
    if "\r" in inner or "\n" in inner:
        raise _fail("a header path cannot contain line breaks", "malformed_header", line_no)
    if "#" not in inner:
        path, tag = inner.strip(), None
    else:
        cut = inner.rfind("#")
        path, raw_tag = inner[:cut].strip(), inner[cut + 1:]
        if "#" in path or not _TAG.fullmatch(raw_tag):
            raise _fail(
                f"malformed header {stripped[:120]!r}: write [PATH#TAG] where TAG is the "
                "four hex digits from the read header and PATH has no '#'",
                "malformed_header", line_no)
        tag = raw_tag.upper()
    if not path:
        raise _fail("a section header needs a path: [PATH#TAG]", "empty_path", line_no)
    return Section(path=path, tag=tag, line_no=line_no)


def _split_register(rest: str, line_no: int) -> tuple[str, str | None]:
    if "@" not in rest:
        return rest, None
    match = _REGISTER_SUFFIX.match(rest)
    if match is None or "@" in match.group(1):
        raise _fail("a register is written once, last on the line: @name", "invalid_register",
                    line_no)
    name = match.group(2)
    if not REGISTER_RE.fullmatch(name):
        raise _fail(f"register names are 1-64 characters of A-Z a-z 0-9 _ - (got @{name[:80]})",
                    "invalid_register", line_no)
    return match.group(1).strip(), name


def _parse_locator(text: str, line_no: int, warnings: list[str]) -> Locator:
    text = text.strip()
    if not text:
        raise _fail("missing locator: write A.=B, N*, <N, >N, >N* or >$",
                    "missing_locator", line_no)
    gap = _GAP.match(text)
    if gap:
        side: Side = "<" if gap.group(1) == "<" else ">"
        if gap.group(2) == "$":
            if side == "<" or gap.group(3):
                raise _fail(f"{text!r} is not a gap: the tail is written >$", "invalid_locator",
                            line_no)
            return GapLoc(">", None)
        n = _parse_line_number(gap.group(2), line_no)
        if side == "<":  # <N* means <N
            return GapLoc("<", n)
        return GapLoc(">", n, block=bool(gap.group(3)))
    span = _SPAN.match(text)
    if span:
        start = _parse_line_number(span.group(1), line_no)
        sep, end_text, star = span.group(2), span.group(3), span.group(4)
        if sep is None:
            if star:
                return BlockLoc(start)
            warnings.append(f"line {line_no}: a single number means the one-line range "
                            f"{start}.={start}")
            return SpanLoc(start, start)
        if star:
            raise _fail(f"{text!r}: a range cannot take '*'; use N* for the block opening on "
                        "line N, or A.=B for a range", "invalid_locator", line_no)
        if sep != ".=":
            warnings.append(f"line {line_no}: range separator {sep!r} read as '.='")
        if not end_text:
            warnings.append(f"line {line_no}: dangling separator read as {start}.={start}")
            return SpanLoc(start, start)
        end = _parse_line_number(end_text, line_no)
        if end < start:
            raise _fail(
                f"reversed range {start}.={end}: the value after '.=' is the absolute last "
                f"line, not a count. Write {start}.={start} for one line, {start}.="
                f"{start + end - 1} for {end} lines from {start}, or {start}* for the block",
                "invalid_range", line_no)
        if end - start + 1 > MAX_RANGE_LINES:
            raise _fail(f"a range may span at most {MAX_RANGE_LINES} lines", "invalid_range",
                        line_no)
        return SpanLoc(start, end)
    raise _fail(f"cannot read locator {text[:80]!r}: write A.=B, N*, <N, >N, >N* or >$",
                "invalid_locator", line_no)


def parse_op(line: str, line_no: int, warnings: list[str]) -> Item | None:
    """A ``PUT``/``CUT``/``REM``/``MV`` header line, or None when the line is none of them."""
    match = _KEYWORD.match(line)
    if match is None:
        return None
    verb, rest = match.group(1), match.group(2).strip()
    if verb == "REM":
        if rest:
            raise _fail("REM takes nothing after it", "rem_takes_no_body", line_no)
        return Remove(line_no)
    if verb == "MV":
        dest = rest
        if len(dest) >= 2 and dest[0] == dest[-1] and dest[0] in "'\"":
            dest = dest[1:-1].strip()
        if not dest:
            raise _fail("MV needs a destination path: MV new/path.py", "missing_destination",
                        line_no)
        return Move(dest, line_no)
    colon = rest.endswith(":")
    if colon:
        rest = rest[:-1].rstrip()
    rest, register = _split_register(rest, line_no)
    if ":" in rest:
        raise _fail("nothing may follow the ':' of a PUT header; body rows go on the next "
                    "lines, each starting with '+'", "inline_body", line_no)
    locator = _parse_locator(rest, line_no, warnings)
    if verb == "CUT":
        if isinstance(locator, GapLoc):
            raise _fail("CUT takes a range A.=B or a block N*, not a gap", "invalid_locator",
                        line_no)
        if colon:
            warnings.append(f"line {line_no}: the ':' after CUT is ignored (CUT takes no body)")
        return Hunk("CUT", locator, register=register, line_no=line_no)
    if colon and register is not None:
        raise _fail("a register PUT takes no ':' (write PUT >5 @name, no body)",
                    "colon_on_register_put", line_no)
    if colon:
        return Hunk("PUT", locator, body=[], line_no=line_no)
    if not isinstance(locator, GapLoc) and register is None:
        raise _fail(f"PUT {locator.render()} without ':' and without a register: write "
                    f"PUT {locator.render()}: followed by '+' rows, or PUT {locator.render()} "
                    "@name to paste a named register over the span", "colonless_span_put",
                    line_no)
    return Hunk("PUT", locator, register=register, paste=True, line_no=line_no)


def _no_body_code(item: Item | None) -> tuple[str, str]:
    if isinstance(item, Hunk) and item.verb == "CUT":
        return "cut_takes_no_body", "CUT takes no body rows"
    if isinstance(item, Hunk) and item.paste and item.register is not None:
        return "register_put_takes_no_body", "a register PUT (… @name) takes no body rows"
    if isinstance(item, Hunk) and item.paste:
        return ("colonless_put_takes_no_body",
                "a PUT without ':' pastes the anonymous register and takes no body rows; "
                "add ':' to insert rows")
    if isinstance(item, Remove | Move):
        return "move_takes_no_body", "REM and MV take no body rows"
    return "orphan_payload", "a '+' row must follow a PUT …: header"


_SECTION_LIKE = re.compile(r"^\[[^#\]]*#[0-9A-Fa-f]{4}\]\s*$")


def _looks_like_header(text: str) -> bool:
    if _SECTION_LIKE.match(text):
        return True
    try:
        return parse_op(text, 0, []) is not None
    except HashlineError:
        return text.startswith(("PUT ", "CUT "))


def parse(text: str) -> Program:
    """Parse an edit program. Raises :class:`HashlineError` on the first malformed line."""
    if not isinstance(text, str):
        raise HashlineError("the edit program must be a string", code="invalid_arguments")
    if len(text) > MAX_PROGRAM_CHARS:
        raise HashlineError(f"the edit program is larger than {MAX_PROGRAM_CHARS} characters",
                            code="edit_too_large")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]
    warnings: list[str] = []
    i = 0
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i < len(lines) and lines[i].strip() == "*** Begin Patch":
        i += 1
        while i < len(lines) and not lines[i].strip():
            i += 1
    if i >= len(lines) or lines[i].strip() in ("*** End Patch", "*** Abort"):
        raise HashlineError("the edit program is empty: start with a [PATH#TAG] header from "
                            "read_workspace", code="empty_edit")
    first = lines[i]
    if not first.startswith("["):
        if first.startswith("@@"):
            raise _fail("this is a unified diff hunk; Hashline edits start with the "
                        "[PATH#TAG] header from read_workspace followed by PUT/CUT/REM/MV",
                        "missing_header", i + 1)
        raise _fail("the first line must be a [PATH#TAG] section header from read_workspace",
                    "missing_header", i + 1)

    sections: list[Section] = []
    section: Section | None = None
    open_body: Hunk | None = None  # a PUT …: collecting rows
    blanks = 0
    item_count = 0

    def close_body() -> None:
        nonlocal open_body
        if open_body is not None and open_body.body is not None and not open_body.body:
            loc = open_body.locator
            if isinstance(loc, GapLoc):
                raise _fail(f"PUT {loc.render()}: has no body rows; write the rows to insert "
                            "after it, each starting with '+'", "empty_insert",
                            open_body.line_no)
            warnings.append(f"line {open_body.line_no}: PUT {loc.render()}: with no rows "
                            "deletes the span")
        open_body = None

    while i < len(lines):
        line = lines[i]
        line_no = i + 1
        i += 1
        if line.strip() in ("*** End Patch", "*** Abort"):
            break
        if line.startswith("+"):
            if open_body is not None and open_body.body is not None:
                open_body.body.extend([""] * blanks)
                blanks = 0
                row = line[1:]
                if _looks_like_header(row.strip()) and row.strip():
                    warnings.append(f"line {line_no}: '+{row[:40]}' is inserted as text, not "
                                    "read as a header")
                open_body.body.append(row)
                continue
            last = section.items[-1] if section and section.items else None
            code, message = _no_body_code(last)
            raise _fail(message, code, line_no)
        if not line.strip():
            if open_body is not None:
                blanks += 1
            continue
        blanks = 0
        close_body()
        if line.startswith("["):
            section = parse_header(line, line_no)
            if len(sections) >= MAX_SECTIONS:
                raise HashlineError(f"an edit may hold at most {MAX_SECTIONS} sections",
                                    code="edit_too_large")
            sections.append(section)
            continue
        assert section is not None
        op = parse_op(line, line_no, warnings)
        if op is not None:
            if isinstance(op, Hunk) and any(isinstance(it, Remove) for it in section.items):
                raise _fail("REM must be the only operation of its section",
                            "rem_takes_no_body", line_no)
            section.items.append(op)
            item_count += 1
            if item_count > MAX_ITEMS:
                raise HashlineError(f"an edit may hold at most {MAX_ITEMS} operations",
                                    code="edit_too_large")
            if isinstance(op, Hunk) and op.body is not None:
                open_body = op
            continue
        stripped = line.strip()
        if stripped.startswith("#"):
            before_first = not section.items or isinstance(section.items[-1], Remove | Move)
            nxt = lines[i] if i < len(lines) else ""
            nxt_is_hunk = False
            try:
                nxt_op = parse_op(nxt, i + 1, [])
                nxt_is_hunk = isinstance(nxt_op, Hunk)
            except HashlineError:
                nxt_is_hunk = True  # let the next line report its own error
            if before_first and nxt_is_hunk:
                continue
            raise _fail("unexpected '#' line: body rows start with '+' (write '+# text' for a "
                        "comment line in the file)", "unexpected_line", line_no)
        if _DIFF_SENTINEL.match(stripped):
            raise _fail("apply-patch or unified-diff syntax is not Hashline: use PUT/CUT/REM/MV "
                        "under the [PATH#TAG] header", "diff_syntax", line_no)
        if stripped.startswith("-"):
            raise _fail("'-' rows are not part of Hashline: to replace lines use PUT A.=B: with "
                        "'+' rows; to write a line starting with '-', use '+-…'",
                        "minus_row_rejected", line_no)
        if _BARE_NUMBERS.match(stripped) or _SPAN.match(stripped.rstrip(":")):
            raise _fail(f"{stripped[:40]!r} has no verb: write PUT {stripped.rstrip(':')}: "
                        "with '+' rows, or CUT …", "missing_verb", line_no)
        if _READ_ROW.match(stripped):
            raise _fail("'N:TEXT' rows are read output, not edits: write PUT N.=N: followed by "
                        "'+TEXT'", "read_row_in_edit", line_no)
        if open_body is None and section.items and isinstance(section.items[-1], Hunk) \
                and section.items[-1].body is not None:
            raise _fail("body rows must start with '+'", "unexpected_line", line_no)
        raise _fail(f"cannot read {stripped[:60]!r}: expected PUT, CUT, REM, MV, a '+' row or a "
                    "[PATH#TAG] header (keywords are upper-case)", "unexpected_line", line_no)
    close_body()
    kept = [s for s in sections if s.items]
    if not kept:
        raise HashlineError("the edit has no operations: add PUT, CUT, REM or MV under the "
                            "header", code="empty_edit")
    for sec in kept:
        ops = sec.file_ops
        if len(ops) > 1:
            raise _fail("a section holds at most one REM or MV", "multiple_file_ops",
                        ops[1].line_no)
        if ops and isinstance(ops[0], Remove) and sec.hunks:
            raise _fail("REM must be the only operation of its section", "rem_takes_no_body",
                        ops[0].line_no)
    return Program(kept, warnings)
