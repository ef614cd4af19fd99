"""Start-up stays light: the extension's entry module, and the registration of the built-in
tool families, load none of the heavy libraries a turn may need later (issue 16; the bench
is bench/extension_load.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Loaded only by the code that uses them: the embedded model, provider SDKs, the Hashline
#: engine, the office writers, the data stack (numpy comes with rank_bm25), migrations, the
#: model gateway's transport (aiohttp, on the first model request).
HEAVY = ("llama_cpp", "openai", "anthropic", "kaizen_hashline.engine", "docx", "pptx",
         "openpyxl", "reportlab", "numpy", "pandas", "matplotlib", "scipy", "pyarrow",
         "rank_bm25", "alembic", "mcp", "aiohttp")


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"],
        check=True, capture_output=True, text=True, timeout=120).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_the_entry_module_loads_no_heavy_library() -> None:
    loaded = _loaded_after("import kaizen_server_extension as k\n"
                           "k._jupyter_server_extension_points()")
    assert "kaizen_server_extension.app" in loaded  # the extension point was really loaded
    assert sorted(loaded.intersection(HEAVY)) == []
    assert "kaizen_hashline" not in loaded


def test_registering_the_built_in_tools_loads_no_heavy_library() -> None:
    loaded = _loaded_after(
        "from kaizen_server_extension.tools.registry import ToolRegistry, build_plugin_manager\n"
        "pm, first_party = build_plugin_manager(extra_plugins=[])\n"
        "registry = ToolRegistry.from_plugin_manager(pm, first_party)\n"
        "assert 'read_workspace' in set(registry.names())")
    assert "kaizen_plugins.workspace" in loaded
    assert sorted(loaded.intersection(HEAVY)) == []


@pytest.mark.parametrize("name", ["WorkspaceState", "edit_files", "HashlineError"])
def test_hashline_names_still_resolve_from_the_package(name: str) -> None:
    import kaizen_hashline

    assert getattr(kaizen_hashline, name) is not None
    assert name in kaizen_hashline.__all__
