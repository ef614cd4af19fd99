"""Kaizen's heavy modules, imported on a background thread while the server loads the rest.

The Jupyter server asks each extension for its entry points first and loads them later, in
order; between the two it loads the other extensions, and JupyterLab's load waits on a
``yarn config`` subprocess (≈ 0.7 s here) with the interpreter idle. The store (SQLAlchemy
and the mapped tables), the runtime and the REST routes are imported on this thread in
that window; ``KaizenApp.initialize_settings`` waits for it before it builds anything.
Only start-up's wall time moves: the same modules load, on the same interpreter.

Two threads importing at once is safe as long as they do not need the same half-loaded
module: :func:`start` is called after ``app.py`` (and what it imports: settings, agents,
pydantic, the protocol types) loaded on the server's thread, so what this thread imports
is Kaizen's own and the store's, which no other extension imports. A failure here is
dropped: the server's thread imports the module again and reports the real error.
"""

from __future__ import annotations

import importlib
import threading

#: What ``initialize_settings``/``initialize_handlers`` import, roots first.
HEAVY_MODULES = (
    "sqlalchemy",
    "sqlalchemy.ext.asyncio",
    "kaizen_server_extension.store",
    "kaizen_server_extension.events",
    "kaizen_server_extension.run_metrics",
    "kaizen_server_extension.tools.registry",
    "kaizen_server_extension.context",
    "kaizen_server_extension.host.tool_backend",
    "kaizen_server_extension.host.task_tools",
    "kaizen_server_extension.host.delegation",
    "kaizen_server_extension.lanes.service",
    "kaizen_server_extension.lanes.scheduler",
    "kaizen_server_extension.policy.guardrails",
    "kaizen_server_extension.store.tasks",
    "kaizen_server_extension.api.handlers",
)

_thread: threading.Thread | None = None


def _load() -> None:
    for name in HEAVY_MODULES:
        try:
            importlib.import_module(name)
        except BaseException:  # the server's thread imports it again and says why
            return
    # The first-party plugins the registry registers next (tools/registry.py).
    from kaizen_server_extension.tools.registry import default_plugin_modules

    for name in default_plugin_modules():
        try:
            importlib.import_module(name)
        except BaseException:  # as above
            return


def start() -> None:
    """Begin loading :data:`HEAVY_MODULES` in the background (once per process)."""
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_load, name="kaizen-preload", daemon=True)
        _thread.start()


def wait() -> None:
    """Until the background load (if any) has finished."""
    if _thread is not None:
        _thread.join()
