"""Syntax-block resolution for ``N*`` locators (HASHLINE.md §5).

The reference uses tree-sitter; this package has no tree-sitter dependency, so the resolver
is chosen by file extension from small, dependency-free resolvers:

* Python (``.py``, ``.pyi``): the standard-library ``ast``. The block is the largest node that
  begins on line N (ties: the leftmost); a first decorator line opens the decorated
  definition; ``else:`` / ``finally:`` lines open their clause.
* Markdown (``.md``, ``.markdown``): a heading opens a block through deeper headings up to the
  next heading of the same or higher level (trailing blank lines excluded); a code fence
  opens the fenced block.
* Brace languages (JS/TS/JSON/C/C++/C#/Java/Go/Rust/Kotlin/Swift/CSS/PHP …): the lines from N
  until the brackets opened on N close, skipping strings and comments; a following line that
  starts with ``{`` (Allman style) continues the block.
* YAML (``.yml``, ``.yaml``): line N and the following more-indented lines.

Anything else has no resolver: block ops there fail (``>N*`` falls back to ``>N``). Resolution
is a pure function of (path, lines, N).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

Reason = Literal["ok", "single_line", "blank", "closing", "no_block", "parse_error",
                 "unsupported"]


@dataclass(frozen=True, slots=True)
class BlockResult:
    span: tuple[int, int] | None
    reason: Reason
    # An enclosing (or, for a blank line, the next) multi-line block's opening line.
    suggestion: int | None = None


Resolver = Callable[[Sequence[str], int], BlockResult]

_BRACE_EXT = frozenset({
    "js", "jsx", "mjs", "cjs", "ts", "tsx", "mts", "cts", "json", "jsonc", "c", "h", "cc",
    "cpp", "cxx", "hpp", "hh", "cs", "java", "go", "rs", "kt", "kts", "swift", "css", "scss",
    "less", "php", "scala", "dart", "groovy", "gradle", "zig", "sol",
})


def language_of(path: str) -> str | None:
    name = path.rsplit("/", 1)[-1].lower()
    ext = name.rsplit(".", 1)[-1] if "." in name else ""
    if ext in ("py", "pyi"):
        return "python"
    if ext in ("md", "markdown"):
        return "markdown"
    if ext in ("yml", "yaml"):
        return "yaml"
    if ext in _BRACE_EXT:
        return "brace"
    return None


def resolve_block(path: str, lines: Sequence[str], n: int) -> BlockResult:
    """The span of the block that opens on line ``n`` (1-based) of ``lines``."""
    language = language_of(path)
    resolver = _RESOLVERS.get(language or "")
    if resolver is None:
        return BlockResult(None, "unsupported")
    if not 1 <= n <= len(lines):
        return BlockResult(None, "no_block")
    return resolver(lines, n)


# --- Python ---------------------------------------------------------------------------------

_CLAUSE = re.compile(r"^\s*(else|finally)\s*:")


def _python(lines: Sequence[str], n: int) -> BlockResult:
    try:
        tree = ast.parse("\n".join(lines))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return BlockResult(None, "parse_error")
    starts: dict[int, tuple[int, int]] = {}  # line -> (end, -col) best
    enclosing: list[tuple[int, int]] = []  # multi-line statement spans
    for node in ast.walk(tree):
        lineno = getattr(node, "lineno", None)
        end = getattr(node, "end_lineno", None)
        if lineno is None or end is None:
            continue
        col = getattr(node, "col_offset", 0)
        first = lineno
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) \
                and node.decorator_list:
            first = min(d.lineno for d in node.decorator_list)
            _offer(starts, first, end, 0)
        _offer(starts, lineno, end, col)
        if isinstance(node, ast.stmt | ast.ExceptHandler) and end > lineno:
            enclosing.append((first, end))
        for attr in ("orelse", "finalbody"):
            body = getattr(node, attr, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                # The clause line (``else:`` / ``finally:``) sits right above its body.
                clause = body[0].lineno - 1
                while clause > lineno and not _CLAUSE.match(lines[clause - 1]):
                    clause -= 1
                if clause > lineno and _CLAUSE.match(lines[clause - 1]):
                    _offer(starts, clause, body[-1].end_lineno or clause, 0)
    text = lines[n - 1]
    if not text.strip():
        nxt = min((s for s, (e, _) in starts.items() if s > n and e > s), default=None)
        return BlockResult(None, "blank", nxt)
    best = starts.get(n)
    around = [(s, e) for s, e in enclosing if s < n <= e]
    parent = max(around, key=lambda se: se[0])[0] if around else None
    if best is None:
        if text.lstrip().startswith("#"):
            return BlockResult(None, "no_block", parent)
        return BlockResult(None, "closing", parent)
    end = best[0]
    if end <= n:
        return BlockResult(None, "single_line", parent)
    return BlockResult((n, end), "ok")


def _offer(starts: dict[int, tuple[int, int]], line: int, end: int, col: int) -> None:
    current = starts.get(line)
    candidate = (end, -col)
    if current is None or candidate > current:
        starts[line] = candidate


# --- Markdown -------------------------------------------------------------------------------

_HEADING = re.compile(r"^ {0,3}(#{1,6})(\s|$)")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def _markdown(lines: Sequence[str], n: int) -> BlockResult:
    fence_of: dict[int, int] = {}  # opening line -> closing line
    headings: dict[int, int] = {}  # line -> level
    open_at: int | None = None
    marker = ""
    for idx, line in enumerate(lines, start=1):
        fence = _FENCE.match(line)
        if open_at is not None:
            if fence and fence.group(1)[0] == marker[0] and len(fence.group(1)) >= len(marker) \
                    and not line.strip()[len(fence.group(1)):].strip():
                fence_of[open_at] = idx
                open_at = None
            continue
        if fence:
            open_at, marker = idx, fence.group(1)
            continue
        heading = _HEADING.match(line)
        if heading:
            headings[idx] = len(heading.group(1))
    if open_at is not None:
        fence_of[open_at] = len(lines)
    if not lines[n - 1].strip():
        nxt = min((h for h in headings if h > n), default=None)
        return BlockResult(None, "blank", nxt)
    if n in fence_of:
        end = fence_of[n]
        return BlockResult((n, end), "ok") if end > n else BlockResult(None, "single_line")
    parent = max((h for h in headings if h < n), default=None)
    if n not in headings:
        return BlockResult(None, "no_block", parent)
    level = headings[n]
    end = len(lines)
    for h in sorted(headings):
        if h > n and headings[h] <= level:
            end = h - 1
            break
    while end > n and not lines[end - 1].strip():
        end -= 1
    if end <= n:
        return BlockResult(None, "single_line", parent)
    return BlockResult((n, end), "ok")


# --- brace languages ------------------------------------------------------------------------

_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = frozenset(")]}")


def _line_deltas(lines: Sequence[str]) -> list[tuple[int, int, bool]]:
    """Per line: (net depth change, minimum running depth within the line, starts closed).

    Strings ('…', "…", `…`) and comments (//, /* */) are skipped.
    """
    out: list[tuple[int, int, bool]] = []
    in_block_comment = False
    in_template = False
    for line in lines:
        depth = 0
        low = 0
        i = 0
        starts_closed = line.lstrip()[:1] in _CLOSE
        quote = "`" if in_template else ""
        while i < len(line):
            ch = line[i]
            if in_block_comment:
                if line.startswith("*/", i):
                    in_block_comment = False
                    i += 2
                    continue
                i += 1
                continue
            if quote:
                if ch == "\\":
                    i += 2
                    continue
                if ch == quote:
                    quote = ""
                i += 1
                continue
            if line.startswith("//", i):
                break
            if line.startswith("/*", i):
                in_block_comment = True
                i += 2
                continue
            if ch in "'\"`":
                quote = ch
            elif ch in _OPEN:
                depth += 1
            elif ch in _CLOSE:
                depth -= 1
                low = min(low, depth)
            i += 1
        in_template = quote == "`"
        out.append((depth, low, starts_closed))
    return out


def _brace(lines: Sequence[str], n: int) -> BlockResult:
    deltas = _line_deltas(lines)
    text = lines[n - 1]
    if not text.strip():
        return BlockResult(None, "blank", _next_opening(deltas, lines, n + 1))
    parent = _enclosing(deltas, n)
    depth_change, low, starts_closed = deltas[n - 1]
    if starts_closed or low < 0:
        return BlockResult(None, "closing", parent)
    if depth_change <= 0:
        # Allman style: ``function f()`` followed by a line that opens with ``{``.
        nxt = n + 1
        if nxt <= len(lines) and lines[nxt - 1].lstrip().startswith("{") and depth_change == 0:
            end = _close_from(deltas, nxt)
            if end is not None:
                return BlockResult((n, end), "ok")
        return BlockResult(None, "single_line", parent)
    end = _close_from(deltas, n)
    if end is None:
        return BlockResult(None, "parse_error")
    return BlockResult((n, end), "ok")


def _close_from(deltas: Sequence[tuple[int, int, bool]], n: int) -> int | None:
    depth = 0
    for idx in range(n - 1, len(deltas)):
        change, low, _ = deltas[idx]
        if idx > n - 1 and depth + low <= 0:
            return idx + 1
        depth += change
        if depth <= 0 and idx > n - 1:
            return idx + 1
    return None


def _enclosing(deltas: Sequence[tuple[int, int, bool]], n: int) -> int | None:
    depth = 0
    for idx in range(n - 2, -1, -1):
        change, _, _ = deltas[idx]
        depth += change
        if depth > 0:
            return idx + 1
    return None


def _next_opening(deltas: Sequence[tuple[int, int, bool]], lines: Sequence[str],
                  start: int) -> int | None:
    for idx in range(start - 1, len(deltas)):
        if deltas[idx][0] > 0 and not deltas[idx][2] and lines[idx].strip():
            return idx + 1
    return None


# --- YAML -----------------------------------------------------------------------------------

def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _yaml(lines: Sequence[str], n: int) -> BlockResult:
    text = lines[n - 1]
    if not text.strip():
        return BlockResult(None, "blank")
    base = _indent(text)
    end = n
    for idx in range(n, len(lines)):
        line = lines[idx]
        if not line.strip():
            continue
        if _indent(line) <= base:
            break
        end = idx + 1
    parent = next((i + 1 for i in range(n - 2, -1, -1)
                   if lines[i].strip() and _indent(lines[i]) < base), None)
    if end <= n:
        return BlockResult(None, "single_line", parent)
    return BlockResult((n, end), "ok")


_RESOLVERS: dict[str, Resolver] = {
    "python": _python,
    "markdown": _markdown,
    "brace": _brace,
    "yaml": _yaml,
}
