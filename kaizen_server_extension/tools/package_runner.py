"""Package tools: third-party code run out of process, with nothing secret to reach.

The trusted side (this module) owns everything about a package tool except its code: the
descriptor comes from the admin-reviewed manifest, and the room class in it is read here once,
closed to four values (R-214, R-215, R-216). The code runs in a child interpreter started in
isolated mode with an allowlisted environment: no database URL, key, token or ``KAIZEN_*``
setting is passed, and HOME is a fresh empty directory (R-465). The child answers with JSON on
stdout; only its ``result`` is used, so nothing the package prints or returns can change the
descriptor. The runner's deadline is the outer bound of the call, and the child's process
group is killed on timeout or cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kaizen_server_extension.protocol.tools import Capability, WriteCategory
from kaizen_server_extension.tools.decorators import TOOL_NAME_RE
from kaizen_server_extension.tools.types import (
    MAX_TIMEOUT_S,
    RegisteredTool,
    RoomClass,
    ToolContext,
    ToolDescriptor,
)

CHILD_SCRIPT = Path(__file__).with_name("package_runner_child.py")
ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL")
MAX_REPLY_BYTES = 1024 * 1024
DEFAULT_DEADLINE_S = 30.0
KILL_GRACE_S = 5.0

# What a package manifest may declare. Audience-safe reads need a first-party adapter that
# proves the room scope, so a package cannot claim one.
PACKAGE_ROOM_CLASSES = frozenset(
    {RoomClass.ACTOR_BOUND_READ, RoomClass.ACTOR_PRIVATE_READ, RoomClass.ACTOR_BOUND_WRITE}
)


def declared_room_class(value: object) -> RoomClass:
    """The manifest's room-class declaration, closed: anything missing, malformed, unknown or
    not allowed for packages is UNKNOWN, which keeps the tool out of shared rooms (R-215)."""
    if isinstance(value, str):
        try:
            room_class = RoomClass(value)
        except ValueError:
            return RoomClass.UNKNOWN
        if room_class in PACKAGE_ROOM_CLASSES:
            return room_class
    return RoomClass.UNKNOWN


def declared_capability(value: object) -> Capability:
    """read / write / sensitive, else UNDECLARED (handled as the strictest)."""
    if isinstance(value, str) and value in {"read", "write", "sensitive"}:
        return Capability(value)
    return Capability.UNDECLARED


class PackageToolError(RuntimeError):
    """The package raised, or broke the runner protocol. Deliberately not member-safe: for a
    write it must surface as a raise (ambiguous), not as an ordinary error result."""


def child_environment(home: str) -> dict[str, str]:
    """The child's entire environment: an allowlist, never a denylist of the parent's."""
    env = {key: os.environ[key] for key in ENV_ALLOWLIST if key in os.environ}
    env.update(HOME=home, TMPDIR=home, PYTHONDONTWRITEBYTECODE="1")
    return env


@dataclass(frozen=True)
class PackageRunner:
    """Runs one package entry point per call in a fresh isolated child interpreter."""

    deadline_s: float = DEFAULT_DEADLINE_S
    python: str = sys.executable

    async def run(self, package_dir: str, entry: str, arguments: Mapping[str, Any]) -> Any:
        request = json.dumps(
            {"package_dir": package_dir, "entry": entry, "arguments": dict(arguments)}
        ).encode()
        with tempfile.TemporaryDirectory(prefix="kaizen-pkg-") as home:
            proc = await asyncio.create_subprocess_exec(
                self.python, "-I", "-B", str(CHILD_SCRIPT),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                env=child_environment(home),
                cwd=home,
                start_new_session=True,  # its own process group, so a kill reaches grandchildren
            )
            try:
                reply = await asyncio.wait_for(
                    self._exchange(proc, request), timeout=min(self.deadline_s, MAX_TIMEOUT_S)
                )
            finally:
                if proc.returncode is None or not (proc.stdout and proc.stdout.at_eof()):
                    _kill(proc)
                    # Bounded: a child that cannot be reaped must not hold the turn forever.
                    with contextlib.suppress(ProcessLookupError, TimeoutError):
                        await asyncio.wait_for(_reap(proc), timeout=KILL_GRACE_S)
        return _result_of(reply)

    @staticmethod
    async def _exchange(proc: asyncio.subprocess.Process, request: bytes) -> bytes:
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(request)
            await proc.stdin.drain()
            proc.stdin.close()
        chunks: list[bytes] = []
        size = 0
        while chunk := await proc.stdout.read(64 * 1024):
            size += len(chunk)
            if size > MAX_REPLY_BYTES:  # stop reading; the caller kills the child
                raise PackageToolError(f"package tool reply exceeds {MAX_REPLY_BYTES} bytes")
            chunks.append(chunk)
        await proc.wait()
        return b"".join(chunks)


async def _reap(proc: asyncio.subprocess.Process) -> None:
    # Reading to EOF lets the subprocess transport close itself; an unread pipe would keep
    # it open past the event loop.
    if proc.stdout is not None:
        while await proc.stdout.read(64 * 1024):
            pass
    await proc.wait()


def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the child's whole process group, and the child itself in case the group is
    already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def _result_of(reply: bytes) -> Any:
    try:
        message = json.loads(reply)
    except ValueError:
        raise PackageToolError("package tool broke the runner protocol") from None
    if not isinstance(message, dict) or not isinstance(message.get("ok"), bool):
        raise PackageToolError("package tool broke the runner protocol")
    if not message["ok"]:
        raise PackageToolError(
            f"package tool raised {str(message.get('error_type'))[:80]}: "
            f"{str(message.get('error'))[:500]}"
        )
    # Only "result" crosses; any other member of the reply is ignored.
    return message.get("result")


def package_tool(
    manifest: Mapping[str, Any], *, package_dir: str, runner: PackageRunner
) -> RegisteredTool:
    """The trusted wrapper for one manifest-declared package tool.

    ``manifest`` is the admin-reviewed entry: ``name``, ``description``, ``entry``
    (``module:function``), ``input_schema``, and optionally ``capability``, ``room_class``,
    ``timeout_s``. The descriptor is fixed here; the call's deadline is the runner's (R-265),
    never more than the shared ceiling (R-266).
    """
    name = str(manifest.get("name", ""))
    entry = str(manifest.get("entry", ""))
    if not TOOL_NAME_RE.fullmatch(name) or ":" not in entry:
        raise ValueError(f"package tool manifest needs a valid name and module:function entry "
                         f"(got name={name[:80]!r})")
    schema = manifest.get("input_schema")
    capability = declared_capability(manifest.get("capability"))
    descriptor = ToolDescriptor(
        name=name,
        description=str(manifest.get("description", "")),
        input_schema=dict(schema) if isinstance(schema, Mapping) else {},
        capability=capability,
        timeout_s=min(runner.deadline_s, MAX_TIMEOUT_S),
        room_class=declared_room_class(manifest.get("room_class")),
        write_category=(WriteCategory.NONE if capability is Capability.READ
                        else WriteCategory.EXTERNAL_EFFECT),
        surface=str(manifest.get("surface") or "packages"),
        first_party=False,
    )

    async def impl(ctx: ToolContext, **arguments: Any) -> Any:
        return await runner.run(package_dir, entry, arguments)

    return RegisteredTool(descriptor=descriptor, impl=impl)
