"""run_code figures: the tools bridge round trip from kernel code, and trivial executions.

Prints one JSON line per figure (``"bench": "run_code"``, the figure under ``"figure"``):

* ``bridge_round_trip`` — ``tools.call`` timed *inside* a persistent kernel against a trivial
  dispatch over real loopback HTTP, vs awaiting the same dispatch in process (baseline);
* ``run_code_persistent`` / ``run_code_ephemeral`` — a trivial ``1+1`` through
  ``RunCodeService.run`` (persistent lease; ephemeral from the warm pool), vs a bare call;
* ``run_code_pipeline_persistent`` — the same persistent run as a model's call makes it: the
  run's host journals ``tool.requested``, the store-backed guarded pipeline runs it and the
  host journals ``tool.settled`` with the audit row (SQLite), vs the direct persistent run;
* ``wall_limit_recovery`` — from the wall limit firing on a C loop that ignores the interrupt
  to a usable (restarted) kernel again;
* ``output_flood`` — printing 50 MiB: time until the call returns with ≤ the output cap;
* ``interrupt_to_usable`` — one line per jail mode (``off``, and ``bwrap`` when bubblewrap is
  installed): a persistent ``k = 7``, then a Python ``while True: time.sleep(0.1)`` overrunning
  its wall limit, interrupted (the kernel protocol's ``interrupt_request``) and the next call
  printing ``k``; from the wall limit firing to that call's return, in ms. Baseline: a bare
  jupyter_client interrupt of a plain ipykernel (``AsyncKernelManager``, no provisioner, no
  jail, its default interrupt), from sending it to the next execution's reply printing ``k``.

Usage: ``python bench/run_code.py [--n N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tornado.httpserver
import tornado.netutil
import tornado.web

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import bare_async_call_ns, emit, now_ns, ratio, summary, us

from kaizen_kernel.bridge import bridge_handlers, bridge_url
from kaizen_kernel.leases import KernelLease
from kaizen_kernel.limits import ExecutionBudget
from kaizen_kernel.service import RunCodeConfig, RunCodeService
from kaizen_server_extension.protocol.tools import Capability

READ_TOOLS = {"echo": Capability.READ}


async def dispatch(lease: KernelLease, name: str, arguments: dict[str, Any]) -> Any:
    return {"echo": arguments}


def timing_program(n: int) -> str:
    # Measured inside the kernel, so the figure is what agent code experiences.
    return f"""
import json, time
samples = []
for i in range({n}):
    t = time.perf_counter_ns()
    tools.call("echo", {{"i": i}})
    samples.append(time.perf_counter_ns() - t)
print(json.dumps(samples))
"""


async def through_pipeline(service: RunCodeService, n: int, direct_p50_us: float) -> None:
    """A trivial persistent ``run_code`` as a model's call makes it: through the run's host
    (``tool.requested`` journaled with the call's facts, ``tool.settled`` with the audit row),
    the store-backed guarded pipeline (authority, permissions, ceiling, approval mode, write
    guard) and the kernel."""
    from datetime import timedelta

    from benchkit import admit_run, fresh_store

    from kaizen_server_extension.host.run_host import RunHost
    from kaizen_server_extension.host.tool_backend import PipelineToolBackend
    from kaizen_server_extension.protocol.tools import ToolCallRequest
    from kaizen_server_extension.runtime.port import TraceEvent
    from kaizen_server_extension.store.runs import RunLane
    from kaizen_server_extension.tools.registry import ToolRegistry

    async with fresh_store("sqlite", "") as store:
        await store.members.ensure("bench")
        await store.members.update_settings("bench", approval_mode="never_ask", model=None)
        agent = await store.agents.ensure_system_agent(
            "coder", "Coder", persona="Runs code.", mode="chat", tool_ceiling=["run_code"])
        room = await store.conversations.create("bench", agent.id, "bench", shared=False)
        backend = PipelineToolBackend(store, ToolRegistry.from_plugins(load_entrypoints=False),
                                      discovery_enabled=False)
        backend.attach_run_code(service)
        lane = RunLane(store)
        admitted = await admit_run(store, lane, backend, _Room("bench", agent, room))
        bundle = admitted.bundle
        host = RunHost(
            store=store, lane=lane, bundle=bundle, model_stream=_no_model,
            call_tool=backend.caller(bundle=bundle, tools=admitted.tools,
                                     cancelled=asyncio.Event()),
            publish_live=lambda conversation, kind, data: None, lease=timedelta(seconds=60),
            read_tools=admitted.tools.read_tools)
        arguments = json.dumps({"code": "1+1", "persistent": True, "artifact_targets": []})
        samples: list[int] = []
        for i in range(n):
            start = now_ns()
            await host.publish(bundle, TraceEvent("tool.requested", {
                "step": i + 1, "call_id": f"c{i}", "name": "run_code",
                "arguments": arguments}))
            result = await host.call_tool(bundle, ToolCallRequest(f"c{i}", "run_code",
                                                                  arguments, i + 1))
            samples.append(now_ns() - start)
            assert result.outcome.value == "ok", result.content
        stats = summary(samples)
        emit({"db": "sqlite", "bench": "run_code", "figure": "run_code_pipeline_persistent",
              **stats, "baseline_p50_us": us(direct_p50_us),
              "ratio": ratio(stats["p50_us"], direct_p50_us), "target_p50_us": 10_000.0,
              "meets_target": stats["p50_us"] <= 10_000.0, "n": n})


INTERRUPT_WALL_S = 0.3
SPIN = "import time\nwhile True:\n    time.sleep(0.1)\n"


async def _ours_interrupt_ms(service: RunCodeService, conversation: str) -> float:
    """Wall limit firing → interrupted → the next call has ``k``: ms (one trial)."""
    start = time.monotonic()
    overran = await service.run("bench", conversation, SPIN, "python", True, [],
                                wall_seconds=INTERRUPT_WALL_S)
    shown = await service.run("bench", conversation, "print(k)", "python", True, [])
    elapsed = time.monotonic() - start - INTERRUPT_WALL_S
    assert overran.status == "timeout" and not overran.state_lost, overran.to_payload()
    assert shown.stdout == "7\n", shown.to_payload()
    return elapsed * 1000


class _BareKernel:
    """A plain ipykernel through jupyter_client alone: the baseline's interrupt."""

    def __init__(self) -> None:
        from jupyter_client.manager import AsyncKernelManager

        self.km = AsyncKernelManager(kernel_name="python3")
        self.client: Any = None

    async def start(self) -> None:
        await self.km.start_kernel()
        self.client = self.km.client()
        self.client.start_channels()
        await self.client.wait_for_ready(timeout=60)
        await self._run("k = 7")

    async def _run(self, code: str, seconds: float = 30.0) -> dict[str, Any]:
        from kaizen_kernel import execute

        msg_id = self.client.execute(code)
        reply = await execute.wait_reply(self.client, msg_id, seconds)
        assert reply is not None
        return reply

    async def interrupt_ms(self) -> float:
        from kaizen_kernel import execute

        msg_id = self.client.execute(SPIN)
        await asyncio.sleep(INTERRUPT_WALL_S)
        start = time.monotonic()
        await self.km.interrupt_kernel()
        assert await execute.drain_until_idle(self.client, msg_id, 10.0)
        await execute.wait_reply(self.client, msg_id, 5.0)
        msg_id = self.client.execute("print(k)")
        reply = await execute.wait_reply(self.client, msg_id, 10.0)
        elapsed = time.monotonic() - start
        assert reply is not None and reply["content"]["status"] == "ok"
        return elapsed * 1000

    async def stop(self) -> None:
        self.client.stop_channels()
        await self.km.shutdown_kernel(now=True)


async def interrupt_figures(unjailed: RunCodeService, root: Path, trials: int) -> None:
    from kaizen_kernel.provisioner import find_bwrap

    modes: list[tuple[str, RunCodeService]] = [("off", unjailed)]
    jailed: RunCodeService | None = None
    if find_bwrap() is not None:
        jailed = RunCodeService(RunCodeConfig(
            state_root=root / "jailed", jail="required", pool_sizes={"python": 0},
            budget=ExecutionBudget(wall_seconds=20, output_bytes=1024 * 1024)))
        await jailed.start()
        modes.append(("bwrap", jailed))
    bare = _BareKernel()
    await bare.start()
    try:
        for jail, service in modes:
            conversation = f"interrupt-{jail}"
            done = await service.run("bench", conversation, "k = 7", "python", True, [])
            assert done.status == "ok", done.to_payload()
            ours: list[float] = []
            base: list[float] = []
            for _ in range(trials):  # interleaved, so both see the same machine load
                ours.append(await _ours_interrupt_ms(service, conversation))
                base.append(await bare.interrupt_ms())
            ours.sort()
            base.sort()
            p50, bare_p50 = ours[len(ours) // 2], base[len(base) // 2]
            emit({"db": "none", "bench": "run_code", "figure": "interrupt_to_usable",
                  "jail": jail, "p50_ms": round(p50, 1),
                  "p95_ms": round(ours[min(len(ours) - 1, round(0.95 * (len(ours) - 1)))], 1),
                  "baseline_p50_ms": round(bare_p50, 1), "ratio": ratio(p50, bare_p50),
                  "state_kept": True, "wall_s": INTERRUPT_WALL_S, "n": trials})
    finally:
        await bare.stop()
        if jailed is not None:
            await jailed.close()


async def _no_model(snapshot: Any) -> Any:
    raise AssertionError("this bench makes no model step")
    yield


@dataclass(frozen=True)
class _Room:
    member: str
    agent: Any
    conversation: Any


async def main(n: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="kaizen-bench-"))
    service = RunCodeService(
        RunCodeConfig(
            state_root=root,
            jail="off",
            pool_sizes={"python": 2},
            budget=ExecutionBudget(wall_seconds=20, output_bytes=1024 * 1024),
        )
    )
    app = tornado.web.Application(bridge_handlers("/", service.leases, dispatch))
    sockets = tornado.netutil.bind_sockets(0, "127.0.0.1", family=socket.AF_INET)
    server = tornado.httpserver.HTTPServer(app)
    server.add_sockets(sockets)
    service.bridge_url = bridge_url(f"http://127.0.0.1:{sockets[0].getsockname()[1]}/")
    await service.start()
    try:
        baseline_ns = await bare_async_call_ns()
        # Bridge: timed inside the kernel.
        result = await service.run(
            "bench", "room", timing_program(n), "python", True, [], callable_tools=READ_TOOLS
        )
        samples = json.loads(result.stdout.strip().splitlines()[-1])
        direct: list[int] = []
        for i in range(n):
            start = now_ns()
            await dispatch(None, "echo", {"i": i})  # type: ignore[arg-type]
            direct.append(now_ns() - start)
        stats = summary(samples)
        emit(
            {
                "db": "none",
                "bench": "run_code",
                "figure": "bridge_round_trip",
                **stats,
                "baseline_p50_us": summary(direct)["p50_us"],
                "ratio": ratio(stats["p50_us"], summary(direct)["p50_us"]),
                "target_p50_us": 1000.0,
                "meets_target": stats["p50_us"] <= 1000.0,
                "n": n,
            }
        )

        for persistent, figure, target in (
            (True, "run_code_persistent", 10_000.0),
            (False, "run_code_ephemeral", 60_000.0),
        ):
            runs: list[int] = []
            for _ in range(max(5, n // 10)):
                start = now_ns()
                done = await service.run("bench", "room", "1+1", "python", persistent, [])
                runs.append(now_ns() - start)
                assert done.status == "ok", done.to_payload()
            stats = summary(runs)
            if persistent:
                direct_persistent_us = stats["p50_us"]
            emit(
                {
                    "db": "none",
                    "bench": "run_code",
                    "figure": figure,
                    **stats,
                    "baseline_p50_us": us(baseline_ns / 1000),
                    "ratio": ratio(stats["p50_us"], baseline_ns / 1000),
                    "target_p50_us": target,
                    "meets_target": stats["p50_us"] <= target,
                    "n": len(runs),
                }
            )

        await through_pipeline(service, max(5, n // 10), direct_persistent_us)

        started = time.monotonic()
        slow = await service.run(
            "bench", "room", "sum(range(10**12))", "python", True, [], wall_seconds=1
        )
        after_limit = time.monotonic()
        usable = await service.run("bench", "room", "1+1", "python", True, [])
        recovered = time.monotonic()
        emit(
            {
                "db": "none",
                "bench": "run_code",
                "figure": "wall_limit_recovery",
                "status": slow.status,
                "limit_to_usable_ms": round((recovered - started - 1) * 1000, 1),
                "call_returned_after_ms": round((after_limit - started) * 1000, 1),
                "usable": usable.status == "ok",
                "n": 1,
            }
        )

        start = now_ns()
        flood = await service.run(
            "bench", "room", "print('x' * (50 * 1024 * 1024))", "python", False, []
        )
        emit(
            {
                "db": "none",
                "bench": "run_code",
                "figure": "output_flood",
                "ms": round((now_ns() - start) / 1e6, 1),
                "collected_bytes": len(flood.stdout.encode()),
                "truncated": flood.output_truncated,
                "cap_bytes": 1024 * 1024,
                "n": 1,
            }
        )
        await interrupt_figures(service, root, max(3, n // 20))
    finally:
        server.stop()
        await service.close()


def _figures_alone_on_stdout() -> None:
    """The kernels this bench starts inherit its stdout, and a jailed ipykernel (no parent
    pid in its namespace) prints its connection banner there: they get stderr instead, and
    only the JSON figures go to stdout."""
    figures = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = open(figures, "w", buffering=1, encoding="utf-8")


if __name__ == "__main__":
    _figures_alone_on_stdout()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--db", default="none", help="accepted for uniformity; no database")
    asyncio.run(main(parser.parse_args().n))
