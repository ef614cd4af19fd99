"""The wall-time limit and a cancelled call interrupt the program with the kernel protocol's
``interrupt_request`` (issue 13, item 4), in REAL kernels, jailed and not: SIGINT sent to
``bwrap`` never reaches a kernel in the jail's PID namespace, a control message does. A
Python-level loop is interrupted with its persistent state kept; only a kernel still busy
about a second after the interrupt is restarted (``state_lost``)."""

from __future__ import annotations

import asyncio

import pytest

from kaizen_server_extension.protocol.tools import FailureDomain, ToolOutcome
from tests.kernel.conftest import Sandbox

pytestmark = pytest.mark.asyncio(loop_scope="session")

LOOP = "import time\nwhile True:\n    time.sleep(0.1)\n"
# A C loop: the KeyboardInterrupt waits for the next bytecode, which never comes in time.
IGNORES = "sum(range(10**13))"
WALL = 1.0


@pytest.mark.rule("R-077")
async def test_a_python_loop_over_the_wall_limit_is_interrupted_with_state_kept(
        either_sandbox: Sandbox) -> None:
    svc = either_sandbox.service
    await svc.run("alice", "conv-int", "k = 7", "python", True, [])
    kernel = svc.leases.get("alice", "conv-int").persistent["python"]  # type: ignore[union-attr]
    assert kernel.interrupts_by_message()
    r = await svc.run("alice", "conv-int", LOOP, "python", True, [], wall_seconds=WALL)
    assert r.status == "timeout" and r.code == "wall_time_exceeded", r
    assert not r.kernel_restarted and not r.state_lost
    assert r.outcome == ToolOutcome.TIMEOUT and r.failure_domain == FailureDomain.CALLER
    after = await svc.run("alice", "conv-int", "print(k)", "python", True, [])
    assert after.status == "ok" and after.stdout == "7\n", after
    assert svc.leases.get("alice", "conv-int").persistent["python"] is kernel  # type: ignore[union-attr]


@pytest.mark.rule("R-077")
async def test_a_kernel_still_busy_after_the_interrupt_is_restarted_and_says_so(
        either_sandbox: Sandbox) -> None:
    svc = either_sandbox.service
    await svc.run("alice", "conv-ign", "k = 7", "python", True, [])
    r = await svc.run("alice", "conv-ign", IGNORES, "python", True, [], wall_seconds=WALL)
    assert r.status == "restarted" and r.code == "wall_time_exceeded_restarted", r
    assert r.kernel_restarted and r.state_lost and "ignored the interrupt" in r.message
    after = await svc.run("alice", "conv-ign", "print(k)", "python", True, [])
    assert after.error_name == "NameError"  # the restart lost it, as the result said
    again = await svc.run("alice", "conv-ign", "print('usable')", "python", True, [])
    assert again.stdout == "usable\n"


async def test_cancelling_a_call_interrupts_its_program_at_once_and_keeps_state(
        either_sandbox: Sandbox) -> None:
    """The member's Stop cancels the tool call: its program is interrupted there and then,
    and a persistent kernel that comes back idle keeps what it held."""
    svc = either_sandbox.service
    await svc.run("alice", "conv-stop", "k = 7", "python", True, [])
    lease = svc.leases.get("alice", "conv-stop")
    assert lease is not None
    kernel = lease.persistent["python"]
    task = asyncio.create_task(svc.run("alice", "conv-stop", LOOP, "python", True, []))
    await asyncio.sleep(1.0)
    assert lease.current is kernel and kernel.in_flight
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert lease.current is None and lease.active is None
    assert lease.persistent.get("python") is kernel and not kernel.in_flight
    after = await svc.run("alice", "conv-stop", "print(k)", "python", True, [])
    assert after.status == "ok" and after.stdout == "7\n", after
    assert not after.state_lost


async def test_a_cancelled_call_whose_program_ignores_the_interrupt_loses_its_kernel(
        either_sandbox: Sandbox) -> None:
    svc = either_sandbox.service
    await svc.run("alice", "conv-stop-ign", "k = 7", "python", True, [])
    lease = svc.leases.get("alice", "conv-stop-ign")
    assert lease is not None
    kernel = lease.persistent["python"]
    task = asyncio.create_task(svc.run("alice", "conv-stop-ign", IGNORES, "python", True, []))
    await asyncio.sleep(1.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert lease.current is None and lease.active is None
    assert "python" not in lease.persistent
    await svc.pool.wait_warm()
    assert not await kernel.is_alive()
    after = await svc.run("alice", "conv-stop-ign", "print(k)", "python", True, [])
    assert after.error_name == "NameError" and after.state_lost
    assert "stopped while its program ignored the interrupt" in after.message
