"""Package tools an operator installs as files: a directory of reviewed packages, loaded at
start-up and registered as third-party tools.

``KAIZEN_PACKAGE_TOOLS_DIR`` names a directory; each subdirectory is one package: its code,
and a ``kaizen-tools.json`` listing the tools it offers (the admin-reviewed manifests of
``tools/package_runner.py``: ``name``, ``description``, ``entry`` ``module:function``,
``input_schema``, and optionally ``capability``, ``room_class``, ``surface``). Each tool is
wrapped by :func:`~kaizen_server_extension.tools.package_runner.package_tool`, so its
declaration is the manifest's, its code runs in a secretless child interpreter (R-465), and
its calls go through the same guarded pipeline as every tool. They register through
``kaizen_register_tools`` like any third-party plugin, so the registry's rules hold (no
built-in or reserved name, no duplicates). A manifest that cannot be read stops start-up
naming its file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kaizen_server_extension.tools.hookspecs import ToolRegistrar, hookimpl
from kaizen_server_extension.tools.package_runner import PackageRunner, package_tool
from kaizen_server_extension.tools.types import RegisteredTool

MANIFEST_NAME = "kaizen-tools.json"
#: Largest manifest file read.
MAX_MANIFEST_BYTES = 256 * 1024


class PackageManifestError(ValueError):
    """A package's manifest cannot be used; the message names the file."""


@dataclass(frozen=True)
class PackageToolsPlugin:
    """The installed packages' tools, as one pluggy plugin per package."""

    package: str
    tools: tuple[RegisteredTool, ...]

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
        entries = _read_manifest(manifest_path)
        try:
            tools = tuple(package_tool(entry, package_dir=str(package_dir.resolve()),
                                       runner=runner) for entry in entries)
        except ValueError as exc:
            raise PackageManifestError(f"{manifest_path}: {exc}") from None
        plugins.append(PackageToolsPlugin(package_dir.name, tools))
    return plugins


def _read_manifest(path: Path) -> list[dict[str, object]]:
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise PackageManifestError(f"{path} is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackageManifestError(f"{path} is not readable JSON ({exc})") from None
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise PackageManifestError(f"{path} must be a JSON list of tool manifests")
    return value
