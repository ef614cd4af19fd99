"""Kaizen for Jupyter: a guarded agent turn loop as a Jupyter server extension."""

from __future__ import annotations

import gc
from typing import Any

from kaizen_server_extension._version import __version__

__all__ = ["__version__"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    # What the server loaded before us lives as long as the process. Out of the collector's
    # sight, the full collections our own loading triggers scan only what we allocate instead
    # of the whole server's heap (≈ 0.1-0.2 s of CPU at start-up; bench/README.md,
    # extension_load). app.py freezes again once the extension has started.
    gc.freeze()
    from kaizen_server_extension import preload
    from kaizen_server_extension.app import KaizenApp

    # The store, runtime and routes load on a thread while the server loads the other
    # extensions; KaizenApp waits for them before it builds anything (preload.py).
    preload.start()
    return [{"module": "kaizen_server_extension", "app": KaizenApp}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "kaizen-jupyter"}]
