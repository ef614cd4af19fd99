"""Turns per second with 50 rooms active at once, through the in-process ``LaneService``.

Each of ``--rooms`` rooms (one member each, approval mode ``never_ask``) gets ``--n`` accepted
inputs; then every room is woken at once and the clock runs until every run has settled. A
turn is three model steps that each call the no-op ``bench_read`` tool through the real
pipeline, then a step that answers with text (the in-process fake model; no HTTP). Accepting
the inputs happens before the clock starts; claiming, admission, the turn and settling are
inside it.

The baseline is the same turns, equally concurrent, run by ``TurnController`` over an
in-memory host (the same pipeline over in-memory ports, no store) in the same run:
``ratio`` is store turns/s divided by baseline turns/s.

    .venv/bin/python bench/turns_throughput.py [--db sqlite|postgresql|both] [--n N]
        [--rooms 50]
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from benchkit import (
    FakeGateway,
    FakeModel,
    emit,
    for_each_db,
    now_ns,
    parse_args,
    run_main,
    seed_room,
    tool_backend,
)
from pipeline_overhead import MEMORY_BUNDLE, memory_caller

from kaizen_server_extension.lanes.service import LaneConfig, LaneService
from kaizen_server_extension.policy.synthesis import SYNTHESIS
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.model import ChatMessage, StepEvent, StepSnapshot
from kaizen_server_extension.protocol.tools import (
    AdvertisedTool,
    Capability,
    ToolCallRequest,
    ToolCallResult,
)
from kaizen_server_extension.runtime.controller import TurnController
from kaizen_server_extension.runtime.port import (
    Budgets,
    RunManifest,
    TerminalOutcome,
    TerminalStatus,
    TraceEvent,
)
from kaizen_server_extension.store.records import EventRecord
from kaizen_server_extension.store.store import Store

BENCH = "turns_throughput"
TOOL_CALLS_PER_TURN = 3
SETTLE_TIMEOUT_S = 300.0


def _no_live(conversation_id: str, kind: str, data: dict[str, Any]) -> None:
    return None


# --- baseline: the controller over an in-memory host -----------------------------------------


class MemoryHost:
    def __init__(self) -> None:
        self._model = FakeModel(tool_steps=TOOL_CALLS_PER_TURN)
        self._call = memory_caller()
        self.events: list[TraceEvent] = []

    def model_step(self, bundle: AuthorityBundle,
                   snapshot: StepSnapshot) -> AsyncIterator[StepEvent]:
        return self._model.stream(snapshot)

    async def call_tool(self, bundle: AuthorityBundle,
                        request: ToolCallRequest) -> ToolCallResult:
        return await self._call(bundle, request)

    async def publish(self, bundle: AuthorityBundle, event: TraceEvent) -> None:
        self.events.append(event)

    async def publish_terminal(self, bundle: AuthorityBundle,
                               outcome: TerminalOutcome) -> bool:
        return True

    async def heartbeat(self, bundle: AuthorityBundle) -> None:
        return None


async def baseline_turns_per_s(rooms: int, turns_per_room: int) -> float:
    from benchkit import bench_read

    d = bench_read.descriptor
    catalog = (AdvertisedTool(d.name, d.description, d.input_schema, Capability.READ),)

    async def room() -> None:
        for _ in range(turns_per_room):
            manifest = RunManifest(
                bundle=MEMORY_BUNDLE,
                context=(ChatMessage("system", "You are a benchmark."),
                         ChatMessage("user", "bench turn")),
                catalog=catalog, catalog_digest="bench", budgets=Budgets(),
                synthesis=SYNTHESIS,
            )
            outcome = await TurnController(MemoryHost(), manifest).run()
            if outcome.status is not TerminalStatus.COMPLETED:
                raise RuntimeError(f"baseline turn ended {outcome.status}: {outcome.reason}")

    start = now_ns()
    await asyncio.gather(*(room() for _ in range(rooms)))
    return rooms * turns_per_room / ((now_ns() - start) / 1e9)


# --- the store-backed lane -----------------------------------------------------------------


async def on_store(db: str, store: Store, rooms: int, turns_per_room: int,
                   baseline: float) -> None:
    seeded = [await seed_room(store, f"member-{i:03d}") for i in range(rooms)]
    gateway = FakeGateway(TOOL_CALLS_PER_TURN)
    lanes = LaneService(
        store=store, tools=tool_backend(store), gateway=lambda: gateway,
        config=LaneConfig(budgets=Budgets(), correction_rules=(), default_model="fake"),
        publish_live=_no_live,
    )
    total = rooms * turns_per_room
    statuses: dict[str, int] = {}
    settled = asyncio.Event()

    def on_appended(events: Sequence[EventRecord]) -> None:
        for event in events:
            if event.type == "run.terminal":
                status = str(event.data.get("status"))
                statuses[status] = statuses.get(status, 0) + 1
                if sum(statuses.values()) >= total:
                    settled.set()

    for room in seeded:
        for t in range(turns_per_room):
            await store.inputs.accept(room.conversation.id, room.member, f"bench turn {t}",
                                      kind="message", idempotency_key=None)
    store.add_listener(on_appended)
    start = now_ns()
    for room in seeded:
        lanes.wake(room.conversation.id)
    try:
        await asyncio.wait_for(settled.wait(), SETTLE_TIMEOUT_S)
    finally:
        elapsed_s = (now_ns() - start) / 1e9
        await lanes.stop()
    turns_per_s = total / elapsed_s
    emit({
        "bench": BENCH, "db": db, "rooms": rooms, "turns": total,
        "tool_calls_per_turn": TOOL_CALLS_PER_TURN,
        "turns_per_s": round(turns_per_s, 2),
        "tool_calls_per_s": round(turns_per_s * TOOL_CALLS_PER_TURN, 2),
        "elapsed_s": round(elapsed_s, 3),
        "completed": statuses.get("completed", 0),
        "baseline_turns_per_s": round(baseline, 2),
        "ratio": round(turns_per_s / baseline, 4) if baseline > 0 else None,
        "n": turns_per_room,
    })


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rooms", type=int, default=50,
                        help="rooms active at once (default 50)")


async def main() -> None:
    args = parse_args(__doc__ or BENCH, default_n=3, extra=_extra)
    baseline = await baseline_turns_per_s(args.rooms, args.n)

    async def body(db: str, store: Store) -> None:
        await on_store(db, store, args.rooms, args.n, baseline)

    await for_each_db(BENCH, args, body)


if __name__ == "__main__":
    run_main(main)
