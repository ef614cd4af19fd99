"""MCP descriptors an installed package declares: recorded, frozen, never a tool or a process
(spec: A note on MCP). The REST side is in test_source_rules_rest.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kaizen_server_extension.tools.packages import (
    MAX_MCP_DESCRIPTORS,
    PackageManifestError,
    load_packages,
)
from kaizen_server_extension.tools.registry import ToolRegistry

TOOL = {"name": "pkg_hello", "description": "Say hello.", "entry": "pkg:hello",
        "input_schema": {"type": "object", "properties": {}}, "capability": "read"}


def _install(directory: Path, manifest: object) -> Path:
    package = directory / "pkg"
    package.mkdir(parents=True)
    (package / "pkg.py").write_text("def hello():\n    return {'hello': 'world'}\n")
    (package / "kaizen-tools.json").write_text(json.dumps(manifest))
    return directory


@pytest.mark.rule("R-064")
def test_declared_mcp_servers_are_recorded_and_nothing_else(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    declared = {"id": "pkgmcp", "transport": "stdio", "command": sys.executable,
                "args": ["-c", f"open({str(marker)!r}, 'w').write('ran')"],
                "agents": ["general"], "tools": [{"name": "lookup"}]}
    [plugin] = load_packages(_install(tmp_path / "packages", {"tools": [TOOL],
                                                               "mcp": [declared]}),
                             deadline_s=5)
    assert plugin.mcp_descriptors == (declared,)
    with pytest.raises(TypeError):  # recorded as it was declared, not editable later
        plugin.mcp_descriptors[0]["command"] = "/bin/sh"  # type: ignore[index]
    # Registered, the package contributes its tool and nothing from the declaration.
    registry = ToolRegistry.from_plugins(load_entrypoints=False,
                                         extra_plugins=[("package:pkg", plugin)])
    assert [n for n in registry.names() if n.startswith("mcp") or "lookup" in n] == []
    assert "pkg_hello" in registry.names()
    assert not marker.exists()


def test_a_plain_list_manifest_still_declares_tools_only(tmp_path: Path) -> None:
    [plugin] = load_packages(_install(tmp_path / "packages", [TOOL]), deadline_s=5)
    assert [t.descriptor.name for t in plugin.tools] == ["pkg_hello"]
    assert plugin.mcp_descriptors == ()


@pytest.mark.parametrize("manifest", [
    {"tools": [TOOL], "mcp": {"id": "not-a-list"}},
    {"tools": [TOOL], "mcp": ["not an object"]},
    {"tools": [TOOL], "mcp": [{"id": f"s{n}"} for n in range(MAX_MCP_DESCRIPTORS + 1)]},
    {"tools": [TOOL], "servers": []},
])
def test_an_unusable_mcp_declaration_names_the_manifest(tmp_path: Path,
                                                        manifest: object) -> None:
    with pytest.raises(PackageManifestError, match=r"kaizen-tools\.json"):
        load_packages(_install(tmp_path / "packages", manifest), deadline_s=5)
