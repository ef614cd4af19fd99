"""Kaizen for Jupyter: a guarded agent turn loop as a Jupyter server extension."""

from __future__ import annotations

from typing import Any

from kaizen_server_extension._version import __version__

__all__ = ["__version__"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from kaizen_server_extension.app import KaizenApp

    return [{"module": "kaizen_server_extension", "app": KaizenApp}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "kaizen-jupyter"}]
