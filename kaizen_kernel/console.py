"""Open a lease's persistent run_code kernel as a JupyterLab console.

run_code kernels are started and owned by Kaizen (``kernel.py``), so the Jupyter server does
not know them and JupyterLab cannot connect. Attaching registers a *proxy* kernel manager in
the Jupyter server's ``MappingKernelManager`` under the kernel's id: it carries the kernel's
connection info (ports, HMAC key, CurveZMQ keys) but does not own the process
(``owns_kernel=False``). The kernels API, the ``/api/kernels/{id}/channels`` websocket and
``/api/sessions`` then work on it like on any kernel, while its lifecycle stays the lease's:

- Shut down from JupyterLab (``DELETE /api/kernels/{id}``, or deleting its session): the
  lease's persistent kernel is retired; the next persistent run_code starts a fresh kernel
  and reports ``state_lost``.
- Restart from JupyterLab: the kernel restarts in place (same ports, prelude reinstalled),
  unless a run_code call holds it right now (then the restart is refused); the next call
  reports ``state_lost``.
- Interrupt: forwarded to the kernel (an in-flight run_code program sees KeyboardInterrupt).
- The lease lets the kernel go (idle timeout, release before an approval, a wall-limit
  restart, a dead kernel, server stop): the proxy is withdrawn from the Jupyter server at
  once and open console websockets are closed.

Working in an attached console (the server's activity watch on the kernel) counts as use
of the lease, so its idle timeout does not run out under an active console.

Only a lease's own member can attach (the REST route passes the calling member as the
actor); who can reach an attached kernel afterwards is the Jupyter kernels API's business —
see docs/run_code.md "Opening the kernel as a console" for what that exposes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jupyter_server._tz import utcnow
from jupyter_server.services.kernels.kernelmanager import (
    MappingKernelManager,
    ServerKernelManager,
)

if TYPE_CHECKING:
    from kaizen_kernel.kernel import SandboxKernel
    from kaizen_kernel.leases import KernelLease
    from kaizen_kernel.service import RunCodeService

log = logging.getLogger(__name__)


class ConsoleDisabled(RuntimeError):
    """Console attach is switched off on this server (``KaizenApp.kernel_console``)."""


class ConsoleUnavailable(RuntimeError):
    """This Jupyter server cannot host an attached kernel (e.g. kernels run on a gateway)."""


class NoPersistentKernel(LookupError):
    """The member has no live persistent run_code kernel in this conversation."""


class KernelBusy(RuntimeError):
    """A run_code call holds the kernel; a restart now would cut it off."""


@dataclass(frozen=True, slots=True)
class ConsoleKernel:
    """What JupyterLab needs to attach: the kernel id in the server's kernels API."""

    kernel_id: str
    kernel_name: str
    language: str

    def public(self) -> dict[str, str]:
        return {"kernel_id": self.kernel_id, "kernel_name": self.kernel_name,
                "language": self.language}


@dataclass(frozen=True, slots=True)
class PersistentKernelView:
    """One persistent kernel of the member's lease, as the panel sees it."""

    language: str
    kernel_name: str
    busy: bool
    console_kernel_id: str | None

    def public(self) -> dict[str, Any]:
        return {"language": self.language, "kernel_name": self.kernel_name,
                "busy": self.busy, "console_kernel_id": self.console_kernel_id}


@dataclass(frozen=True, slots=True)
class ConsoleControls:
    """What the proxy forwards to the lease's kernel."""

    is_alive: Callable[[], Awaitable[bool]]
    interrupt: Callable[[], Awaitable[None]]
    restart: Callable[[], Awaitable[None]]
    shutdown: Callable[[], Awaitable[None]]


class LeaseConsoleKernelManager(ServerKernelManager):
    """The Jupyter server's handle on a lease kernel it does not own."""

    def __init__(self, *, controls: ConsoleControls, **kwargs: Any) -> None:
        super().__init__(owns_kernel=False, **kwargs)
        self._controls = controls
        # Set when the Jupyter server itself shuts the kernel down (it then unregisters it).
        self.closing_from_server = False

    async def is_alive(self) -> bool:  # type: ignore[override]
        return await self._controls.is_alive()

    _async_is_alive = is_alive

    async def interrupt_kernel(self) -> None:  # type: ignore[override]
        await self._controls.interrupt()

    async def restart_kernel(self, now: bool = False, newports: bool = False,  # type: ignore[override]
                             **kw: Any) -> None:
        await self._controls.restart()

    async def shutdown_kernel(self, now: bool = False,  # type: ignore[override]
                              restart: bool = False) -> None:
        self.closing_from_server = True
        await self._controls.shutdown()
        # Not the owner: the base class only records the event, it stops no process.
        await super().shutdown_kernel(now=now, restart=restart)


class KernelConsoles:
    """Attaches lease kernels to one Jupyter server's kernel manager, and withdraws them."""

    def __init__(self, kernel_manager: Any, service: RunCodeService, *,
                 enabled: bool = True) -> None:
        self.kernel_manager = kernel_manager
        self.service = service
        self.enabled = enabled
        self._proxies: dict[str, LeaseConsoleKernelManager] = {}
        service.leases.kernel_listeners.append(self.withdraw)
        service.leases.activity_probes.append(self.console_activity)

    @property
    def hostable(self) -> bool:
        """Only a local MappingKernelManager can host a proxy (not a gateway's manager)."""
        manager = self.kernel_manager
        if not isinstance(manager, MappingKernelManager):
            return False
        return type(manager).__module__.startswith("jupyter_server.services.kernels")

    def attached_id(self, kernel: SandboxKernel) -> str | None:
        proxy = self._proxies.get(kernel.kernel_id)
        if proxy is None or kernel.kernel_id not in self.kernel_manager:
            return None
        return kernel.kernel_id

    # --- the member's view -----------------------------------------------------------------

    def _live_lease(self, actor: str, conversation_id: str) -> KernelLease | None:
        lease = self.service.leases.get(actor, conversation_id)
        if lease is None or lease.released or self.service.leases.is_expired(lease):
            return None
        return lease

    async def status(self, actor: str, conversation_id: str) -> list[PersistentKernelView]:
        """The live persistent kernels of (actor, conversation); never anyone else's."""
        lease = self._live_lease(actor, conversation_id)
        if lease is None:
            return []
        views = []
        for language, kernel in sorted(lease.persistent.items()):
            if kernel.closed or not await kernel.is_alive():
                continue
            views.append(PersistentKernelView(
                language=language, kernel_name=kernel.kernel_name,
                busy=lease.lock.locked(), console_kernel_id=self.attached_id(kernel)))
        return views

    async def open(self, actor: str, conversation_id: str,
                   language: str = "python") -> ConsoleKernel:
        """Attach the persistent ``language`` kernel of (actor, conversation); idempotent."""
        if not self.enabled:
            raise ConsoleDisabled("console attach is disabled on this server")
        if not self.hostable:
            raise ConsoleUnavailable("this Jupyter server cannot host an attached kernel")
        lease = self._live_lease(actor, conversation_id)
        kernel = lease.persistent.get(language) if lease is not None else None
        if lease is None or kernel is None or kernel.km is None:
            raise NoPersistentKernel(language)
        if not await kernel.is_alive():
            raise NoPersistentKernel(language)
        # From here on nothing awaits: the lease cannot let the kernel go between this check
        # and the registration (its listeners run synchronously, see LeaseManager).
        if lease.released or kernel.closed or lease.persistent.get(language) is not kernel:
            raise NoPersistentKernel(language)
        if self.attached_id(kernel) is None:
            self._register(lease, language, kernel)
        lease.touch()
        return ConsoleKernel(kernel.kernel_id, kernel.kernel_name, language)

    # --- registration ----------------------------------------------------------------------

    def _register(self, lease: KernelLease, language: str, kernel: SandboxKernel) -> None:
        assert kernel.km is not None
        manager = self.kernel_manager
        self._drop_stale(kernel.kernel_id)
        constructor: dict[str, Any] = {"parent": manager, "log": manager.log,
                                       "kernel_name": kernel.kernel_name,
                                       "controls": self._controls(lease, language, kernel)}
        if getattr(manager, "kernel_spec_manager", None) is not None:
            constructor["kernel_spec_manager"] = manager.kernel_spec_manager
        if getattr(manager, "shared_context", False):
            constructor["context"] = manager.context
        proxy = LeaseConsoleKernelManager(**constructor)
        proxy.load_connection_info(kernel.km.get_connection_info())
        proxy.kernel_id = kernel.kernel_id
        proxy.last_activity = utcnow()
        proxy.execution_state = "idle"
        proxy.ready.set_result(None)
        kernel_id = kernel.kernel_id
        # What MappingKernelManager.start_kernel and _finish_kernel_start record for a kernel
        # it started itself: the map entry, connection count, ports and the activity watch.
        manager._kernels[kernel_id] = proxy
        manager._kernel_connections[kernel_id] = 0
        manager._kernel_ports[kernel_id] = proxy.ports
        manager.start_watching_activity(kernel_id)
        self._proxies[kernel_id] = proxy
        log.info("run_code kernel %s attached for a console (lease %s)", kernel_id,
                 lease.lease_id)

    def withdraw(self, kernel: SandboxKernel) -> None:
        """The lease lets ``kernel`` go: take it out of the Jupyter server (synchronous)."""
        proxy = self._proxies.pop(kernel.kernel_id, None)
        if proxy is None or proxy.closing_from_server:
            return  # the server is shutting it down itself and unregisters it
        self._unregister(kernel.kernel_id, proxy)

    def _drop_stale(self, kernel_id: str) -> None:
        proxy = self._proxies.pop(kernel_id, None)
        if proxy is not None and not proxy.closing_from_server:
            self._unregister(kernel_id, proxy)

    def _unregister(self, kernel_id: str, proxy: LeaseConsoleKernelManager) -> None:
        manager = self.kernel_manager
        if manager._kernels.get(kernel_id) is proxy:
            with contextlib.suppress(Exception):
                manager.stop_watching_activity(kernel_id)
            with contextlib.suppress(Exception):
                manager.stop_buffering(kernel_id)
            manager.remove_kernel(kernel_id)
        manager._kernel_connections.pop(kernel_id, None)
        manager._kernel_ports.pop(kernel_id, None)
        _close_websockets(kernel_id)
        log.info("run_code kernel %s withdrawn from the console", kernel_id)

    def close(self) -> None:
        for kernel_id, proxy in list(self._proxies.items()):
            self._proxies.pop(kernel_id, None)
            self._unregister(kernel_id, proxy)
        with contextlib.suppress(ValueError):
            self.service.leases.kernel_listeners.remove(self.withdraw)
        with contextlib.suppress(ValueError):
            self.service.leases.activity_probes.remove(self.console_activity)

    def console_activity(self, lease: KernelLease) -> float | None:
        """When a console last used one of the lease's kernels (time.monotonic()), from the
        Jupyter server's own activity watch: working in the console keeps the lease alive,
        as it keeps any Jupyter kernel from being culled. A merely open console does not."""
        latest: float | None = None
        for kernel in lease.persistent.values():
            proxy = self._proxies.get(kernel.kernel_id)
            last = getattr(proxy, "last_activity", None) if proxy is not None else None
            if last is None:
                continue
            age = max(0.0, (utcnow() - last).total_seconds())
            seen = time.monotonic() - age
            latest = seen if latest is None else max(latest, seen)
        return latest

    # --- what JupyterLab's kernel actions do to the lease -------------------------------

    def _controls(self, lease: KernelLease, language: str,
                  kernel: SandboxKernel) -> ConsoleControls:
        service = self.service

        def still_the_leases() -> bool:
            return not lease.released and lease.persistent.get(language) is kernel

        async def is_alive() -> bool:
            return still_the_leases() and await kernel.is_alive()

        async def interrupt() -> None:
            if still_the_leases():
                await kernel.interrupt()

        async def shutdown() -> None:
            if still_the_leases():
                lease.persistent.pop(language, None)
                lease.lost_state[language] = "console_shutdown"
            service.leases.kernel_gone(kernel)
            # A run_code call in flight on this kernel ends as kernel_died (state lost).
            await kernel.shutdown()

        async def restart() -> None:
            if not still_the_leases():
                raise NoPersistentKernel(language)
            if lease.lock.locked():
                raise KernelBusy("a run_code call is using this kernel")
            async with lease.lock:
                if not still_the_leases():
                    raise NoPersistentKernel(language)
                lease.lost_state[language] = "console_restart"
                try:
                    await kernel.restart()
                except Exception:
                    lease.persistent.pop(language, None)
                    service.leases.kernel_gone(kernel)
                    await kernel.shutdown()
                    raise
                lease.touch()

        return ConsoleControls(is_alive=is_alive, interrupt=interrupt, restart=restart,
                               shutdown=shutdown)


def _close_websockets(kernel_id: str) -> None:
    """Close the open ``/api/kernels/{id}/channels`` sockets of a withdrawn kernel, so
    JupyterLab learns at once that it is gone instead of waiting on a silent kernel."""
    try:
        from jupyter_server.services.kernels.connection.channels import (
            ZMQChannelsWebsocketConnection,
        )
    except ImportError:
        return
    for connection in list(ZMQChannelsWebsocketConnection._open_sockets):
        with contextlib.suppress(Exception):
            if connection.kernel_id == kernel_id:
                connection.websocket_handler.close()
