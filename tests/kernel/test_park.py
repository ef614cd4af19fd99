"""Persistent state survives an approval wait (issue 13, item 5), in REAL kernels, jailed and
not: releasing the lease before an approval (R-239) revokes its token and binds its kernels to
nothing, but *parks* its idle persistent kernels, and the conversation's next lease resumes
them. Parking is bounded in number and time; a reclaimed kernel's state is reported lost."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from kaizen_kernel.service import RunCodeConfig, RunCodeService
from kaizen_server_extension.protocol.tools import Capability
from tests.kernel.conftest import TEST_BUDGET, Sandbox

pytestmark = pytest.mark.asyncio(loop_scope="session")

ECHO = {"lookup": Capability.READ}


@pytest.mark.rule("R-239", "R-439")
async def test_a_released_lease_parks_its_kernel_and_the_next_lease_resumes_it(
        either_sandbox: Sandbox) -> None:
    svc = either_sandbox.service
    first = await svc.run("alice", "conv-park", "x = 41", "python", True, [])
    assert first.status == "ok", first
    lease = svc.leases.get("alice", "conv-park")
    assert lease is not None
    kernel = lease.persistent["python"]
    assert await svc.release("alice", "conv-park")
    # Released: no live lease, its token reaches nothing, and nothing is bound to it ...
    assert svc.leases.get("alice", "conv-park") is None and lease.released
    assert svc.leases.by_token(lease.token) is None and not lease.persistent
    # ... but the kernel is parked for the conversation, alive, its state intact.
    assert svc.leases.parked("alice", "conv-park") == {"python": kernel}
    assert await kernel.is_alive()
    resumed = await svc.run("alice", "conv-park",
                            "print(x + 1)\nprint(tools.call('lookup', {'q': 2})['actor'])",
                            "python", True, [], callable_tools=ECHO)
    assert resumed.status == "ok" and resumed.stdout == "42\nalice\n", resumed
    assert not resumed.state_lost
    fresh = svc.leases.get("alice", "conv-park")
    assert fresh is not None and fresh is not lease and fresh.token != lease.token
    assert fresh.persistent["python"] is kernel and not svc.leases.parked("alice", "conv-park")
    # The kernel was bound to the new lease's token (the tools.call above), never the old.
    assert kernel.binding is not None and kernel.binding.token == fresh.token
    # Another member's or conversation's lease never gets it.
    other = await svc.run("bob", "conv-park", "print(x)", "python", True, [])
    assert other.error_name == "NameError"


async def test_parked_kernels_are_bounded_and_the_oldest_is_reclaimed_first(
        tmp_path: Path) -> None:
    svc = RunCodeService(RunCodeConfig(state_root=tmp_path, budget=TEST_BUDGET, jail="off",
                                       pool_sizes={"python": 0}, max_parked_kernels=1))
    await svc.start()
    try:
        leases = svc.leases
        for conversation in ("conv-cap-a", "conv-cap-b"):
            await svc.run("alice", conversation, "x = 1", "python", True, [])
        oldest = leases.get("alice", "conv-cap-a").persistent["python"]  # type: ignore[union-attr]
        assert await svc.release("alice", "conv-cap-a")
        assert leases.parked_count() == 1
        assert await svc.release("alice", "conv-cap-b")
        assert leases.parked_count() == 1
        assert not leases.parked("alice", "conv-cap-a") and leases.parked("alice", "conv-cap-b")
        assert not await oldest.is_alive()
        lost = await svc.run("alice", "conv-cap-a", "print(x)", "python", True, [])
        assert lost.error_name == "NameError" and lost.state_lost
        assert "reclaimed for capacity" in lost.message
        kept = await svc.run("alice", "conv-cap-b", "print(x)", "python", True, [])
        assert kept.stdout == "1\n" and not kept.state_lost
    finally:
        await svc.close()


async def test_a_kernel_parked_past_the_idle_time_is_reclaimed_and_says_so(
        sandbox: Sandbox) -> None:
    svc = sandbox.service
    leases = svc.leases
    await svc.run("alice", "conv-park-idle", "x = 1", "python", True, [])
    assert await svc.release("alice", "conv-park-idle")
    [kernel] = leases.parked("alice", "conv-park-idle").values()
    assert await leases.reap_idle(now=time.monotonic() + 1) == 0  # not yet
    assert leases.parked("alice", "conv-park-idle")
    assert await leases.reap_idle(now=time.monotonic() + leases.idle_timeout_s + 1) >= 1
    assert not leases.parked("alice", "conv-park-idle") and not await kernel.is_alive()
    lost = await svc.run("alice", "conv-park-idle", "print(x)", "python", True, [])
    assert lost.error_name == "NameError" and lost.state_lost
    assert "idle too long" in lost.message
    again = await svc.run("alice", "conv-park-idle", "print('once')", "python", True, [])
    assert again.status == "ok" and not again.state_lost  # said once


@pytest.mark.rule("R-239")
async def test_a_release_during_a_call_stops_that_kernel_and_says_so_next_time(
        sandbox: Sandbox) -> None:
    svc = sandbox.service
    await svc.run("alice", "conv-park-busy", "x = 1", "python", True, [])
    task = asyncio.create_task(svc.run("alice", "conv-park-busy",
                                       "import time\ntime.sleep(30)", "python", True, []))
    await asyncio.sleep(1.0)
    lease = svc.leases.get("alice", "conv-park-busy")
    assert lease is not None and lease.current is not None
    busy = lease.current
    assert await svc.release("alice", "conv-park-busy")
    cut = await task
    assert cut.code in ("lease_released", "kernel_died"), cut
    assert not svc.leases.parked("alice", "conv-park-busy") and not await busy.is_alive()
    lost = await svc.run("alice", "conv-park-busy", "print(x)", "python", True, [])
    assert lost.error_name == "NameError" and lost.state_lost
