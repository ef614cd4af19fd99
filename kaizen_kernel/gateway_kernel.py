"""run_code kernels on a Jupyter gateway: the same :class:`SandboxKernel` behaviour, remotely.

:class:`GatewaySandboxKernel` keeps everything that happens *in* the kernel — the prelude
(capped streams, ``tools``), the per-lease binding, execution and the wall-time interrupt
handling of :class:`SandboxKernel` — and replaces how the kernel is reached: started,
interrupted, restarted and deleted over the gateway's REST API, spoken to over its websocket
(:mod:`kaizen_kernel.gateway`).

What the local provisioner imposes (allowlisted environment built from scratch, rlimits,
bubblewrap) cannot be imposed on a remote host: there the **gateway operator owns the kernel
sandbox**. What Kaizen still controls: the start request carries only an allowlisted
environment (:func:`kaizen_kernel.gateway.start_env`), and the kernel never receives a run
capability, authority bundle or descriptor — only the bridge URL and its lease token.

Workspace (``GatewaySettings.workspace_mode``):

* ``shared`` — the kernel sees the server's filesystem at the same paths (gateway on the same
  host, or a shared mount): the prelude moves into the lease workspace, exactly as locally.
* ``transfer`` — the kernel works in a private directory on its own host; after the program
  the declared ``artifact_targets`` are copied back through the kernel protocol in bounded
  base64 chunks (same per-file and total caps as capture) into the lease workspace, and then
  captured by the usual path. Files written by ``edit_workspace`` and shared resources are
  not visible to such a kernel.
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
import json
import logging
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kaizen_kernel import execute
from kaizen_kernel.gateway import (
    GatewayChannels,
    GatewayREST,
    GatewaySettings,
    GatewayUnavailable,
    start_env,
)
from kaizen_kernel.gateway_prelude import call_expression
from kaizen_kernel.gateway_prelude import install_source as gateway_install_source
from kaizen_kernel.kernel import (
    SETUP_TIMEOUT_S,
    START_TIMEOUT_S,
    Binding,
    KernelLaunchConfig,
    KernelStartError,
    SandboxKernel,
)
from kaizen_kernel.pool import _PREFERRED_SPECS, _SPEC_LANGUAGES, KernelPool, PoolKey

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
        self.remote_workdir = None  # the old process removed its private directory
        await self._connect()
        if previous is not None:
            await self.bind(previous)

    async def interrupt(self) -> None:
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
        if not self.shares_workspace and hasattr(mapped, "resources_dir"):
            # Server paths mean nothing on another host: no shared files there.
            mapped = dataclasses.replace(mapped, resources_dir=None, resources_manifest=None)
        await super().bind(mapped)

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
                continue
            remaining -= len(data)
            await asyncio.to_thread(_write_local, workspace, name, data)
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
