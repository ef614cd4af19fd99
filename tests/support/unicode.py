"""Hypothesis strategies for "any Unicode string": every code point, unpaired surrogates
included (a JSON ``"\\ud800"`` escape decodes to one), weighted towards what a database or
an escaping scheme finds hard."""

from __future__ import annotations

from hypothesis import strategies as st

#: Pieces an escaping scheme must survive: NUL, both surrogate halves, a backslash, a
#: ready-made escape sequence, other control characters, an astral code point.
HARD_PIECES = ("\x00", "\ud800", "\udfff", "\\", "\\u0000", "\\\\", "\x07", "\x1b[31m",
               "\x7f", "\r\n", "\U0001f600", "\ufffd")

any_text = st.lists(
    st.one_of(st.characters(exclude_categories=()), st.sampled_from(HARD_PIECES)),
    min_size=1, max_size=20).map("".join)
