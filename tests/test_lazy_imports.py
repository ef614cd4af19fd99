"""Start-up stays light: the extension's entry module, and the registration of the built-in
tool families, load none of the heavy libraries a turn may need later (issue 16; the bench
is bench/extension_load.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from kaizen_server_extension.store.engine import sqlite_url_for
from tests.support.server import server_env

#: Loaded only by the code that uses them: the embedded model, provider SDKs, the Hashline
#: engine, the office writers, the data stack (numpy comes with rank_bm25), migrations, the
#: model gateway's transport (aiohttp, on the first model request).
HEAVY = ("llama_cpp", "openai", "anthropic", "kaizen_hashline.engine", "docx", "pptx",
         "openpyxl", "reportlab", "numpy", "pandas", "matplotlib", "scipy", "pyarrow",
         "rank_bm25", "alembic", "mcp", "aiohttp")


#: Loaded when the server starts run_code (app.py: ``_start_run_code``), not while the
#: extension loads: the kernel service, its pool, leases, kernels and bridge.
KERNEL_SERVICE = ("kaizen_kernel.service", "kaizen_kernel.pool", "kaizen_kernel.leases",
                  "kaizen_kernel.bridge", "kaizen_kernel.kernel", "kaizen_kernel.execute",
                  "kaizen_kernel.console", "kaizen_kernel.remote", "kaizen_kernel.stack")


def _loaded_after(code: str, env: Mapping[str, str] | None = None) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"],
        check=True, capture_output=True, text=True, timeout=120, env=env).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_the_entry_module_loads_no_heavy_library() -> None:
    loaded = _loaded_after("import kaizen_server_extension as k\n"
                           "k._jupyter_server_extension_points()")
    assert "kaizen_server_extension.app" in loaded  # the extension point was really loaded
    assert sorted(loaded.intersection(HEAVY)) == []
    assert "kaizen_hashline" not in loaded


def test_the_store_and_runtime_load_on_the_preload_thread_not_with_the_entry_module() -> None:
    """The server's thread imports app.py alone; the store, runtime and routes load on
    preload.py's thread while the server loads the other extensions, and are all there once
    ``preload.wait()`` returns (what ``KaizenApp.initialize_settings`` does first)."""
    loaded = _loaded_after("import kaizen_server_extension.app")
    assert "sqlalchemy" not in loaded
    assert sorted(m for m in loaded if m.startswith("kaizen_server_extension.store")) == []
    out = subprocess.run([sys.executable, "-c", """
import json, sys, threading
import kaizen_server_extension as k
k._jupyter_server_extension_points()
from kaizen_server_extension import preload
names = [t.name for t in threading.enumerate()]
preload.wait()
print(json.dumps({"thread": "kaizen-preload" in names,
                  "missing": [m for m in preload.HEAVY_MODULES if m not in sys.modules]}))
"""], check=True, capture_output=True, text=True, timeout=120).stdout
    assert json.loads(out.splitlines()[-1]) == {"thread": True, "missing": []}


def test_a_module_the_preload_thread_cannot_import_is_reported_by_the_servers_thread() -> None:
    """The thread drops its failure; the import on the server's thread raises the real one."""
    out = subprocess.run([sys.executable, "-c", """
from kaizen_server_extension import preload
preload.HEAVY_MODULES = ("kaizen_server_extension.no_such_module",)
preload.start()
preload.wait()
try:
    import kaizen_server_extension.no_such_module
except ModuleNotFoundError as exc:
    print(exc.name)
"""], check=True, capture_output=True, text=True, timeout=120).stdout
    assert out.split() == ["kaizen_server_extension.no_such_module"]


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


def test_the_entry_point_takes_the_servers_heap_out_of_the_collectors_sight_first() -> None:
    """What the server allocated before loading Kaizen is frozen before Kaizen's modules load,
    so the full collections our loading triggers do not scan it (bench/README.md,
    extension_load); Kaizen's own objects stay with the collector until start-up ends."""
    out = subprocess.run([sys.executable, "-c", """
import gc, json
class ServerObject:
    pass
server_object = ServerObject()
import kaizen_server_extension
kaizen_server_extension._jupyter_server_extension_points()
from kaizen_server_extension.app import KaizenApp
tracked = {id(o) for o in gc.get_objects()}
print(json.dumps({"server_object": id(server_object) in tracked,
                  "kaizen_app": id(KaizenApp) in tracked}))
"""], check=True, capture_output=True, text=True, timeout=120).stdout
    assert json.loads(out.splitlines()[-1]) == {"server_object": False, "kaizen_app": True}


def test_the_sandbox_setting_check_loads_the_provisioner_alone() -> None:
    loaded = _loaded_after("from kaizen_kernel.provisioner import find_bwrap\nfind_bwrap()")
    assert "kaizen_kernel.provisioner" in loaded
    assert sorted(loaded.intersection(KERNEL_SERVICE)) == []


def test_a_server_loading_kaizen_leaves_the_kernel_service_and_heavy_libraries(
        tmp_path: Path) -> None:
    """Everything the server does before it listens (ServerApp.initialize: Kaizen's settings,
    store bootstrap, plugins, tool registry, routes) on SQLite loads no heavy library, and the
    kernel service waits for the server's start."""
    env = server_env(tmp_path, sqlite_url_for(tmp_path / "kaizen.db"), None)
    loaded = _loaded_after(f"""
from jupyter_server.serverapp import ServerApp
app = ServerApp.instance()
app.initialize(argv=["--ServerApp.jpserver_extensions={{'kaizen_server_extension': True}}",
                     "--ServerApp.root_dir={tmp_path}", "--allow-root"], new_httpserver=False)
assert "kaizen" in app.web_app.settings, "Kaizen did not load"
""", env)
    assert "kaizen_server_extension.app" in loaded
    assert "kaizen_plugins.workspace" in loaded  # the tools were registered
    # A fresh database is migrated, so Alembic is expected here (not on a migrated one).
    assert sorted(loaded.intersection(HEAVY) - {"alembic"}) == []
    assert sorted(loaded.intersection(KERNEL_SERVICE)) == []


@pytest.mark.parametrize("name", ["RunCodeService", "RunCodeConfig", "bridge_handlers",
                                  "SandboxProvisioner", "INPUT_SCHEMA", "KernelLease"])
def test_kernel_names_still_resolve_from_the_package(name: str) -> None:
    import kaizen_kernel

    assert getattr(kaizen_kernel, name) is not None
    assert name in kaizen_kernel.__all__
