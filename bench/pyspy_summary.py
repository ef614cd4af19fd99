"""Summarize py-spy's collapsed stacks (``--format raw``) of a server: where its CPU went.

Each line of the input is ``frame;frame;...;frame count``, outermost first, a frame being
``function (file:line)``. Printed: the share of samples whose stack passes through each of a
few named areas of the path (inclusive), and the functions with the most samples of their
own (exclusive), files shortened to the package path.

    .venv/bin/python bench/pyspy_summary.py PROFILE.txt
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

#: Areas of the server path, matched against a frame's file and function (first match wins
#: per area; a stack counts once per area).
AREAS: tuple[tuple[str, str], ...] = (
    ("REST handlers (tornado, api/)", r"kaizen_server_extension/api/|tornado/web\.py"),
    ("lanes/ (claim, admission, drive)", r"kaizen_server_extension/lanes/"),
    ("runtime/ controller", r"kaizen_server_extension/runtime/"),
    ("host/run_host.py", r"kaizen_server_extension/host/run_host\.py"),
    ("model gateway (models/)", r"kaizen_server_extension/models/"),
    ("httpx/httpcore", r"/httpx/|/httpcore/"),
    ("tools/pipeline.py", r"kaizen_server_extension/tools/pipeline\.py"),
    ("store units (store/units.py)", r"kaizen_server_extension/store/units\.py"),
    ("SQLAlchemy", r"/sqlalchemy/"),
    ("events/ (bus, wire)", r"kaizen_server_extension/events/"),
    ("usage ledger (store/usage.py)", r"kaizen_server_extension/store/usage\.py"),
    ("json", r"/json/|\(json"),
    ("asyncio event loop (own frames)", r"asyncio/(base_events|events|selector_events)\.py"),
)

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]*)(?::(?P<line>\d+))?\)$")


def _short(path: str) -> str:
    for marker in ("site-packages/", "lib/python3.11/", "/hotpath/", "/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def summarize(raw: str, top: int = 25) -> str:
    stacks: list[tuple[list[str], int]] = []
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    total = sum(c for _, c in stacks) or 1
    areas: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for frames, count in stacks:
        for name, pattern in AREAS:
            if any(re.search(pattern, f) for f in frames):
                areas[name] += count
        match = _FRAME.match(frames[-1])
        leaf = frames[-1] if match is None else (
            f"{match['func']} ({_short(match['file'])})")
        own[leaf] += count
    lines = [f"samples: {total}", "inclusive share by area:"]
    lines += [f"  {100 * c / total:5.1f}%  {name}" for name, c in areas.most_common()]
    lines.append(f"top {top} functions by own samples:")
    lines += [f"  {100 * c / total:5.1f}%  {name}" for name, c in own.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize(Path(sys.argv[1]).read_text()))
