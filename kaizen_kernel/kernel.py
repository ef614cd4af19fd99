"""One sandboxed kernel: an ``AsyncKernelManager`` + client behind a small async API.

A :class:`SandboxKernel` is started by the pool with the :class:`SandboxProvisioner`, gets the
Kaizen prelude installed (capped streams, ``tools``), and is later *bound* to a lease
(workspace, bridge token, callable tool names, output cap). It runs one execution at a time;
the lease lock guarantees that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from jupyter_client.manager import AsyncKernelManager

from kaizen_kernel import execute, prelude_js, prelude_py
from kaizen_kernel.limits import ProcessLimits
from kaizen_kernel.prelude_py import MARKER_PREFIX
from kaizen_kernel.provisioner import SandboxProvisioner
from kaizen_kernel.resources import prepare_directory
from kaizen_kernel.resources import remove as remove_resources

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
#: A kernel that exits while starting is started again this many times in all.
START_ATTEMPTS = 2
SETUP_TIMEOUT_S = 15.0
# How long an interrupted kernel may take to come back idle before it counts as ignoring the
# interrupt (and is restarted, its state lost).
INTERRUPT_GRACE_S = 1.0
ABORT_RETRY_S = 0.25


# The kernel-side prelude per run_code language: capped output streams and ``tools``.
PRELUDES = {"python": prelude_py, "node": prelude_js}


class KernelStartError(RuntimeError):
    """The kernel could not be started or prepared (a tool failure, never the caller's)."""


class KernelDied(RuntimeError):
    """The kernel process is gone."""


@dataclass(frozen=True, slots=True)
class KernelLaunchConfig:
    """How kernels are launched: shared by every kernel the pool starts."""

    state_root: Path
    process_limits: ProcessLimits = field(default_factory=ProcessLimits)
    jail: str = "auto"  # auto | off | required
    # Where each kernel's read-only shared-resources directory is made (default
    # ``<state_root>/resources``); one directory per kernel, never inside a workspace.
    shared_dir: str | None = None
    env_allowlist: tuple[str, ...] | None = None
    extra_env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Binding:
    """What a kernel is currently bound to; re-sent only when it changes."""

    workspace: str | None
    url: str | None
    token: str | None
    available: tuple[str, ...]
    cap: int
    # The call's projected files (kaizen_kernel/resources.py); both None when there are none.
    resources_dir: str | None = None
    resources_manifest: str | None = None


class SandboxKernel:
    def __init__(self, *, kernel_name: str, language: str, config: KernelLaunchConfig,
                 workspace: Path | None = None) -> None:
        self.kernel_name = kernel_name
        self.language = language
        self.config = config
        self.launch_workspace = workspace
        self.kernel_id = str(uuid.uuid4())
        self.home = config.state_root / "homes" / self.kernel_id
        shared_root = Path(config.shared_dir) if config.shared_dir \
            else config.state_root / "resources"
        self.resources_dir = shared_root / self.kernel_id
        # The digest of the files projected into ``resources_dir`` now (None: empty).
        self.projected: str | None = None
        self.projected_manifest: str | None = None
        self.nonce = secrets.token_hex(8)
        self.marker_re = re.compile(re.escape(MARKER_PREFIX) + r"\d+ bytes "
                                    + re.escape(self.nonce) + r"\]\n")
        self.km: AsyncKernelManager | None = None
        self.client: Any = None
        self.binding: Binding | None = None
        self.started_at = 0.0
        self.start_seconds = 0.0
        self.closed = False
        self._died_starting = False
        self._last_msg_id = ""
        # An execution was sent and the kernel has not been seen idle since (a cancelled call
        # interrupts it; a kernel that finished its work needs nothing).
        self.in_flight = False

    # --- lifecycle -------------------------------------------------------------------------

    def _provisioner(self, km: AsyncKernelManager) -> SandboxProvisioner:
        kwargs: dict[str, Any] = {
            "workspace": str(self.launch_workspace) if self.launch_workspace else "",
            "home_dir": str(self.home),
            "shared_dir": str(self.resources_dir),
            "extra_env": dict(self.config.extra_env),
            "process_limits": {k: getattr(self.config.process_limits, k)
                               for k in ProcessLimits.__dataclass_fields__},
            "jail": self.config.jail,
        }
        if self.config.env_allowlist is not None:
            kwargs["env_allowlist"] = list(self.config.env_allowlist)
        return SandboxProvisioner(kernel_id=self.kernel_id, kernel_spec=km.kernel_spec,
                                  parent=km, **kwargs)

    async def start(self) -> None:
        """Start the kernel and install its prelude. A kernel that dies while starting is
        started once more on fresh ports: jupyter_client picks free ports in this process and
        the kernel binds them a moment later, so another process (a second server, another
        kernel) can take one in between, and the kernel exits with EADDRINUSE."""
        t0 = time.monotonic()
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                await self._start_once()
                break
            except KernelStartError as exc:
                if attempt == START_ATTEMPTS or not self._died_starting:
                    raise
                log.warning("kernel %s exited while starting (%s); starting it again on new "
                            "ports", self.kernel_id, exc)
                self.closed = False
                self.client = None
                self.km = None
        self.started_at = time.monotonic()
        self.start_seconds = self.started_at - t0

    async def _start_once(self) -> None:
        # CurveZMQ on the kernel's sockets where the kernelspec and libzmq support it.
        encryption = "auto" if zmq.has("curve") else "disabled"
        km = AsyncKernelManager(kernel_name=self.kernel_name, transport_encryption=encryption)
        km.kernel_id = self.kernel_id
        self.km = km
        self._died_starting = False
        try:
            prepare_directory(self.resources_dir)  # bound read-only into the jail at launch
            # ipykernel rewrites its connection file at start (remove + create): it must live
            # in a directory the jail binds writable, not in the host's /tmp, which the jail
            # replaces.
            self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
            km.connection_file = str(self.home / "connection.json")
            km.provisioner = self._provisioner(km)
            await km.start_kernel()
        except Exception as exc:
            await self.shutdown()
            raise KernelStartError(f"kernel could not start: {type(exc).__name__}") from exc
        try:
            await self._connect()
        except Exception:
            # A kernel process that is gone died starting (a port taken meanwhile, usually);
            # one that is alive but unready is a different failure and is not retried.
            with contextlib.suppress(Exception):
                self._died_starting = not await km.is_alive()
            await self.shutdown()
            raise

    async def _connect(self) -> None:
        await self._open_client()
        self.binding = None
        prelude = PRELUDES.get(self.language)
        if prelude is not None:
            await self.run_silent(prelude.install_source(1024 * 1024, self.nonce))

    async def _open_client(self) -> None:
        """Channels to the kernel, ready (a gateway kernel opens a websocket instead)."""
        assert self.km is not None
        client = self.km.client()
        client.start_channels()
        self.client = client
        try:
            await client.wait_for_ready(timeout=START_TIMEOUT_S)
        except Exception as exc:
            raise KernelStartError(f"kernel not ready: {type(exc).__name__}") from exc

    async def is_alive(self) -> bool:
        return self.km is not None and not self.closed and bool(await self.km.is_alive())

    async def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.stop_channels()
        if self.km is not None:
            with contextlib.suppress(Exception):
                await self.km.shutdown_kernel(now=True)
        shutil.rmtree(self.home, ignore_errors=True)
        remove_resources(self.resources_dir)

    async def restart(self) -> None:
        """Kill and start the same kernel again (state lost), then reinstall the prelude."""
        assert self.km is not None
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.stop_channels()
        try:
            await self.km.restart_kernel(now=True)
        except Exception as exc:
            raise KernelStartError(f"kernel could not restart: {type(exc).__name__}") from exc
        previous = self.binding
        await self._connect()
        if previous is not None:
            await self.bind(previous)

    def interrupts_by_message(self) -> bool:
        """Whether this kernel is interrupted by the kernel protocol's ``interrupt_request``
        on its control channel rather than by a signal. A message reaches a kernel wherever
        its channels do; SIGINT sent to ``bwrap`` does not reach a kernel in the jail's PID
        namespace. ipykernel answers it on its control thread while the shell is busy (it
        then raises KeyboardInterrupt in the program); another kernel only when its
        kernelspec says ``interrupt_mode: message`` (tslab treats control like shell)."""
        spec = self.km.kernel_spec if self.km is not None else None
        return self.language == "python" or getattr(spec, "interrupt_mode", "") == "message"

    async def send_interrupt_request(self) -> None:
        client = self.client
        # The replies to earlier interrupts, which nobody waits for, go first.
        with contextlib.suppress(Exception):
            for _ in range(100):
                await client.get_control_msg(timeout=0)
        client.control_channel.send(client.session.msg("interrupt_request", {}))

    async def interrupt(self) -> None:
        if self.interrupts_by_message():
            await self.send_interrupt_request()
            return
        assert self.km is not None
        await self.km.interrupt_kernel()

    async def collect_targets(self, targets: Sequence[str], workspace: Path, *,
                              max_file_bytes: int, max_total_bytes: int) -> dict[str, str]:
        """Bring the declared files into the lease workspace before capture.

        A local kernel wrote them there itself: nothing to do. A gateway kernel on another
        host transfers them (see :mod:`kaizen_kernel.remote.kernel`). Returns refusal
        reasons known only to the kernel's side, by target name.
        """
        return {}

    # --- execution -------------------------------------------------------------------------

    async def run_silent(self, code: str, seconds: float = SETUP_TIMEOUT_S) -> None:
        """Run server-authored setup code; any failure is a kernel (tool) failure."""
        msg_id = self.client.execute(code, silent=True, store_history=False,
                                     allow_stdin=False)
        self._last_msg_id = msg_id
        self.in_flight = True
        try:
            reply = await execute.wait_reply(self.client, msg_id, seconds)
        except asyncio.CancelledError:
            if not self._shut_under_us():
                raise
            raise KernelStartError("kernel was shut down during setup") from None
        self.in_flight = reply is None
        if reply is None:
            raise KernelStartError("kernel setup timed out")
        if reply.get("content", {}).get("status") != "ok":
            content = reply.get("content", {})
            raise KernelStartError(f"kernel setup failed: {content.get('ename', '?')}")

    async def bind(self, binding: Binding) -> None:
        if binding == self.binding:
            return
        prelude = PRELUDES.get(self.language)
        if prelude is not None:
            await self.run_silent(prelude.bind_source(
                binding.workspace, binding.url, binding.token, list(binding.available),
                binding.cap, binding.resources_dir, binding.resources_manifest))
        self.binding = binding

    async def execute(self, code: str, *, wall_seconds: float,
                      output_bytes: int) -> execute.ExecutionCapture:
        if self.closed or self.client is None:
            raise KernelDied("kernel is closed")
        for attempt in range(2):
            msg_id = self.client.execute(code, silent=False, store_history=True,
                                         allow_stdin=False)
            # Known before the wait: a call cancelled mid-way interrupts this execution.
            self._last_msg_id = msg_id
            self.in_flight = True
            try:
                capture = await execute.collect(
                    self.client, msg_id, wall_seconds=wall_seconds, output_bytes=output_bytes,
                    marker_re=self.marker_re, is_alive=self.is_alive)
            except asyncio.CancelledError:
                if not self._shut_under_us():
                    raise
                return execute.ExecutionCapture(status="died")
            self.in_flight = capture.status == "timeout"  # still running the program
            if capture.status not in ("ok", "error"):
                return capture
            reply = await execute.wait_reply(self.client, msg_id, 1.0)
            if attempt == 0 and execute.was_aborted_unrun(capture, reply):
                # The kernel refused it unrun, still settling the previous request's error
                # (tslab aborts what arrives within 200 ms of one): send it once more.
                await asyncio.sleep(ABORT_RETRY_S)
                continue
            execute.apply_reply_status(capture, reply)
            return capture
        raise AssertionError("unreachable")

    def _shut_under_us(self) -> bool:
        """A CancelledError nobody asked for: the kernel was shut down under a call (its
        lease released), and closing its channels cancelled the read in flight."""
        task = asyncio.current_task()
        return self.closed and task is not None and not task.cancelling()

    async def settle_timeout(self, grace: float = INTERRUPT_GRACE_S) -> bool:
        """After a wall-time overrun (or a cancelled call): interrupt the execution in flight;
        True when the kernel came back idle within ``grace`` (its state kept)."""
        if self.closed:
            return False
        try:
            await self.interrupt()
        except Exception:
            log.warning("interrupting run_code kernel %s failed", self.kernel_id, exc_info=True)
            return False
        idle = await execute.drain_until_idle(self.client, self._last_msg_id, grace)
        self.in_flight = not idle
        return idle

