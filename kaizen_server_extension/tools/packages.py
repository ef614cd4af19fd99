"""Package tools an operator installs as files: a directory of reviewed packages, loaded at
start-up and registered as third-party tools.

``KAIZEN_PACKAGE_TOOLS_DIR`` names a directory; each subdirectory is one package: its code,
and a ``kaizen-tools.json`` listing the tools it offers (the admin-reviewed manifests of
``tools/package_runner.py``: ``name``, ``description``, ``entry`` ``module:function``,
``input_schema``, and optionally ``capability``, ``room_class``, ``surface``), either as the
whole file or as its ``tools`` member. Each tool is
wrapped by :func:`~kaizen_server_extension.tools.package_runner.package_tool`, so its
declaration is the manifest's, its code runs in a secretless child interpreter (R-465), and
its calls go through the same guarded pipeline as every tool. They register through
``kaizen_register_tools`` like any third-party plugin, so the registry's rules hold (no
built-in or reserved name, no duplicates). A manifest that cannot be read stops start-up
naming its file.

**MCP descriptors** a package declares (the manifest object's ``mcp`` member: a list of
objects, e.g. a server's name, transport and tools) are recorded on the package as frozen
metadata and nothing else (spec: A note on MCP, R-064): Kaizen never starts, connects to or
lists such a server, never turns them into tools, and never reads a grant, an agent or a
policy from them. Only an administrator's ``KAIZEN_MCP_SERVERS`` makes an MCP server a source
(``tools/mcp_sources.py``), whatever a package says.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kaizen_server_extension.tools._frozen import deep_freeze
from kaizen_server_extension.tools.hookspecs import ToolRegistrar, hookimpl
from kaizen_server_extension.tools.package_runner import PackageRunner, package_tool
from kaizen_server_extension.tools.types import RegisteredTool

log = logging.getLogger("kaizen.tools.packages")

MANIFEST_NAME = "kaizen-tools.json"
#: Largest manifest file read.
MAX_MANIFEST_BYTES = 256 * 1024
#: MCP descriptors one package may record (metadata only, never hosted: R-064).
MAX_MCP_DESCRIPTORS = 32


class PackageManifestError(ValueError):
    """A package's manifest cannot be used; the message names the file."""


@dataclass(frozen=True)
class PackageToolsPlugin:
    """The installed packages' tools, as one pluggy plugin per package."""

    package: str
    tools: tuple[RegisteredTool, ...]
    #: The package's declared MCP descriptors, deep-frozen: recorded, never hosted, executed
    #: or read as authority (R-064).
    mcp_descriptors: tuple[Mapping[str, Any], ...] = ()

    @hookimpl
    def kaizen_register_tools(self, register: ToolRegistrar) -> None:
        for registered in self.tools:
            register(registered)


def load_packages(directory: Path, *, deadline_s: float) -> list[PackageToolsPlugin]:
    """One plugin per package subdirectory of ``directory`` that has a manifest, in name
    order; raises :class:`PackageManifestError` for the first manifest it cannot use."""
    if not directory.is_dir():
        raise PackageManifestError(f"{directory} is not a directory")
    runner = PackageRunner(deadline_s=deadline_s)
    plugins: list[PackageToolsPlugin] = []
    for package_dir in sorted(p for p in directory.iterdir() if p.is_dir()):
        manifest_path = package_dir / MANIFEST_NAME
        if not manifest_path.is_file():
            continue
        entries, mcp = _read_manifest(manifest_path)
        try:
            tools = tuple(package_tool(entry, package_dir=str(package_dir.resolve()),
                                       runner=runner) for entry in entries)
        except ValueError as exc:
            raise PackageManifestError(f"{manifest_path}: {exc}") from None
        if mcp:
            log.info("package %s declares %d MCP descriptor(s): recorded as metadata only, "
                     "not hosted or run", package_dir.name, len(mcp))
        plugins.append(PackageToolsPlugin(package_dir.name, tools, mcp))
    return plugins


def _read_manifest(path: Path) -> tuple[list[dict[str, object]], tuple[Mapping[str, Any], ...]]:
    """(tool manifests, recorded MCP descriptors) of one manifest file."""
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise PackageManifestError(f"{path} is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackageManifestError(f"{path} is not readable JSON ({exc})") from None
    mcp: object = []
    if isinstance(value, dict) and set(value) <= {"tools", "mcp"}:
        value, mcp = value.get("tools", []), value.get("mcp", [])
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise PackageManifestError(f"{path} must be a JSON list of tool manifests, or an "
                                   "object of 'tools' and 'mcp' lists")
    if not isinstance(mcp, list) or not all(isinstance(entry, dict) for entry in mcp) \
            or len(mcp) > MAX_MCP_DESCRIPTORS:
        raise PackageManifestError(f"{path}: 'mcp' must be a list of at most "
                                   f"{MAX_MCP_DESCRIPTORS} MCP descriptor objects")
    return value, tuple(deep_freeze(entry) for entry in mcp)
