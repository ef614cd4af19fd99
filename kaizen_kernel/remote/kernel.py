"""run_code kernels on a Jupyter gateway: the same :class:`SandboxKernel` behaviour, remotely.

:class:`GatewaySandboxKernel` keeps everything that happens *in* the kernel — the prelude
(capped streams, ``tools``), the per-lease binding, execution and the wall-time interrupt
handling of :class:`SandboxKernel` — and replaces how the kernel is reached: started,
interrupted, restarted and deleted over the gateway's REST API, spoken to over its websocket
(:mod:`kaizen_kernel.remote.client`).

What the local provisioner imposes (allowlisted environment built from scratch, rlimits,
bubblewrap) cannot be imposed on a remote host: there the **gateway operator owns the kernel
sandbox**. What Kaizen still controls: the start request carries only an allowlisted
environment (:func:`kaizen_kernel.remote.client.start_env`), and the kernel never receives a run
capability, authority bundle or descriptor — only the bridge URL and its lease token.

Workspace (``GatewaySettings.workspace_mode``):

* ``shared`` — the kernel sees the server's filesystem at the same paths (gateway on the same
  host, or a shared mount): the prelude moves into the lease workspace, exactly as locally.
* ``transfer`` — the kernel works in a private directory on its own host, and files cross
  through the kernel protocol in bounded base64 chunks (``user_expressions`` calls of the
  kernel-side helpers in :mod:`kaizen_kernel.remote.prelude`). *Before* each execution:

  - the working directory is brought in line with the lease workspace (which
    ``edit_workspace`` and earlier calls write): files new or changed since the last sync
    (tracked by sha256) are uploaded, files removed locally are deleted there. Symlinks and
    special files are never followed or sent; names stay relative and every component is
    opened ``O_NOFOLLOW`` on both sides. Bounded per file, per sync and in the number of
    files (``GatewaySettings.transfer_*``; bytes default to capture's caps): over a bound the call
    is refused with ``workspace_too_large``, naming the file and the bound, and nothing runs.
  - the call's admitted shared resources (R-454) are copied into a private directory of the
    kernel, outside the working directory; the kernel recomputes every file's sha256 and
    size against the admitted values *before* the manifest is exposed. A mismatch empties
    the directory and refuses the call (``resource_manifest_mismatch``, R-455) — fail
    closed, as locally. Copies are ``0444`` in a ``0555`` directory and re-verified on every
    call; ``KAIZEN_SHARED_RESOURCES_DIR`` / ``_MANIFEST`` name the remote copies, and are
    absent (and the directory emptied) when a call has none.

  *After* the program the declared ``artifact_targets`` are copied back (same per-file and
  total caps as capture) into the lease workspace, and then captured by the usual path.
* ``auto`` (default) — a probe decides per kernel: the server writes a random value into a
  transient file in the lease workspace; ``shared`` if the kernel reads it back, else
  ``transfer``.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kaizen_kernel import execute
from kaizen_kernel.kernel import (
    SETUP_TIMEOUT_S,
    START_TIMEOUT_S,
    Binding,
    KernelLaunchConfig,
    KernelStartError,
    SandboxKernel,
)
from kaizen_kernel.pool import _PREFERRED_SPECS, _SPEC_LANGUAGES, KernelPool, PoolKey
from kaizen_kernel.remote.client import (
    GatewayChannels,
    GatewayREST,
    GatewaySettings,
    GatewayUnavailable,
    TransferRefused,
    start_env,
)
from kaizen_kernel.remote.prelude import call_expression
from kaizen_kernel.remote.prelude import install_source as gateway_install_source

log = logging.getLogger(__name__)

TRANSFER_CHUNK_BYTES = 1024 * 1024
# How long (x 0.1 s) an unexpected KeyboardInterrupt is watched for the kernel going away.
LOST_KERNEL_CHECKS = 30


class GatewaySandboxKernel(SandboxKernel):
    def __init__(self, *, kernel_name: str, language: str, config: KernelLaunchConfig,
                 settings: GatewaySettings, rest: GatewayREST) -> None:
        super().__init__(kernel_name=kernel_name, language=language, config=config)
        self.settings = settings
        self.rest = rest
        self.gateway_kernel_id: str | None = None
        self.client: GatewayChannels | None = None
        # The lease's binding as asked (server paths), before it is mapped onto this kernel.
        self.requested: Binding | None = None
        # None until probed: does the kernel see the server's filesystem at the same paths?
        self.shares_workspace: bool | None = None
        self.remote_workdir: str | None = None
        # Transfer mode: what the remote working directory holds of the lease workspace
        # (name -> sha256 as last sent or handed back), and a local digest cache by stat.
        self.synced: dict[str, str] = {}
        # ... and the directories it made there for them (removed, if empty, when the
        # workspace no longer has them).
        self.synced_dirs: set[str] = set()
        self.local_digests: dict[str, tuple[tuple[int, ...], str]] = {}
        # Transfer mode: the remote resources directory holds a verified list right now.
        self.remote_resources = False

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        t0 = time.monotonic()
        with contextlib.suppress(Exception):
            # Shared resources are projected here by the server; a kernel that shares the
            # server's filesystem reads them at this path.
            from kaizen_kernel.resources import prepare_directory

            prepare_directory(self.resources_dir)
        try:
            self.gateway_kernel_id = await self.rest.start(
                self.kernel_name, start_env(os.environ, self.settings.env_allowlist))
        except GatewayUnavailable as exc:
            await self.shutdown()
            raise KernelStartError(str(exc)) from exc
        self.kernel_id = self.gateway_kernel_id
        try:
            await self._connect()
        except Exception:
            await self.shutdown()
            raise
        self.started_at = time.monotonic()
        self.start_seconds = self.started_at - t0

    async def _open_client(self) -> None:
        assert self.gateway_kernel_id is not None
        channels = GatewayChannels(self.gateway_kernel_id)
        self.client = channels
        try:
            await channels.connect(
                self.rest.channels_request(self.gateway_kernel_id, channels.session.session),
                seconds=START_TIMEOUT_S)
            await channels.wait_for_ready(START_TIMEOUT_S)
        except GatewayUnavailable as exc:
            raise KernelStartError(str(exc)) from exc
        except Exception as exc:
            raise KernelStartError(f"kernel not ready: {type(exc).__name__}") from exc

    async def _connect(self) -> None:
        await super()._connect()
        if self.language == "python":
            await self.run_silent(gateway_install_source())

    async def is_alive(self) -> bool:
        if self.closed or self.gateway_kernel_id is None or self.client is None:
            return False
        if self.client.closed or self.client.kernel_lost:
            return False
        try:
            model = await asyncio.wait_for(self.rest.model(self.gateway_kernel_id),
                                           self.settings.alive_check_timeout_s)
        except TimeoutError:
            return True  # cannot tell now; the wall-time limit still ends the call
        except GatewayUnavailable:
            return False
        return model is not None and model.get("execution_state") != "dead"

    async def shutdown(self) -> None:
        if self.closed:
            return
        kernel_id = self.gateway_kernel_id
        await super().shutdown()  # channels closed, local directories removed
        if kernel_id is not None:
            try:
                await self.rest.delete(kernel_id)
            except Exception:
                log.warning("the gateway did not delete run_code kernel %s", kernel_id,
                            exc_info=True)

    async def restart(self) -> None:
        """Restart on the gateway (state lost), reconnect, reinstall and rebind."""
        assert self.gateway_kernel_id is not None
        try:
            await self.rest.restart(self.gateway_kernel_id)
        except GatewayUnavailable as exc:
            raise KernelStartError(f"kernel could not restart: {exc}") from exc
        if self.client is not None:
            self.client.stop_channels()
        previous = self.requested
        # The old process removed its private directories: everything is sent again.
        self.remote_workdir = None
        self.synced = {}
        self.synced_dirs = set()
        self.remote_resources = False
        await self._connect()
        if previous is not None:
            await self.bind(previous)

    def interrupts_by_message(self) -> bool:
        # The gateway's kernelspec is not ours to read; a Python kernel is ipykernel.
        return self.language == "python"

    async def send_interrupt_request(self) -> None:
        # Over the kernel's websocket, like any message: no REST round trip, and it reaches a
        # kernel the gateway's own (signal) interrupt cannot.
        assert self.client is not None
        self.client.interrupt_request()

    async def interrupt(self) -> None:
        if self.interrupts_by_message():
            await self.send_interrupt_request()
            return
        assert self.gateway_kernel_id is not None
        await self.rest.interrupt(self.gateway_kernel_id)

    async def execute(self, code: str, *, wall_seconds: float,
                      output_bytes: int) -> execute.ExecutionCapture:
        capture = await super().execute(code, wall_seconds=wall_seconds,
                                        output_bytes=output_bytes)
        if (capture.status == "error" and capture.error is not None
                and capture.error.name == "KeyboardInterrupt"):
            # We interrupt only after the wall limit, never inside ``collect``: this came
            # from the gateway, which interrupts a kernel it is shutting down. If the kernel
            # goes away, the call lost its kernel (the tool's failure, not the program's).
            for _ in range(LOST_KERNEL_CHECKS):
                if not await self.is_alive():
                    capture.status = "died"
                    break
                await asyncio.sleep(0.1)
        return capture

    # --- binding and the workspace -----------------------------------------------------

    async def evaluate(self, expression: str, seconds: float = SETUP_TIMEOUT_S) -> Any:
        """The JSON value a prelude helper returns, through ``user_expressions``."""
        assert self.client is not None
        msg_id = self.client.execute("", silent=True, store_history=False,
                                     user_expressions={"value": expression},
                                     allow_stdin=False)
        reply = await execute.wait_reply(self.client, msg_id, seconds)
        if reply is None:
            raise KernelStartError("kernel helper timed out")
        content = reply.get("content", {})
        value = (content.get("user_expressions") or {}).get("value") or {}
        if content.get("status") != "ok" or value.get("status") != "ok":
            raise KernelStartError(f"kernel helper failed: {value.get('ename', '?')}")
        text = value.get("data", {}).get("text/plain", "")
        try:
            return json.loads(ast.literal_eval(text))
        except (ValueError, SyntaxError) as exc:
            raise KernelStartError("kernel helper answered malformed data") from exc

    async def _probe(self, workspace: Path) -> bool:
        probe = workspace / f".kaizen-probe-{secrets.token_hex(8)}"
        value = secrets.token_hex(16)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, value.encode("ascii"))
        finally:
            os.close(fd)
        try:
            return bool(await self.evaluate(call_expression("probe", str(probe), value)))
        finally:
            probe.unlink(missing_ok=True)

    async def _kernel_workspace(self, workspace: str | None) -> str | None:
        if workspace is None or self.language != "python":
            return None
        if self.shares_workspace is None:
            mode = self.settings.workspace_mode
            self.shares_workspace = (mode == "shared" or (
                mode == "auto" and await self._probe(Path(workspace))))
            log.info("gateway kernel %s: workspace %s", self.gateway_kernel_id,
                     "shared" if self.shares_workspace else "transferred")
        if self.shares_workspace:
            return workspace
        if self.remote_workdir is None:
            self.remote_workdir = str(await self.evaluate(call_expression("private_workdir")))
        return self.remote_workdir

    async def bind(self, binding: Binding) -> None:
        self.requested = binding
        workspace = await self._kernel_workspace(binding.workspace)
        mapped = dataclasses.replace(binding, workspace=workspace)
        if self.shares_workspace is False and self.language == "python":
            # Another host: server paths mean nothing there, so the workspace's files and the
            # call's shared resources are sent before every execution.
            if binding.workspace is not None and self.remote_workdir is not None:
                await self._sync_workspace(Path(binding.workspace))
            remote_dir, remote_manifest = await self._transfer_resources(
                binding.resources_dir, binding.resources_manifest)
            mapped = dataclasses.replace(mapped, resources_dir=remote_dir,
                                         resources_manifest=remote_manifest)
        elif not self.shares_workspace:
            mapped = dataclasses.replace(mapped, resources_dir=None, resources_manifest=None)
        await super().bind(mapped)

    # --- transfer mode: files to the kernel --------------------------------------------

    async def _helper(self, function: str, *args: object) -> Any:
        return await self.evaluate(call_expression(function, *args))

    async def _push(self, data: bytes) -> str:
        """Send ``data`` in bounded chunks; the kernel holds it under the returned tag."""
        tag = secrets.token_hex(8)
        offset = 0
        while True:
            piece = data[offset:offset + TRANSFER_CHUNK_BYTES]
            answer = await self._helper("put_chunk", tag, offset,
                                        base64.b64encode(piece).decode("ascii"))
            if not isinstance(answer, Mapping) or answer.get("status") != "ok":
                raise KernelStartError("the kernel did not accept a file chunk")
            offset += len(piece)
            if offset >= len(data):
                return tag

    async def _sync_workspace(self, workspace: Path) -> None:
        """Mirror the lease workspace's new, changed and removed files into the kernel's
        working directory; over a bound nothing is sent and the call is refused."""
        settings = self.settings
        scanned = await asyncio.to_thread(_scan_workspace, workspace, self.local_digests,
                                          settings.transfer_max_files,
                                          settings.transfer_max_file_bytes)
        if scanned is None:
            raise TransferRefused(
                "workspace_too_large",
                f"the workspace holds more than {settings.transfer_max_files} files, the "
                "most that are sent to the gateway kernel; remove files from it", caller=True)
        local, local_dirs = scanned
        send = sorted(name for name, (size, digest, _) in local.items()
                      if self.synced.get(name) != digest)
        too_big = [name for name in send if local[name][0] > settings.transfer_max_file_bytes]
        if too_big:
            raise TransferRefused(
                "workspace_too_large",
                f"the workspace file {too_big[0]!r} is larger than "
                f"{_size(settings.transfer_max_file_bytes)}, the most that is sent to the "
                "gateway kernel per file; remove or shrink it", caller=True)
        total = sum(local[name][0] for name in send)
        if total > settings.transfer_max_total_bytes:
            raise TransferRefused(
                "workspace_too_large",
                f"the workspace's new or changed files come to {_size(total)}, more than the "
                f"{_size(settings.transfer_max_total_bytes)} sent to the gateway kernel per "
                "call; remove files or make smaller ones", caller=True)
        assert self.remote_workdir is not None
        gone = sorted(name for name in self.synced if name not in local)
        # Deepest first, so a directory emptied by its children's removal goes too.
        vanished = sorted(self.synced_dirs - local_dirs, key=lambda d: (-d.count("/"), d))
        if gone or vanished:
            await self._helper("workspace_delete", self.remote_workdir, gone, vanished)
            for name in gone:
                self.synced.pop(name, None)
        self.synced_dirs &= local_dirs
        batch: list[dict[str, Any]] = []
        batch_bytes = 0
        for name in send:
            data = await asyncio.to_thread(_read_workspace_file, workspace, name,
                                           settings.transfer_max_file_bytes)
            if data is None:
                continue  # gone or replaced since the scan: the next sync sees it
            entry: dict[str, Any] = {"name": name, "size": len(data),
                                     "sha256": hashlib.sha256(data).hexdigest(),
                                     "executable": local[name][2]}
            if len(data) > TRANSFER_CHUNK_BYTES:
                entry["tag"] = await self._push(data)
                await self._write_remote([entry])
                continue
            entry["b64"] = base64.b64encode(data).decode("ascii")
            batch.append(entry)
            batch_bytes += len(data)
            if batch_bytes >= TRANSFER_CHUNK_BYTES:
                await self._write_remote(batch)
                batch, batch_bytes = [], 0
        if batch:
            await self._write_remote(batch)
        self.synced_dirs |= {parent for name in self.synced for parent in _parents(name)}

    async def _write_remote(self, entries: list[dict[str, Any]]) -> None:
        assert self.remote_workdir is not None
        answer = await self._helper("workspace_write", self.remote_workdir, entries)
        if not isinstance(answer, Mapping):
            raise KernelStartError("the kernel answered malformed data")
        for entry in entries:
            status = answer.get(entry["name"])
            if status == "ok":
                self.synced[entry["name"]] = entry["sha256"]
            elif status == "blocked":
                raise TransferRefused(
                    "workspace_path_blocked",
                    f"the workspace file {entry['name']!r} could not be written in the "
                    "gateway kernel's working directory: an earlier program left a "
                    "directory at that path", caller=True)
            else:
                raise KernelStartError("a workspace file did not arrive intact")

    async def _transfer_resources(self, local_dir: str | None,
                                  manifest: str | None) -> tuple[str | None, str | None]:
        """The call's verified shared files, copied to and re-verified on the kernel's host:
        (remote directory, manifest naming the remote copies), or (None, None)."""
        if not local_dir or not manifest:
            if self.remote_resources:
                await self._helper("resources_clear")
                self.remote_resources = False
            return None, None
        entries = _manifest_entries(manifest)
        settings = self.settings
        if any(e["size"] > settings.transfer_max_file_bytes for e in entries) or \
                sum(e["size"] for e in entries) > settings.transfer_max_total_bytes:
            raise TransferRefused(
                "resource_too_large",
                "this turn's authorized files are larger than the gateway kernel accepts "
                f"({_size(settings.transfer_max_file_bytes)} per file, "
                f"{_size(settings.transfer_max_total_bytes)} in all)", caller=False)
        admitted = [{"filename": e["filename"], "sha256": e["sha256"], "size": e["size"]}
                    for e in entries]
        self.remote_resources = True  # from here on the remote directory may hold files
        needed = await self._helper("resources_check", admitted)
        uploads: dict[str, str] = {}
        for filename in needed if isinstance(needed, list) else []:
            data = await asyncio.to_thread(_read_projected, Path(local_dir), str(filename),
                                           settings.transfer_max_file_bytes)
            # Sent as read, never checked here: the kernel checks what *arrived* (R-455).
            uploads[str(filename)] = await self._push(data or b"")
        answer = await self._helper("resources_commit", admitted, uploads)
        if not isinstance(answer, Mapping) or answer.get("status") != "ok":
            # Nothing is exposed on the kernel's side; the server's projection is rewritten
            # from freshly verified bytes next time, and the binding is sent again.
            self.projected = None
            self.projected_manifest = None
            self.binding = None
            raise TransferRefused(
                "resource_manifest_mismatch",
                "an authorized file did not arrive on the gateway kernel's host with the "
                "digest this turn was admitted with", caller=False)
        remote_dir = str(answer["dir"])
        remote = [{**e, "path": f"{remote_dir}/{e['filename']}"} for e in entries]
        return remote_dir, json.dumps(remote, separators=(",", ":"))

    # --- files -------------------------------------------------------------------------

    async def collect_targets(self, targets: Sequence[str], workspace: Path, *,
                              max_file_bytes: int, max_total_bytes: int) -> dict[str, str]:
        """Transfer mode: copy each declared file from the kernel's host into ``workspace``.

        A target the kernel did not produce (or may not hand over) has any stale local copy
        removed, so capture never returns an older call's bytes; the kernel-side reason is
        returned by name.
        """
        if self.shares_workspace is not False or self.remote_workdir is None or not targets:
            return {}
        reasons: dict[str, str] = {}
        remaining = max_total_bytes
        for name in targets:
            try:
                data, reason = await self._pull(name, max_file_bytes, remaining)
            except KernelStartError:
                data, reason = None, "unreadable"
            if data is None:
                reasons[name] = reason
                await asyncio.to_thread(_remove_local, workspace, name)
                # Not handed over: the kernel's copy (if any) is the kernel's own now, and
                # the next sync must not delete it because the local copy went.
                self.synced.pop(name, None)
                continue
            remaining -= len(data)
            await asyncio.to_thread(_write_local, workspace, name, data)
            # The kernel already holds these very bytes: the next sync does not resend them.
            self.synced[name] = hashlib.sha256(data).hexdigest()
        return reasons

    async def _pull(self, name: str, max_file_bytes: int,
                    remaining: int) -> tuple[bytes | None, str]:
        assert self.remote_workdir is not None
        chunks: list[bytes] = []
        offset = 0
        while True:
            answer = await self.evaluate(call_expression(
                "read_chunk", self.remote_workdir, name, offset, TRANSFER_CHUNK_BYTES,
                max_file_bytes))
            if not isinstance(answer, Mapping):
                return None, "unreadable"
            status = str(answer.get("status", "unreadable"))
            if status != "ok":
                return None, status
            piece = base64.b64decode(str(answer.get("b64", "")), validate=True)
            offset += len(piece)
            if offset > max_file_bytes:
                return None, "too_large"
            if offset > remaining:
                return None, "total_too_large"
            chunks.append(piece)
            if not piece or offset >= int(answer.get("total", 0)):
                return b"".join(chunks), "ok"


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Transient files of the ``auto`` probe: never part of the workspace.
_PROBE_PREFIX = ".kaizen-probe-"
_SHA256_HEX = frozenset("0123456789abcdef")


def _size(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB" if n >= 1024 * 1024 else f"{n} bytes"


def _stat_key(info: os.stat_result) -> tuple[int, ...]:
    # ctime moves on every write and cannot be set back by a program: a cheap "unchanged".
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _hash_fd(fd: int) -> str:
    digest = hashlib.sha256()
    while piece := os.read(fd, TRANSFER_CHUNK_BYTES):
        digest.update(piece)
    return digest.hexdigest()


def _scan_workspace(workspace: Path, cache: dict[str, tuple[tuple[int, ...], str]],
                    max_files: int, max_file_bytes: int
                    ) -> tuple[dict[str, tuple[int, str, bool]], set[str]] | None:
    """The workspace's regular files, name -> (size, sha256, executable), and directories,
    walked through ``O_NOFOLLOW`` directory descriptors (symlinks and special files are
    skipped, never followed). ``cache`` (name -> (stat key, sha256)) spares hashing unchanged
    files and is pruned to what exists. None when there are more than ``max_files`` files.

    A file over ``max_file_bytes`` is not hashed: its digest is its stat key, so it counts as
    changed until it is synced (which the per-file bound refuses)."""
    found: dict[str, tuple[int, str, bool]] = {}
    directories: set[str] = set()

    def entries(fd: int, prefix: str) -> Iterator[tuple[str, os.DirEntry[str]]]:
        with os.scandir(fd) as listing:
            for entry in listing:
                yield prefix + entry.name, entry

    def walk(fd: int, prefix: str) -> bool:
        for name, entry in list(entries(fd, prefix)):
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                try:
                    child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue  # swapped for a link or gone since the listing
                directories.add(name)
                try:
                    if not walk(child, name + "/"):
                        return False
                finally:
                    os.close(child)
                continue
            if not entry.is_file(follow_symlinks=False) or (
                    not prefix and entry.name.startswith(_PROBE_PREFIX)):
                continue
            if len(found) >= max_files:
                return False
            try:
                file_fd = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                  dir_fd=fd)
            except OSError:
                continue
            try:
                info = os.fstat(file_fd)
                if not stat.S_ISREG(info.st_mode):
                    continue
                key = _stat_key(info)
                cached = cache.get(name)
                if cached is not None and cached[0] == key:
                    digest = cached[1]
                elif info.st_size > max_file_bytes:
                    digest = "unhashed:" + ":".join(map(str, key))
                else:
                    digest = _hash_fd(file_fd)
                    cache[name] = (key, digest)
                found[name] = (info.st_size, digest, bool(info.st_mode & stat.S_IXUSR))
            finally:
                os.close(file_fd)
        return True

    root = os.open(workspace, _DIR_FLAGS)
    try:
        complete = walk(root, "")
    finally:
        os.close(root)
    for name in [n for n in cache if n not in found]:
        del cache[name]
    return (found, directories) if complete else None


def _read_workspace_file(workspace: Path, name: str, max_bytes: int) -> bytes | None:
    """A workspace file's bytes, every component opened without following links; None when
    it is gone, not a regular file or has grown over ``max_bytes`` since the scan."""
    try:
        walked = _walk_parents(workspace, name, create=False)
    except OSError:
        return None
    if walked is None:
        return None
    dir_fd, leaf = walked
    try:
        fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = _read_bounded(fd, max_bytes)
    finally:
        os.close(fd)
    return data


def _read_bounded(fd: int, max_bytes: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while piece := os.read(fd, TRANSFER_CHUNK_BYTES):
        size += len(piece)
        if size > max_bytes:
            return None
        chunks.append(piece)
    return b"".join(chunks)


def _parents(name: str) -> list[str]:
    parts = name.split("/")[:-1]
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _read_projected(directory: Path, filename: str, max_bytes: int) -> bytes | None:
    """A file of the server's read-only projection (flat name, no link followed)."""
    try:
        dir_fd = os.open(directory, _DIR_FLAGS)
    except OSError:
        return None
    try:
        fd = os.open(filename, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    try:
        return _read_bounded(fd, max_bytes) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


def _manifest_entries(manifest: str) -> list[dict[str, Any]]:
    """The server-made manifest, checked for the shape the kernel side relies on."""
    try:
        entries = json.loads(manifest)
    except ValueError:
        entries = None
    if not isinstance(entries, list):
        raise TransferRefused("resource_manifest_mismatch",
                              "the shared-resources manifest is malformed", caller=False)
    for entry in entries:
        filename = entry.get("filename") if isinstance(entry, dict) else None
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        size = entry.get("size") if isinstance(entry, dict) else None
        if (not isinstance(filename, str) or not filename or "/" in filename
                or "\x00" in filename or filename in (".", "..")
                or not isinstance(digest, str) or len(digest) != 64
                or not set(digest) <= _SHA256_HEX
                or not isinstance(size, int) or isinstance(size, bool) or size < 0):
            raise TransferRefused("resource_manifest_mismatch",
                                  "the shared-resources manifest is malformed", caller=False)
    return entries


def _walk_parents(workspace: Path, name: str, create: bool) -> tuple[int, str] | None:
    """(directory fd, final component) under ``workspace`` without following symlinks."""
    parts = name.split("/")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(workspace, flags)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                os.mkdir(part, 0o700, dir_fd=fd)
                nxt = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def _write_local(workspace: Path, name: str, data: bytes) -> None:
    walked = _walk_parents(workspace, name, create=True)
    assert walked is not None
    dir_fd, leaf = walked
    try:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(leaf, dir_fd=dir_fd)
        fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def _remove_local(workspace: Path, name: str) -> None:
    try:
        walked = _walk_parents(workspace, name, create=False)
    except OSError:
        return
    if walked is None:
        return
    dir_fd, leaf = walked
    try:
        os.unlink(leaf, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.EISDIR, errno.EPERM):
            raise
    finally:
        os.close(dir_fd)


class GatewayKernelPool(KernelPool):
    """The warm pool, filled with gateway kernels; kernelspecs come from the gateway."""

    def __init__(self, config: KernelLaunchConfig, settings: GatewaySettings, *,
                 sizes: Mapping[str, int] | None = None,
                 kernel_names: Mapping[str, str] | None = None,
                 rest: GatewayREST | None = None) -> None:
        super().__init__(config, sizes=sizes, kernel_names=kernel_names)
        self.settings = settings
        self.rest = rest or GatewayREST()
        self.jailed = False  # our jail does not reach the gateway's hosts
        self._specs: dict[str, str] | None = None  # kernelspec name -> language

    async def refresh_specs(self) -> None:
        """Learn the gateway's kernelspecs (once); a gateway that is down is a tool failure."""
        if self._specs is not None:
            return
        try:
            data = await self.rest.kernelspecs()
        except GatewayUnavailable as exc:
            raise KernelStartError(str(exc)) from exc
        specs: dict[str, str] = {}
        for name, entry in (data.get("kernelspecs") or {}).items():
            spec = entry.get("spec") if isinstance(entry, dict) else None
            language = spec.get("language") if isinstance(spec, dict) else None
            specs[str(name)] = str(language or "").lower()
        self._specs = specs
        for language, configured in self._names.items():
            if configured and configured not in specs:
                log.error("the kernelspec %r named for %s run_code (KAIZEN_RUN_CODE_KERNELSPEC) "
                          "is not on the Jupyter gateway (it has: %s); those calls will fail",
                          configured, language, ", ".join(sorted(specs)) or "none")

    def _gateway_name(self, language: str) -> str | None:
        assert self._specs is not None
        wanted = _SPEC_LANGUAGES.get(language, ())
        for name in _PREFERRED_SPECS.get(language, ()):
            if self._specs.get(name) in wanted:
                return name
        for name in sorted(self._specs):
            if self._specs[name] in wanted:
                return name
        return None

    def kernel_name(self, language: str) -> str:
        configured = self._names.get(language)
        if configured:
            return configured
        if self._specs is None:
            # Unknown until the gateway answers; ``acquire`` asks it first.
            raise KernelStartError("the Jupyter gateway's kernels are not known yet")
        name = self._gateway_name(language)
        if name is None:
            from kaizen_kernel.pool import LanguageUnavailable

            raise LanguageUnavailable(language)
        return name

    def available(self, language: str) -> bool:
        if self._specs is None and language not in self._names:
            return True  # cannot tell before the gateway answers: acquire decides
        try:
            self.kernel_name(language)
        except LookupError:
            return False
        return True

    def _key(self, language: str, workspace: Path | None) -> PoolKey:
        return (language, None)  # the workspace is bound after launch, by the prelude

    async def start(self) -> None:
        try:
            await self.refresh_specs()
        except KernelStartError:
            log.warning("the Jupyter gateway is not reachable; run_code kernels will be "
                        "started on demand", exc_info=True)
            return
        await super().start()

    async def acquire(self, language: str, workspace: Path | None = None) -> SandboxKernel:
        await self.refresh_specs()
        return await super().acquire(language, workspace)

    async def new_kernel(self, language: str, workspace: Path | None) -> SandboxKernel:
        kernel = GatewaySandboxKernel(kernel_name=self.kernel_name(language),
                                      language=language, config=self.config,
                                      settings=self.settings, rest=self.rest)
        await kernel.start()
        return kernel
