"""Tool-result compression: the one seam where the model-bound copy of a result may shrink.

Spec (tools: Compression at the tool boundary): only where the member opted in, and only the
``stdout``/``stderr`` of a ``run_code`` result — the model's copy. The journaled result stays
the raw projection, so the panel, the audit and a recovered run's history read what the
kernel printed (R-471); search, retrieval and every other tool's evidence pass through byte
for byte. Compression that fails, or that would not shorten anything, hands back the original
and the turn goes on: it can never fail or widen a call (R-472).

What is removed is what a terminal would not show or a reader would skim: text a carriage
return overwrote (progress bars), ANSI escapes, runs of one repeated line, and the middle of a
long run of lines that differ only in their numbers (a training log), whose first and last
lines stay. Deterministic, so a recovered run rebuilds the same model context.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from itertools import groupby

from kaizen_server_extension.protocol.tools import ToolCallResult

log = logging.getLogger(__name__)

#: The only tool whose results are eligible (its projection holds the kernel's streams).
COMPRESSIBLE_TOOL = "run_code"
STREAMS = ("stdout", "stderr")

#: Identical consecutive lines from this many on become one line and a count.
MIN_REPEATS = 3
#: Lines differing only in their digits: from this many on, the middle is dropped ...
MIN_SIMILAR = 10
#: ... keeping this many at each end.
KEEP_SIMILAR = 3

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_DIGITS = re.compile(r"\d+(?:\.\d+)?")


def compress_output(text: str) -> str:
    """``text`` as a reader needs it: see the module docstring for what goes."""
    lines = [_as_displayed(line) for line in _ANSI.sub("", text).split("\n")]
    out: list[str] = []
    for _, run in groupby(lines, key=_shape):
        out.extend(_collapse(list(run)))
    return "\n".join(out)


def _as_displayed(line: str) -> str:
    """What a terminal shows of a line a carriage return rewrote: its last non-empty part."""
    if "\r" not in line:
        return line
    parts = [part for part in line.split("\r") if part]
    return parts[-1] if parts else ""


def _shape(line: str) -> str:
    return _DIGITS.sub("#", line)


def _collapse(run: list[str]) -> Iterator[str]:
    """One run of lines of the same shape."""
    repeats = [list(same) for _, same in groupby(run)]
    if len(repeats) >= MIN_SIMILAR and len(run) == len(repeats):
        yield from run[:KEEP_SIMILAR]
        omitted = len(run) - 2 * KEEP_SIMILAR
        yield f"[... {omitted} similar lines omitted ...]"
        yield from run[-KEEP_SIMILAR:]
        return
    for same in repeats:
        if len(same) >= MIN_REPEATS and same[0].strip():
            yield same[0]
            yield f"[previous line repeated {len(same) - 1} more times]"
        else:
            yield from same


def model_bound(result: ToolCallResult, *, enabled: bool,
                compress: Callable[[str], str] = compress_output) -> str:
    """The content the model reads for ``result``: its projection, compressed where the
    member opted in and the result is eligible. Anything unexpected keeps the original."""
    if not enabled or result.name != COMPRESSIBLE_TOOL:
        return result.content
    try:
        body = json.loads(result.content)
    except ValueError:
        return result.content  # a bounded (cut) projection is no longer JSON
    if not isinstance(body, dict):
        return result.content
    try:
        changed = False
        for stream in STREAMS:
            value = body.get(stream)
            if isinstance(value, str) and value:
                shorter = compress(value)
                if len(shorter) < len(value):
                    body[stream] = shorter
                    changed = True
        if not changed:
            return result.content
        text = json.dumps(body, ensure_ascii=False)
    except Exception as exc:
        # Logged by kind only: the result's text never reaches an operator's log.
        log.warning("tool-result compression failed (%s); the original result was used",
                    type(exc).__name__)
        return result.content
    return text if len(text) < len(result.content) else result.content
