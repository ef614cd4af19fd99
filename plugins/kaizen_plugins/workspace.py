"""read_workspace / edit_workspace: Hashline (OMP G4) views and edits of the run_code workspace.

Both tools act only inside the lease workspace of ``ctx.member`` + ``ctx.bundle.conversation_id``
(``ctx.services.run_code.workspace(...)``, the directory run_code's kernels use, R-153) and
are write-tier (R-169): a four-hex tag is never authority, it only indexes trusted state.

Trusted state (snapshots, seen lines, named registers) lives in the database when the host
provides ``ctx.services.workspace_store`` (the server does: it survives a lease release and
a replica change, R-159); otherwise an in-memory state handed as the extra service
``workspace_state``, or the module-level :data:`DEFAULT_STATE`. None of them lives in the
workspace (R-083).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kaizen_hashline.limits import MAX_PATH_CHARS, MAX_PROGRAM_CHARS, MAX_READ_LINES
from kaizen_plugins.sandbox import SANDBOX_TOOL
from kaizen_server_extension.tools import (
    MemberSafeError,
    ToolContext,
    hookimpl,
    tool,
)
from kaizen_server_extension.tools.hookspecs import ToolRegistrar

if TYPE_CHECKING:
    from kaizen_hashline import WorkspaceFS, WorkspaceKey, WorkspaceState

WORKSPACE_TIMEOUT_S = 60
PROTOCOL = "workspace"

READ_DESCRIPTION = (
    "Read a UTF-8 text file of this conversation's private sandbox workspace (the directory "
    "run_code works in) as numbered rows under a header [PATH#TAG]: one 'N:TEXT' row per "
    f"line, at most {MAX_READ_LINES} lines per call from 'start'; total_lines and next_start "
    "tell you what is left. TAG (4 hex digits) identifies this version of the whole file: "
    "copy the header into edit_workspace. Only lines you have been shown can be edited."
)

EDIT_DESCRIPTION = """\
Edit workspace files with Hashline. 'edits' is a program of sections; each starts with the \
[PATH#TAG] header from read_workspace, followed by operations. Line numbers always refer to \
the file as read under that TAG (never shifted by other operations in the same call).
PUT A.=B:   then '+' rows: replace lines A..B (inclusive) with the rows
PUT N*:     then '+' rows: replace the syntax block opening on line N (function, class, heading)
PUT <N: / PUT >N: / PUT >$: / PUT >N*:   then '+' rows: insert before line N / after line N / \
at the end / after the block opening at N (<1 is the start of the file)
CUT A.=B  or  CUT N*   delete lines (copied to the clipboard); CUT A.=B @name copies to \
register @name (kept across calls)
PUT <N  /  PUT >N @name  (no ':' and no rows): paste the last CUT / register @name there
PUT A.=B @name: replace lines A..B with register @name
REM: delete the file (alone in its section).  MV new/path: move the file after its edits
Every body row starts with '+' ('+' alone is an empty line; '++x' writes '+x'). Several \
sections edit several files; all of them are written or none is. The result has the new \
[PATH#TAG] headers and a unified diff."""

READ_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1, "maxLength": MAX_PATH_CHARS,
                 "description": "Path relative to the workspace, e.g. src/app.py"},
        "start": {"type": "integer", "minimum": 1, "default": 1,
                  "description": "First line to show (1-based)."},
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_READ_LINES,
                  "default": MAX_READ_LINES, "description": "How many lines to show."},
    },
    "required": ["path"],
    "additionalProperties": False,
}

EDIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "edits": {"type": "string", "minLength": 1, "maxLength": MAX_PROGRAM_CHARS,
                  "description": "The Hashline program: [PATH#TAG] sections with PUT/CUT/REM/MV."},
    },
    "required": ["edits"],
    "additionalProperties": False,
}


_default_state: WorkspaceState | None = None


def default_state() -> WorkspaceState:
    """The in-process state when the host keeps none (made on first use: the Hashline engine
    is loaded by the first workspace call, not when the plugin registers)."""
    global _default_state
    if _default_state is None:
        from kaizen_hashline import WorkspaceState

        _default_state = WorkspaceState()
    return _default_state


def __getattr__(name: str) -> Any:
    # ``DEFAULT_STATE`` and the Hashline names this module used to import, on demand.
    if name == "DEFAULT_STATE":
        return default_state()
    if name in ("WorkspaceFS", "WorkspaceKey", "WorkspaceState", "edit_files", "read_file"):
        import kaizen_hashline

        return getattr(kaizen_hashline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def workspace_state(ctx: ToolContext) -> WorkspaceState:
    """The trusted state service, or the in-process default."""
    state = ctx.services.get("workspace_state")
    return state if state is not None else default_state()


@asynccontextmanager
async def _trusted_state(ctx: ToolContext, key: WorkspaceKey) -> AsyncIterator[WorkspaceState]:
    """The namespace's state for one call: from the database when the host keeps it there
    (``ctx.services.workspace_store``, R-159), else the in-process state."""
    stored = ctx.services.workspace_store
    if stored is None:
        yield workspace_state(ctx)
        return
    async with stored.session(key) as state:
        yield state


def _workspace(ctx: ToolContext) -> tuple[WorkspaceFS, WorkspaceKey]:
    service = ctx.services.run_code
    if service is None:
        raise MemberSafeError("The sandbox workspace is not available on this server.",
                              code="workspace_unavailable")
    conversation = ctx.bundle.conversation_id
    root: Path = service.workspace(ctx.member, conversation)
    from kaizen_hashline import WorkspaceFS, WorkspaceKey

    return WorkspaceFS(root), WorkspaceKey(ctx.member, conversation)


@tool(
    name="read_workspace",
    description=READ_DESCRIPTION,
    input_schema=READ_SCHEMA,
    timeout_s=WORKSPACE_TIMEOUT_S,
    protocol_group=PROTOCOL,
    **SANDBOX_TOOL,
)
async def read_workspace(ctx: ToolContext, **arguments: Any) -> dict[str, Any]:
    from kaizen_hashline import read_file

    fs, key = _workspace(ctx)
    async with _trusted_state(ctx, key) as state:
        result = await asyncio.to_thread(
            read_file, fs, state, key, arguments["path"],
            int(arguments.get("start", 1)), int(arguments.get("limit", MAX_READ_LINES)))
    return result.to_payload()


@tool(
    name="edit_workspace",
    description=EDIT_DESCRIPTION,
    input_schema=EDIT_SCHEMA,
    timeout_s=WORKSPACE_TIMEOUT_S,
    protocol_group=PROTOCOL,
    **SANDBOX_TOOL,
)
async def edit_workspace(ctx: ToolContext, **arguments: Any) -> dict[str, Any]:
    from kaizen_hashline import edit_files

    fs, key = _workspace(ctx)
    async with _trusted_state(ctx, key) as state:
        result = await asyncio.to_thread(edit_files, fs, state, key, arguments["edits"])
    return result.to_payload()


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(read_workspace)
    register(edit_workspace)
