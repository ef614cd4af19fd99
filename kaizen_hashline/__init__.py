"""Hashline: the OMP-compatible (G4) read/edit language for the run_code workspace.

Layers (only :mod:`~kaizen_hashline.fs` touches the filesystem):

* :mod:`.text` — normalization, lines, the four-hex tag (xxHash32), write-back format;
* :mod:`.syntax` — the edit-program parser (sections, PUT/CUT/REM/MV, registers);
* :mod:`.blocks` — ``N*`` syntax-block resolvers (Python ast, Markdown, brace languages, YAML);
* :mod:`.apply` — the pure applier and the register file;
* :mod:`.recovery` — stale-anchor remapping onto one unambiguous region;
* :mod:`.state` — trusted snapshots, seen lines and named registers per (actor, conversation);
* :mod:`.fs` — no-follow workspace I/O and the all-or-nothing :class:`Transaction`;
* :mod:`.engine` — :func:`read_file` and :func:`edit_files`, the two tool operations.
"""


from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kaizen_hashline.engine import EditResult, ReadResult, edit_files, read_file
    from kaizen_hashline.errors import HashlineError
    from kaizen_hashline.fs import MAX_FILE_BYTES, WorkspaceFS, canonical_path
    from kaizen_hashline.state import WorkspaceKey, WorkspaceState
    from kaizen_hashline.syntax import Program, parse
    from kaizen_hashline.text import compute_tag, normalize, xxh32

# Each name is loaded from its module on first use (PEP 562): importing one submodule, say
# ``kaizen_hashline.limits`` for a tool's schema at start-up, does not load the engine.
_HOMES = {
    "EditResult": "engine", "ReadResult": "engine", "edit_files": "engine",
    "read_file": "engine", "HashlineError": "errors", "MAX_FILE_BYTES": "fs",
    "WorkspaceFS": "fs", "canonical_path": "fs", "WorkspaceKey": "state",
    "WorkspaceState": "state", "Program": "syntax", "parse": "syntax",
    "compute_tag": "text", "normalize": "text", "xxh32": "text",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'kaizen_hashline' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"kaizen_hashline.{home}"), name)
    globals()[name] = value
    return value

__all__ = [
    "MAX_FILE_BYTES",
    "EditResult",
    "HashlineError",
    "Program",
    "ReadResult",
    "WorkspaceFS",
    "WorkspaceKey",
    "WorkspaceState",
    "canonical_path",
    "compute_tag",
    "edit_files",
    "normalize",
    "parse",
    "read_file",
    "xxh32",
]
