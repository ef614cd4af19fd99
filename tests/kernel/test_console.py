"""Opening a lease's persistent run_code kernel as a console: attached to a real Jupyter
``MappingKernelManager`` in process, reached through the proxy's own connection info, and
withdrawn whenever the lease lets the kernel go."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from jupyter_server._tz import utcnow
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

from kaizen_kernel.console import (
    ConsoleDisabled,
    KernelBusy,
    KernelConsoles,
    NoPersistentKernel,
)
from tests.kernel.conftest import Sandbox

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def consoles(sandbox: Sandbox, tmp_path: Path) -> AsyncIterator[KernelConsoles]:
    manager = AsyncMappingKernelManager(root_dir=str(tmp_path))
    registry = KernelConsoles(manager, sandbox.service)
    try:
        yield registry
    finally:
        registry.close()


async def _evaluate(consoles: KernelConsoles, kernel_id: str, code: str) -> dict[str, Any]:
    """Run ``code`` through the Jupyter server's handle on the kernel, as a console would."""
    proxy = consoles.kernel_manager.get_kernel(kernel_id)
    client = proxy.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=20)
        msg_id = client.execute(code)
        seen: dict[str, Any] = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msg = await client.get_iopub_msg(timeout=20)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind == "execute_result":
                seen["result"] = msg["content"]["data"]["text/plain"]
            elif kind == "error":
                seen["error"] = msg["content"]["ename"]
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                return seen
        raise AssertionError("the console execution did not finish")
    finally:
        client.stop_channels()


async def _persistent(sandbox: Sandbox, actor: str, room: str, code: str) -> Any:
    result = await sandbox.service.run(actor, room, code, "python", True, [])
    assert result.status in ("ok", "error"), result
    return result


@pytest.mark.rule("R-439")
async def test_a_console_sees_the_persistent_state_and_only_its_member_may_open_it(
        sandbox: Sandbox, consoles: KernelConsoles) -> None:
    await _persistent(sandbox, "alice", "room-console", "x = 41")
    console = await consoles.open("alice", "room-console")
    assert console.kernel_id in consoles.kernel_manager
    listed = {k["id"] for k in consoles.kernel_manager.list_kernels()}
    assert console.kernel_id in listed
    assert (await _evaluate(consoles, console.kernel_id, "x + 1")) == {"result": "42"}
    # Opening again answers the same attachment.
    assert (await consoles.open("alice", "room-console")).kernel_id == console.kernel_id
    # A console's change is the state the next run_code sees (one kernel, one state).
    await _evaluate(consoles, console.kernel_id, "x = 100")
    after = await _persistent(sandbox, "alice", "room-console", "print(x)")
    assert after.stdout == "100\n" and not after.state_lost
    # The lease is bound to actor + conversation: nobody else has a kernel to open here.
    for actor, room in (("bob", "room-console"), ("alice", "room-elsewhere")):
        with pytest.raises(NoPersistentKernel):
            await consoles.open(actor, room)
    assert [v.public() for v in await consoles.status("bob", "room-console")] == []
    [view] = await consoles.status("alice", "room-console")
    assert view.console_kernel_id == console.kernel_id and view.language == "python"


async def test_no_console_without_a_persistent_kernel_or_when_disabled(
        sandbox: Sandbox, consoles: KernelConsoles) -> None:
    ephemeral = await sandbox.service.run("carol", "room-eph", "y = 1", "python", False, [])
    assert ephemeral.status == "ok"
    with pytest.raises(NoPersistentKernel):  # a lease, but no persistent kernel
        await consoles.open("carol", "room-eph")
    await _persistent(sandbox, "carol", "room-off", "z = 1")
    consoles.enabled = False
    try:
        with pytest.raises(ConsoleDisabled):
            await consoles.open("carol", "room-off")
    finally:
        consoles.enabled = True
    assert consoles.kernel_manager.list_kernels() == []


async def test_releasing_the_lease_withdraws_the_console_kernel(
        sandbox: Sandbox, consoles: KernelConsoles) -> None:
    await _persistent(sandbox, "dave", "room-release", "x = 41")
    console = await consoles.open("dave", "room-release")
    assert await sandbox.service.release("dave", "room-release")
    assert console.kernel_id not in consoles.kernel_manager
    assert console.kernel_id not in {k["id"] for k in consoles.kernel_manager.list_kernels()}
    with pytest.raises(NoPersistentKernel):
        await consoles.open("dave", "room-release")


async def test_idle_reaping_withdraws_the_console_kernel(
        sandbox: Sandbox, consoles: KernelConsoles) -> None:
    await _persistent(sandbox, "erin", "room-idle", "x = 41")
    console = await consoles.open("erin", "room-idle")
    leases = sandbox.service.leases
    lease = leases.get("erin", "room-idle")
    assert lease is not None
    lease.last_used = time.monotonic() - leases.idle_timeout_s - 10
    consoles.kernel_manager.get_kernel(console.kernel_id).last_activity = (
        utcnow() - timedelta(seconds=leases.idle_timeout_s + 10))
    assert await leases.reap_idle() >= 1
    assert lease.released
    assert console.kernel_id not in consoles.kernel_manager


async def test_shutting_the_kernel_down_from_jupyter_leaves_the_lease_consistent(
        sandbox: Sandbox, consoles: KernelConsoles) -> None:
    await _persistent(sandbox, "frank", "room-delete", "x = 41")
    console = await consoles.open("frank", "room-delete")
    # What DELETE /api/kernels/{id} (or deleting the console's session) does.
    await consoles.kernel_manager.shutdown_kernel(console.kernel_id)
    assert console.kernel_id not in consoles.kernel_manager
    lease = sandbox.service.leases.get("frank", "room-delete")
    assert lease is not None and "python" not in lease.persistent
    fresh = await _persistent(sandbox, "frank", "room-delete", "print(x)")
    assert fresh.error_name == "NameError" and fresh.state_lost, fresh
    assert "shut down from a console" in fresh.to_payload()["message"]
    # Reported once: the fresh kernel's own state carries on silently.
    again = await _persistent(sandbox, "frank", "room-delete", "x = 1\nprint(x)")
    assert again.stdout == "1\n" and not again.state_lost
    # And the fresh kernel can be opened in turn.
    reopened = await consoles.open("frank", "room-delete")
    assert reopened.kernel_id != console.kernel_id
    assert (await _evaluate(consoles, reopened.kernel_id, "x")) == {"result": "1"}


async def test_restarting_from_jupyter_restarts_in_place_and_is_refused_mid_call(
        sandbox: Sandbox, consoles: KernelConsoles) -> None:
    await _persistent(sandbox, "gina", "room-restart", "x = 41")
    console = await consoles.open("gina", "room-restart")
    manager = consoles.kernel_manager
    # Refused while a run_code call holds the kernel: it would cut the call off.
    running = asyncio.create_task(sandbox.service.run(
        "gina", "room-restart", "import time\ntime.sleep(3)\nprint('done')", "python", True,
        []))
    lease = sandbox.service.leases.get("gina", "room-restart")
    assert lease is not None
    for _ in range(2000):  # until the call holds the lease (at most 20 s)
        if lease.lock.locked():
            break
        await asyncio.sleep(0.01)
    with pytest.raises(KernelBusy):
        await manager.get_kernel(console.kernel_id).restart_kernel()
    assert (await running).stdout == "done\n"
    await manager.restart_kernel(console.kernel_id)
    assert console.kernel_id in manager  # same kernel id, same attachment
    assert (await _evaluate(consoles, console.kernel_id, "x")) == {"error": "NameError"}
    after = await _persistent(sandbox, "gina", "room-restart", "print('fresh')")
    assert after.stdout == "fresh\n" and after.state_lost
    assert "restarted from a console" in after.to_payload()["message"]


async def test_a_wall_limit_restart_withdraws_the_console_kernel(
        sandbox: Sandbox, consoles: KernelConsoles) -> None:
    await _persistent(sandbox, "hank", "room-wall", "x = 41")
    console = await consoles.open("hank", "room-wall")
    stubborn = ("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "while True:\n    time.sleep(0.05)\n")
    result = await sandbox.service.run("hank", "room-wall", stubborn, "python", True, [],
                                       wall_seconds=1)
    assert result.status == "restarted" and result.state_lost, result
    assert console.kernel_id not in consoles.kernel_manager
    # The restarted kernel is still the lease's; a new console attaches to it.
    reopened = await consoles.open("hank", "room-wall")
    assert (await _evaluate(consoles, reopened.kernel_id, "x")) == {"error": "NameError"}


async def test_working_in_the_console_keeps_the_lease_from_idling_out(
        sandbox: Sandbox, consoles: KernelConsoles) -> None:
    await _persistent(sandbox, "ivan", "room-active", "x = 41")
    console = await consoles.open("ivan", "room-active")
    leases = sandbox.service.leases
    lease = leases.get("ivan", "room-active")
    assert lease is not None
    idle = leases.idle_timeout_s
    proxy = consoles.kernel_manager.get_kernel(console.kernel_id)
    # The last run_code call and the last console use were long ago ...
    lease.last_used = time.monotonic() - idle - 10
    proxy.last_activity = utcnow() - timedelta(seconds=idle + 10)
    assert leases.is_expired(lease)
    # ... then the member works in the console: the server's activity watch sees it.
    await _evaluate(consoles, console.kernel_id, "x + 1")
    for _ in range(500):
        if not leases.is_expired(lease):
            break
        await asyncio.sleep(0.01)
    assert not leases.is_expired(lease)
    assert await leases.reap_idle() == 0
    assert console.kernel_id in consoles.kernel_manager
    # A console left alone (no execution since) does not keep it.
    proxy.last_activity = utcnow() - timedelta(seconds=idle + 10)
    assert leases.is_expired(lease)
    assert await leases.reap_idle() >= 1
    assert console.kernel_id not in consoles.kernel_manager
