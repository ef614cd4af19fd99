"""Model-facing text: instructions written for the model, never for the member.

A tool result can carry text addressed to the model, such as run_code's
``repair_instruction`` ("The run failed with ModuleNotFoundError. Fix the code and run it
again; ..."). A small model that copies it into its reply would otherwise hand the member
an instruction meant for itself as the answer. So:

* Such text is *marked*: a tool body keeps it under a key named in :data:`DIRECTIVE_KEYS`
  (top level of the body). The trusted backend lifts it into
  ``ToolCallResult.model_facing`` when the call settles (:func:`directives_in`), and the
  controller adds the instructions it appends itself (synthesis, reminders, nudges).
* :func:`echoes` tells whether an answer reproduces any of it: some
  :data:`ECHO_WINDOW` consecutive words of a directive, case and punctuation aside. A
  plain statement such as "the code failed with ModuleNotFoundError: No module named
  'pandas'" shares fewer words with the directive and passes.
* The controller never commits an echo (it asks again, bounded, then says plainly that the
  call failed and why), and the host refuses to journal or settle one as an answer
  whichever controller sent it.

Pure and stdlib-only: both sides of the boundary import it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

#: Keys of a tool body whose string value is addressed to the model, not the member.
DIRECTIVE_KEYS: tuple[str, ...] = ("repair_instruction",)
#: How many consecutive words of a directive an answer must reproduce to be an echo.
ECHO_WINDOW = 6
#: Bound of one directive as kept for the guard (longer text is cut, not dropped).
MAX_DIRECTIVE_CHARS = 2000
#: Bound of a tool body parsed from JSON text to look for directives.
MAX_BODY_CHARS = 1_000_000

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def directives_in(body: object) -> tuple[str, ...]:
    """The model-facing strings of one tool body (a mapping, or its JSON text)."""
    if isinstance(body, str):
        text = body.strip()
        if not text.startswith("{") or len(text) > MAX_BODY_CHARS:
            return ()
        try:
            body = json.loads(text)
        except (ValueError, RecursionError):
            return ()
    if not isinstance(body, Mapping):
        return ()
    found: list[str] = []
    for key in DIRECTIVE_KEYS:
        value = body.get(key)
        if isinstance(value, str) and value.strip():
            found.append(value[:MAX_DIRECTIVE_CHARS])
    return tuple(found)


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _windows(words: list[str], size: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + size]) for i in range(len(words) - size + 1)}


def echoes(answer: str, directives: Iterable[str], *, window: int = ECHO_WINDOW) -> bool:
    """True when ``answer`` reproduces ``window`` consecutive words of any directive (a
    directive shorter than that counts when the answer holds all of it). Linear in the
    lengths of the texts."""
    spoken = _words(answer)
    if not spoken:
        return False
    spoken_windows: dict[int, set[tuple[str, ...]]] = {}
    for directive in directives:
        words = _words(directive)
        if not words:
            continue
        size = min(window, len(words))
        mine = spoken_windows.setdefault(size, _windows(spoken, size))
        if mine and not mine.isdisjoint(_windows(words, size)):
            return True
    return False


#: The built-in rule id journaled (``correction.applied``) when an answer that echoed
#: model-facing text was discarded and the step asked again.
ECHO_RULE_ID = "kaizen.model_facing_echo"
#: What the model is told after such an answer was discarded (the text is itself model-facing).
ECHO_REMINDER = (
    "Your last reply repeated an instruction that was meant for you, not for the member, so "
    "it was not shown. Either call a tool to fix the problem, or answer the member in your "
    "own words: say what you did, what the result was, or that it failed and why."
)
#: How often one run discards an echo and asks again before it says plainly what failed.
MAX_ECHO_RESTEPS = 1
#: The terminal reason of a run whose answer could only have been an echo.
ECHO_REASON = "model_facing_answer"
