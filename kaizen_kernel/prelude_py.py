"""Kernel-side code for Python kernels. Its *source text* is executed inside each kernel.

Nothing here runs in the server: :func:`install_source` and :func:`bind_source` return code
strings that the server sends as silent executions. This module must stay stdlib-only and
self-contained (it becomes the private module ``_kaizen_sandbox`` inside the kernel).

Inside the kernel it provides:

* a capped ``sys.stdout``/``sys.stderr`` pair sharing one per-execution byte budget, reset on
  every cell (IPython ``pre_execute``); past the budget, writes are dropped and one marker line
  (carrying a per-kernel nonce) tells the server output was truncated. A 50 MiB ``print`` is
  cut *before* ipykernel packs it into a stream message;
* ``tools``: ``tools.available`` and ``tools.call(name, arguments=None, **kwargs)``, a
  loopback HTTP client of the server's bridge authenticated by the lease token;
* the call's shared files under their own names in the working directory: one symlink per
  file into the read-only resources directory, so ``open("sales.csv")`` reads the attached
  copy (:func:`_link_shared_files`).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

MARKER_PREFIX = "\n[kaizen: output truncated at "
_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
_CALL_TIMEOUT_S = 60.0

_state: dict[str, Any] = {
    "cap": 1024 * 1024,
    "remaining": 1024 * 1024,
    "truncated": False,
    "nonce": "",
    "url": None,
    "token": None,
    "available": (),
    # name -> target of the working-directory links this kernel made for shared files.
    "links": {},
    "resources_parent": None,
}


def marker(cap: int, nonce: str) -> str:
    return f"{MARKER_PREFIX}{cap} bytes {nonce}]\n"


class _CappedStream:
    """Wraps ipykernel's OutStream; all writes draw from one shared byte budget."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        state = _state
        remaining = state["remaining"]
        if remaining <= 0:
            return len(text)
        data = text.encode("utf-8", "replace")
        if len(data) <= remaining:
            state["remaining"] = remaining - len(data)
            self._inner.write(text)
            return len(text)
        cut = data[:remaining]
        state["remaining"] = 0
        state["truncated"] = True
        self._inner.write(cut.decode("utf-8", "ignore"))
        self._inner.write(marker(state["cap"], state["nonce"]))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _reset(*_args: Any) -> None:
    _state["remaining"] = _state["cap"]
    _state["truncated"] = False


class ToolCallError(Exception):
    """A refused or failed ``tools.call``: ``code`` is the server's reason code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class Tools:
    """``tools.call(name, arguments)`` / ``tools.call(name, **arguments)`` over the bridge."""

    ToolCallError = ToolCallError

    @property
    def available(self) -> list[str]:
        return list(_state["available"])

    def call(self, name: str, arguments: dict[str, Any] | None = None, /,
             **kwargs: Any) -> Any:
        url, token = _state["url"], _state["token"]
        if not url or not token:
            raise ToolCallError("bridge_unavailable", "tool callbacks are not available here")
        args = dict(arguments or {})
        args.update(kwargs)
        body = json.dumps({"tool": name, "arguments": args}).encode("utf-8")
        request = urllib.request.Request(
            url, data=body, method="POST",
            headers={"Authorization": f"Bearer {token}",
                     "Content-Type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=_CALL_TIMEOUT_S) as response:
                raw = response.read(_MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raw = exc.read(_MAX_RESPONSE_BYTES + 1)
            try:
                err = json.loads(raw).get("error", {})
            except ValueError:
                err = {}
            raise ToolCallError(str(err.get("code", f"http_{exc.code}")),
                                str(err.get("message", "refused"))) from None
        except OSError as exc:
            raise ToolCallError("bridge_unreachable", type(exc).__name__) from None
        if len(raw) > _MAX_RESPONSE_BYTES:
            raise ToolCallError("response_too_large", "tool result exceeded the bridge bound")
        payload = json.loads(raw)
        return payload.get("result")

    def __repr__(self) -> str:
        return f"<tools available={self.available!r}>"


def install(cap: int, nonce: str) -> None:
    """Once per kernel: capped streams, the per-cell budget reset, ``tools`` in user ns."""
    _state["cap"] = int(cap)
    _state["nonce"] = nonce
    _reset()
    if not isinstance(sys.stdout, _CappedStream):
        sys.stdout = _CappedStream(sys.stdout)
    if not isinstance(sys.stderr, _CappedStream):
        sys.stderr = _CappedStream(sys.stderr)
    ip = get_ipython()  # type: ignore[name-defined]  # noqa: F821 - an IPython builtin
    ip.events.register("pre_execute", _reset)
    ip.user_ns["tools"] = Tools()
    ip.user_ns_hidden["tools"] = ip.user_ns["tools"]


_RESOURCE_ENV = ("KAIZEN_SHARED_RESOURCES_DIR", "KAIZEN_SHARED_RESOURCES_MANIFEST")


def bind(workspace: str | None, url: str | None, token: str | None,
         available: list[str], cap: int, resources_dir: str | None = None,
         resources_manifest: str | None = None) -> None:
    """Per lease (and whenever the server's view changes): workspace, bridge, budget, and the
    call's shared resources, whose two variables exist only while there are files."""
    if workspace:
        os.chdir(workspace)
        os.environ["KAIZEN_WORKSPACE"] = workspace
    if resources_dir and resources_manifest:
        os.environ[_RESOURCE_ENV[0]] = resources_dir
        os.environ[_RESOURCE_ENV[1]] = resources_manifest
    else:
        for name in _RESOURCE_ENV:
            os.environ.pop(name, None)
    _link_shared_files(resources_dir, resources_manifest)
    _state["url"] = url
    _state["token"] = token
    _state["available"] = tuple(available)
    _state["cap"] = int(cap)
    _reset()


def _ours(link: str, resources_parents: set[str]) -> bool:
    """A working-directory symlink a kernel of this server made for a shared file: named like
    its target, which lies in a resources directory (one per kernel, all siblings)."""
    try:
        target = os.readlink(link)
    except OSError:
        return False
    folder, name = os.path.split(target)
    return name == os.path.basename(link) and os.path.dirname(folder) in resources_parents


def _link_shared_files(resources_dir: str | None, manifest: str | None) -> None:
    """Put the call's shared files in the working directory under their own names (symlinks
    into the read-only directory, so a write fails there too). Links left by an earlier call
    (this kernel's, or a former kernel's of the same workspace) go first; a file of the
    program's own with that name is left alone, and the copy stays at its manifest path."""
    parents = {p for p in (_state.get("resources_parent"),
                           os.path.dirname(resources_dir) if resources_dir else None) if p}
    try:
        entries = os.scandir(".")
    except OSError:
        return
    with entries:
        for entry in entries:
            if not entry.is_symlink():
                continue
            try:
                made_here = _state["links"].get(entry.name) == os.readlink(entry.path)
                if made_here or _ours(entry.path, parents):
                    os.unlink(entry.path)
            except OSError:
                pass
    links: dict[str, str] = {}
    if resources_dir:
        # Sent without a manifest too (a call without files), so a fresh kernel still knows
        # where its siblings' links pointed.
        _state["resources_parent"] = os.path.dirname(resources_dir)
    if resources_dir and manifest:
        try:
            listed = json.loads(manifest)
        except ValueError:
            listed = []
        for item in listed if isinstance(listed, list) else []:
            name, target = item.get("filename"), item.get("path")
            if not (isinstance(name, str) and isinstance(target, str) and name
                    and "/" not in name and not name.startswith(".")):
                continue
            if os.path.lexists(name):
                continue  # the program's own file keeps its name
            try:
                os.symlink(target, name)
            except OSError:
                continue
            links[name] = target
    _state["links"] = links


def install_source(cap: int, nonce: str) -> str:
    """Code that creates ``_kaizen_sandbox`` from this file's text and installs it."""
    source = Path(__file__).read_text(encoding="utf-8")
    return (
        "def __kaizen_boot(src, cap, nonce):\n"
        "    import sys, types\n"
        "    mod = types.ModuleType('_kaizen_sandbox')\n"
        "    sys.modules['_kaizen_sandbox'] = mod\n"
        "    exec(compile(src, '<kaizen-sandbox>', 'exec'), mod.__dict__)\n"
        "    mod.install(cap, nonce)\n"
        f"__kaizen_boot({source!r}, {int(cap)!r}, {nonce!r})\n"
        "del __kaizen_boot\n"
    )


def bind_source(workspace: str | None, url: str | None, token: str | None,
                available: list[str], cap: int, resources_dir: str | None = None,
                resources_manifest: str | None = None) -> str:
    args = json.dumps([workspace, url, token, list(available), int(cap), resources_dir,
                       resources_manifest])
    return f"__import__('_kaizen_sandbox').bind(*__import__('json').loads({args!r}))\n"
