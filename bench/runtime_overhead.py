"""Runtime overhead per model step and per tool call, model and tool time excluded.

``TurnController`` + ``RunHost`` over a real store (SQLite and/or PostgreSQL), the real
``PipelineToolBackend`` pipeline, an in-process fake model (an async generator: step 1 emits a
``bench_read`` call, step 2 answers with text; no HTTP) and a no-op read tool. Each turn is
its own admitted run of one room; admission happens before the clock starts.

Figures (``figure`` key), all wall time minus the fake model's and the tool's own time:

* ``model_step``: from ``model.step.started`` being published (journaled) to the step's
  stream running dry, per step;
* ``tool_call``: from ``tool.requested`` being published to ``call_tool`` returning (the
  guarded pipeline, the audit row and the ``tool.settled`` journal write), per call, with
  the database transactions and statements (BEGIN not counted) one call costs;
* ``turn``: ``TurnController.run()`` end to end (two steps, one call, the committed answer
  and the compare-and-set terminal).

``cpu_p50_us``/``cpu_p95_us`` are the process's CPU time (all threads, the SQLite driver's
included) over the same windows: on a loaded machine wall time mostly measures waiting for a
core, CPU time much less so. ``ratio`` is against awaiting a bare async function, measured in
the same run. Targets
(``target_p50_us``): a tool call at p50 within 1 ms on SQLite and 3 ms on PostgreSQL.

    .venv/bin/python bench/runtime_overhead.py [--db sqlite|postgresql|both] [--n N]
        [--profile PATH]   # cProfile the measured turns of each db into PATH.<db>.prof
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta

from benchkit import (
    TOOL_CLOCK,
    FakeModel,
    StatementCounter,
    admit_run,
    bare_async_call_ns,
    emit,
    for_each_db,
    now_ns,
    parse_args,
    percentile,
    ratio,
    run_main,
    seed_room,
    summary,
    tool_backend,
    us,
)

from kaizen_server_extension.host.run_host import RunHost
from kaizen_server_extension.policy.synthesis import SYNTHESIS
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.model import ChatMessage, StepEvent, StepSnapshot
from kaizen_server_extension.protocol.tools import ToolCallRequest, ToolCallResult
from kaizen_server_extension.runtime.controller import TurnController
from kaizen_server_extension.runtime.port import (
    Budgets,
    RunManifest,
    TerminalOutcome,
    TerminalStatus,
    TraceEvent,
)
from kaizen_server_extension.store.runs import RunLane
from kaizen_server_extension.store.store import Store

BENCH = "runtime_overhead"


def cpu_ns() -> int:
    """CPU time of the whole process: unlike wall time, barely moved by other load."""
    return time.process_time_ns()

TARGET_TOOL_CALL_P50_US = {"sqlite": 1000.0, "postgresql": 3000.0}
WARMUP_TURNS = 10


@dataclass
class Samples:
    model_step: list[int] = field(default_factory=list)
    tool_call: list[int] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)
    # CPU time of this process (every thread, aiosqlite's included) over the same windows.
    cpu: dict[str, list[int]] = field(default_factory=lambda: {
        "model_step": [], "tool_call": [], "turn": []})


class TimedHost:
    """Delegates to the real ``RunHost`` and stamps the boundaries of steps and calls."""

    def __init__(self, inner: RunHost, model: FakeModel, samples: Samples | None,
                 counter: StatementCounter) -> None:
        self._inner = inner
        self._model = model
        self._samples = samples
        self._counter = counter
        self._step_start = 0
        self._call_start = 0
        self._step_cpu = 0
        self._call_cpu = 0

    def model_step(self, bundle: AuthorityBundle,
                   snapshot: StepSnapshot) -> AsyncIterator[StepEvent]:
        return self._timed_step(bundle, snapshot)

    async def _timed_step(self, bundle: AuthorityBundle,
                          snapshot: StepSnapshot) -> AsyncIterator[StepEvent]:
        self._model.take()
        async for event in self._inner.model_step(bundle, snapshot):
            yield event
        if self._samples is not None:
            elapsed = self._model.last_end_ns - self._step_start - self._model.take()
            self._samples.model_step.append(elapsed)
            self._samples.cpu["model_step"].append(cpu_ns() - self._step_cpu)

    async def call_tool(self, bundle: AuthorityBundle,
                        request: ToolCallRequest) -> ToolCallResult:
        TOOL_CLOCK.take()
        result = await self._inner.call_tool(bundle, request)
        self._counter.active = False
        if self._samples is not None:
            self._samples.tool_call.append(now_ns() - self._call_start - TOOL_CLOCK.take())
            self._samples.cpu["tool_call"].append(cpu_ns() - self._call_cpu)
        return result

    async def publish(self, bundle: AuthorityBundle, event: TraceEvent) -> None:
        if event.kind == "model.step.started":
            self._step_start = now_ns()
            self._step_cpu = cpu_ns()
        elif event.kind == "tool.requested":
            self._counter.active = self._samples is not None
            self._call_start = now_ns()
            self._call_cpu = cpu_ns()
        await self._inner.publish(bundle, event)

    async def publish_terminal(self, bundle: AuthorityBundle,
                               outcome: TerminalOutcome) -> bool:
        return await self._inner.publish_terminal(bundle, outcome)

    async def heartbeat(self, bundle: AuthorityBundle) -> None:
        await self._inner.heartbeat(bundle)


def _no_live(conversation_id: str, kind: str, data: dict[str, object]) -> None:
    return None


async def on_store(db: str, store: Store, n: int, profile: str | None) -> None:
    room = await seed_room(store, "bench-member", approval_mode="never_ask")
    backend = tool_backend(store)
    lane = RunLane(store)
    samples = Samples()
    counter = StatementCounter(store)
    profiler = cProfile.Profile() if profile else None
    for i in range(WARMUP_TURNS + n):
        measured = i >= WARMUP_TURNS
        admitted = await admit_run(store, lane, backend, room)
        cancelled = asyncio.Event()
        model = FakeModel(tool_steps=1)
        host = RunHost(
            store=store, lane=lane, bundle=admitted.bundle, model_stream=model.stream,
            call_tool=backend.caller(bundle=admitted.bundle, tools=admitted.tools,
                                     cancelled=cancelled),
            publish_live=_no_live, lease=timedelta(seconds=30),
            read_tools=admitted.tools.read_tools,
        )
        manifest = RunManifest(
            bundle=admitted.bundle,
            context=(ChatMessage("system", "You are a benchmark."),
                     ChatMessage("user", "bench turn")),
            catalog=admitted.tools.advertised, catalog_digest=admitted.tools.digest,
            budgets=Budgets(), synthesis=SYNTHESIS,
        )
        controller = TurnController(
            TimedHost(host, model, samples if measured else None, counter), manifest)
        if i == WARMUP_TURNS:
            gc.collect()
        TOOL_CLOCK.take()
        if profiler is not None and measured:
            profiler.enable()
        start, start_cpu = now_ns(), cpu_ns()
        outcome = await controller.run()
        elapsed, elapsed_cpu = now_ns() - start, cpu_ns() - start_cpu
        if profiler is not None and measured:
            profiler.disable()
        if outcome.status is not TerminalStatus.COMPLETED or not controller.settled:
            raise RuntimeError(f"bench turn ended {outcome.status}: {outcome.reason}")
        if measured:
            samples.turn.append(elapsed - model.take() - TOOL_CLOCK.take())
            samples.cpu["turn"].append(elapsed_cpu)
    if profiler is not None and profile:
        profiler.dump_stats(f"{profile}.{db}.prof")

    bare_ns = await bare_async_call_ns()
    bare_us = bare_ns / 1000
    for figure, values in (("model_step", samples.model_step),
                           ("tool_call", samples.tool_call), ("turn", samples.turn)):
        p50 = percentile(values, 50)
        line: dict[str, object] = {
            "bench": BENCH, "db": db, "figure": figure, **summary(values),
            "baseline_p50_us": us(bare_us), "ratio": ratio(p50, bare_us), "n": len(values),
            "cpu_p50_us": us(percentile(samples.cpu[figure], 50)),
            "cpu_p95_us": us(percentile(samples.cpu[figure], 95)),
        }
        if figure == "tool_call":
            target = TARGET_TOOL_CALL_P50_US[db]
            line["target_p50_us"] = target
            line["meets_target"] = p50 <= target
            calls = max(len(values), 1)
            line["transactions_per_call"] = round(counter.transactions / calls, 2)
            line["statements_per_call"] = round(counter.statements / calls, 2)
        emit(line)


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default=None,
                        help="cProfile the measured turns into PATH.<db>.prof")


async def main() -> None:
    args = parse_args(__doc__ or BENCH, default_n=200, extra=_extra)

    async def body(db: str, store: Store) -> None:
        await on_store(db, store, args.n, args.profile)

    await for_each_db(BENCH, args, body)


if __name__ == "__main__":
    run_main(main)
