"""Hypothesis: arbitrary programs never crash the parser or the applier (only HashlineError),
and a refused or failed edit never leaves a partial write."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kaizen_hashline import (
    HashlineError,
    WorkspaceFS,
    WorkspaceKey,
    WorkspaceState,
    compute_tag,
    edit_files,
    parse,
    read_file,
)
from kaizen_hashline.text import normalize
from tests.hashline.support import tree

TOKENS = ["[", "]", "#", "a.py", "b.md", "BC00", "00FF", "PUT", "CUT", "REM", "MV", " ", ":",
          "+", "++", "-", "@r", "@", ".=", "..", "-", "*", "<", ">", "$", "1", "2", "3", "10",
          "0", "\n", "\r\n", "*** Begin Patch", "*** End Patch", "@@", "x", "\t", "…", "'"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=60) | st.text(max_size=200))
def test_parser_never_crashes(parts: list[str] | str):
    text = parts if isinstance(parts, str) else "".join(parts)
    try:
        program = parse(text)
    except HashlineError as exc:
        assert exc.code and str(exc)
        return
    assert program.sections and all(s.items for s in program.sections)


LINE = st.sampled_from(["", "x = 1", "def f():", "    return 1", "# h", "}", "{", "- a",
                        "  ", "y", "x = 1"])
FILES = ("a.py", "b.md", "c.txt")


@st.composite
def hunk(draw: st.DrawFn) -> str:
    """Mostly well-formed hunks (so the applier and the commit are exercised), sometimes not."""
    n = draw(st.integers(1, 9))
    m = draw(st.integers(n, n + 3))
    span = draw(st.sampled_from([f"{n}.={m}", f"{n}*", f"{n}.={n}"]))
    gap = draw(st.sampled_from([f"<{n}", f">{n}", ">$", f">{n}*", "<1"]))
    reg = draw(st.sampled_from([" @r", " @s"]))
    body = "".join(f"+{row}\n" for row in draw(st.lists(LINE, min_size=1, max_size=3)))
    if draw(st.integers(0, 19)) == 19:
        return draw(st.sampled_from([
            f"PUT {span}\n",  # malformed: colonless span without a register
            f"PUT {gap}:\n",  # malformed: empty insert
            f"CUT {gap}\n",   # malformed: CUT at a gap
        ]))
    return draw(st.sampled_from([
        f"PUT {span}:\n{body}",
        f"PUT {gap}:\n{body}",
        f"CUT {span}\n",
        f"CUT {span}{reg}\n",
        f"PUT {gap}\n",
        f"PUT {gap}{reg}\n",
        f"PUT {span}{reg}\n",
    ]))


@st.composite
def program(draw: st.DrawFn, tags: dict[str, str]) -> str:
    out = []
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(FILES))
        tag = "0000" if draw(st.integers(0, 19)) == 19 else tags[path]
        kind = draw(st.integers(0, 9))
        if kind == 9:
            ops = "REM\n"
        else:
            ops = "".join(draw(st.lists(hunk(), min_size=1, max_size=4)))
            if kind == 8:
                dest = draw(st.sampled_from(["d.txt", "sub/e.py", "c.txt", "../z", "a.py"]))
                ops += f"MV {dest}\n"
        out.append(f"[{path}#{tag}]\n{ops}")
    return "".join(out)


class Faulty(WorkspaceFS):
    def __init__(self, root: Path, fail_at: int | None) -> None:
        super().__init__(root)
        self.fail_at = fail_at
        self.count = 0

    def _tick(self) -> None:
        self.count += 1
        if self.fail_at is not None and self.count == self.fail_at:
            raise OSError(5, "injected")

    def _write_temp(self, dir_fd: int, name: str, data: bytes, mode: int) -> None:
        self._tick()
        super()._write_temp(dir_fd, name, data, mode)

    def _rename(self, src_fd: int, src: str, dst_fd: int, dst: str) -> None:
        self._tick()
        super()._rename(src_fd, src, dst_fd, dst)

    def _unlink(self, dir_fd: int, name: str) -> None:
        self._tick()
        super()._unlink(dir_fd, name)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.lists(st.lists(LINE, min_size=2, max_size=10), min_size=3, max_size=3),
       st.sampled_from(["\n", "\r\n"]), st.none() | st.integers(1, 6))
def test_edits_never_crash_and_never_write_partially(data: st.DataObject,
                                                     contents: list[list[str]], eol: str,
                                                     fail_at: int | None):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for path, rows in zip(FILES, contents, strict=True):
            (root / path).write_bytes("".join(r + eol for r in rows).encode())
        state = WorkspaceState()
        key = WorkspaceKey("alice", "c")
        clean = WorkspaceFS(root)
        tags = {p: read_file(clean, state, key, p).tag for p in FILES}
        text = data.draw(program(tags))
        # Sometimes the live file moves under the snapshot: stale recovery is exercised too.
        drift = data.draw(st.sampled_from([None, None, "prepend", "change", "append"]))
        if drift is not None:
            drifting = root / "c.txt"
            rows = drifting.read_bytes().decode().split(eol)
            if drift == "prepend":
                rows.insert(0, "drift")
            elif drift == "append":
                rows.insert(len(rows) - 1, "drift")
            else:
                rows[0] = "drift"
            drifting.write_bytes(eol.join(rows).encode())
        before = tree(root)
        fs = Faulty(root, fail_at)
        try:
            result = edit_files(fs, state, key, text)
        except HashlineError as exc:
            assert exc.code
            assert tree(root) == before, f"partial write after {exc.code}: {text!r}"
            return
        after = tree(root)
        assert not any(".kaizen-hl-" in name for name in after)
        for section in result.sections:
            target = section.moved_to or section.path
            if section.status == "deleted":
                assert target not in after
                continue
            raw = (root / target).read_bytes().decode()
            assert compute_tag(normalize(raw)) == section.tag
            assert "\r\n" not in raw or eol == "\r\n"
        for name in os.listdir(root):
            assert not name.startswith(".kaizen-hl-")
