"""Helpers for the Hashline tests: a workspace on disk, its trusted state, and a snapshot of
every file (bytes and symlinks) to prove a refused edit left the workspace untouched."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kaizen_hashline import (
    EditResult,
    ReadResult,
    WorkspaceFS,
    WorkspaceKey,
    WorkspaceState,
    edit_files,
    read_file,
)

SETTINGS = ('import os\n\nTIMEOUT = 30\nRETRIES = 3\n\ndef load():\n'
            '    path = os.environ.get("CFG")\n    return path\n')
UTIL = "def helper(x):\n    return x * 2\n\ndef unused():\n    pass\n"


def tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: file bytes, ``->target`` for symlinks, ``<dir>``."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            rel = str(full.relative_to(root))
            if full.is_symlink():
                out[rel] = "->" + os.readlink(full)
            elif full.is_dir():
                out[rel] = "<dir>"
            else:
                out[rel] = full.read_bytes()
    return out


@dataclass
class Workspace:
    root: Path
    state: WorkspaceState = field(default_factory=WorkspaceState)
    key: WorkspaceKey = field(default_factory=lambda: WorkspaceKey("alice", "conv-1"))
    fs: WorkspaceFS | None = None

    def __post_init__(self) -> None:
        if self.fs is None:
            self.fs = WorkspaceFS(self.root)

    @property
    def files(self) -> WorkspaceFS:
        assert self.fs is not None
        return self.fs

    def write(self, path: str, content: str | bytes) -> None:
        full = self.root / path
        full.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            full.write_bytes(content.encode("utf-8"))
        else:
            full.write_bytes(content)

    def text(self, path: str) -> str:
        return (self.root / path).read_bytes().decode("utf-8")

    def read(self, path: str, start: int = 1, limit: int = 400) -> ReadResult:
        return read_file(self.files, self.state, self.key, path, start, limit)

    def edit(self, program: str) -> EditResult:
        return edit_files(self.files, self.state, self.key, program)

    def tree(self) -> dict[str, bytes | str]:
        return tree(self.root)
