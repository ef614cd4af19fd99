"""Finding the Kaizen server a notebook kernel belongs to.

``KAIZEN_URL`` and ``KAIZEN_TOKEN`` win when set. Otherwise the running Jupyter servers'
runtime files (``jpserver-*.json`` in the Jupyter runtime directory, what ``jupyter server
list`` reads) are tried, the ones whose root directory holds the kernel's working directory
first, newest first; the first that answers Kaizen's ``members/me`` is used.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx


@dataclass(frozen=True)
class ServerInfo:
    url: str
    token: str
    source: str  # "environment" or the runtime file it came from


class ServerNotFound(RuntimeError):
    """No Kaizen server could be found or reached (the message says what was tried)."""


def _runtime_dir(environ: Mapping[str, str]) -> Path:
    if environ.get("JUPYTER_RUNTIME_DIR"):
        return Path(environ["JUPYTER_RUNTIME_DIR"])
    try:
        from jupyter_core.paths import jupyter_runtime_dir
    except ImportError:
        return Path.home() / ".local" / "share" / "jupyter" / "runtime"
    return Path(jupyter_runtime_dir())


def running_servers(environ: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The runtime files of running Jupyter servers, best candidates first."""
    env = os.environ if environ is None else environ
    found: list[tuple[bool, float, dict[str, Any]]] = []
    cwd = Path.cwd().resolve()
    for path in _runtime_dir(env).glob("jpserver-*.json"):
        try:
            info = json.loads(path.read_text())
            mtime = path.stat().st_mtime
        except (OSError, ValueError):
            continue
        if not isinstance(info, dict) or "url" not in info:
            continue
        root = Path(str(info.get("root_dir") or info.get("notebook_dir") or "/")).resolve()
        inside = cwd == root or root in cwd.parents
        found.append((inside, mtime, {**info, "_file": str(path)}))
    found.sort(key=lambda item: (not item[0], -item[1]))
    return [info for _inside, _mtime, info in found]


def find_server(environ: Mapping[str, str] | None = None, *,
                timeout: float = 3.0) -> ServerInfo:
    env = os.environ if environ is None else environ
    if env.get("KAIZEN_URL"):
        return ServerInfo(env["KAIZEN_URL"], env.get("KAIZEN_TOKEN", ""), "environment")
    tried = []
    for info in running_servers(env):
        url = str(info["url"])
        url = url if url.endswith("/") else url + "/"
        token = str(info.get("token") or "")
        tried.append(url)
        try:
            answer = httpx.get(url + "kaizen/api/members/me", timeout=timeout,
                               headers={"Authorization": f"token {token}"})
        except httpx.HTTPError:
            continue
        if answer.status_code == 200:
            return ServerInfo(url, token, str(info["_file"]))
    where = ", ".join(tried) if tried else "no running Jupyter server was found"
    raise ServerNotFound("No Kaizen server answered (" + where + "). Set KAIZEN_URL and "
                         "KAIZEN_TOKEN to name one.")
