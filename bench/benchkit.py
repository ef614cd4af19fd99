"""Shared pieces of the benchmarks: arguments, percentiles, fresh stores, seeded rooms, the
bench tools and the in-process fake model.

Every bench prints one JSON object per line (DESIGN.md: Benchmarks) and measures its own bare
baseline in the same run, because machines are noisy; only ratios compare across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kaizen_server_extension.host.bundle import resource_digest
from kaizen_server_extension.host.tool_backend import FrozenTools, PipelineToolBackend
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.model import (
    StepEvent,
    StepFinished,
    StepSnapshot,
    TextDelta,
    ToolCallEmitted,
    Usage,
)
from kaizen_server_extension.protocol.tools import Capability, ToolCall, WriteCategory
from kaizen_server_extension.store import Store, create_engine, upgrade
from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.store.records import (
    AgentRecord,
    ConversationRecord,
    RunRecord,
)
from kaizen_server_extension.store.runs import Admission, RunLane
from kaizen_server_extension.tools.decorators import tool
from kaizen_server_extension.tools.metrics import ToolMetrics
from kaizen_server_extension.tools.registry import ToolRegistry
from kaizen_server_extension.tools.types import RegisteredTool, RoomClass, ToolContext

DEFAULT_PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
PG_URL_ENV = "KAIZEN_BENCH_DATABASE_URL"
DATABASES = ("sqlite", "postgresql")

BENCH_AGENT = "bench-agent"
READ_TOOL = "bench_read"
WRITE_TOOL = "bench_write"


# --- command line and output -----------------------------------------------------------------


def parse_args(description: str, *, default_n: int, argv: list[str] | None = None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None,
               ) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both",
                        help="which store(s) to measure (default: both)")
    parser.add_argument("--n", type=int, default=default_n,
                        help=f"samples per figure (default: {default_n})")
    parser.add_argument("--pg-url", default=os.environ.get(PG_URL_ENV, DEFAULT_PG_URL),
                        help=f"PostgreSQL URL (default: ${PG_URL_ENV} or {DEFAULT_PG_URL})")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")
    return args


def databases(choice: str) -> tuple[str, ...]:
    return DATABASES if choice == "both" else (choice,)


def emit(figure: Mapping[str, Any]) -> None:
    """One figure, one JSON line, flushed at once so a slow later figure loses nothing."""
    print(json.dumps(dict(figure), sort_keys=False), flush=True)


def skipped(bench: str, db: str, reason: str) -> None:
    emit({"bench": bench, "db": db, "skipped": reason})


# --- timing ------------------------------------------------------------------------------------


def now_ns() -> int:
    return time.perf_counter_ns()


def quantile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100, nearest rank) of ``values``, in their unit; nan if none."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))]


def percentile(samples_ns: Iterable[int], q: float) -> float:
    """The q-th percentile (0..100, nearest-rank) of nanosecond samples, in microseconds."""
    return quantile(samples_ns, q) / 1000


def process_cpu_s(pid: int) -> float:
    """A process's CPU time so far, threads that ended included, from /proc; 0 elsewhere.

    The scheduler's own nanosecond count per live thread (``task/*/schedstat``), not
    ``/proc/PID/stat``'s user + system alone, which moves in clock ticks (10 ms): a per-step
    figure of a few milliseconds needs the finer clock. Threads that ended (a start-up
    thread, say) are only in the process's tick count: what it holds beyond the live
    threads' ticks is added. Falls back to ticks where schedstat is off."""
    tick = os.sysconf("SC_CLK_TCK")
    live_ns = live_ticks = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                ns = int((task / "schedstat").read_text().split()[0])
                ticks = _ticks((task / "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended meanwhile
            live_ns += ns
            live_ticks += ticks
        group_ticks = _ticks(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return 0.0
    if not live_ns:
        return group_ticks / tick
    return live_ns / 1e9 + max(0, group_ticks - live_ticks) / tick


def _ticks(stat: str) -> int:
    """user + system clock ticks of a ``/proc/.../stat`` line."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def us(value: float) -> float:
    """Microseconds, rounded for printing."""
    return round(value, 2)


def ratio(value: float, base: float) -> float | None:
    return round(value / base, 2) if base > 0 else None


def summary(samples_ns: list[int]) -> dict[str, float]:
    return {"p50_us": us(percentile(samples_ns, 50)), "p95_us": us(percentile(samples_ns, 95))}


async def bare_async_call_ns(n: int = 20_000) -> float:
    """p50 of awaiting a bare coroutine function that does nothing, in nanoseconds."""

    async def noop() -> None:
        return None

    samples: list[int] = []
    for _ in range(n):
        start = now_ns()
        await noop()
        samples.append(now_ns() - start)
    return statistics.median(samples)


async def time_calls(call: Callable[[int], Awaitable[object]], n: int, *,
                     warmup: int = 50) -> list[int]:
    """Run ``call(i)`` ``warmup`` times untimed, then ``n`` times, each timed."""
    for i in range(warmup):
        await call(-1 - i)
    gc.collect()
    samples: list[int] = []
    for i in range(n):
        start = now_ns()
        await call(i)
        samples.append(now_ns() - start)
    return samples


# --- stores ------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fresh_store(db: str, pg_url: str) -> AsyncIterator[Store]:
    """A freshly migrated store: a temporary SQLite file, or a new PostgreSQL schema dropped
    afterwards (the way tests/conftest.py does it)."""
    if db == "sqlite":
        with tempfile.TemporaryDirectory(prefix="kaizen-bench-") as root:
            engine = create_engine(sqlite_url_for(Path(root) / "kaizen.db"))
            await upgrade(engine)
            store = Store(engine)
            try:
                yield store
            finally:
                await store.dispose()
        return
    schema = "kzbench_" + uuid.uuid4().hex[:12]
    engine = create_engine(pg_url, schema=schema)
    try:
        await upgrade(engine, schema)
        store = Store(engine)
        try:
            yield store
        finally:
            await store.dispose()
    finally:
        admin = create_engine(pg_url)
        try:
            async with admin.begin() as conn:
                await conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await admin.dispose()


async def postgres_unavailable(pg_url: str) -> str | None:
    """None when PostgreSQL answers, else a short reason (the bench then prints ``skipped``)."""
    engine = create_engine(pg_url)
    try:
        async with asyncio.timeout(5):
            async with engine.connect() as conn:
                await conn.exec_driver_sql("SELECT 1")
        return None
    except Exception as exc:
        return f"postgresql unavailable: {type(exc).__name__}"
    finally:
        await engine.dispose()


async def reachable_databases(bench: str, args: argparse.Namespace) -> list[str]:
    """The selected databases that can be measured; an unreachable PostgreSQL prints its
    ``skipped`` line instead."""
    chosen = []
    for db in databases(args.db):
        if db == "postgresql":
            reason = await postgres_unavailable(args.pg_url)
            if reason is not None:
                skipped(bench, db, reason)
                continue
        chosen.append(db)
    return chosen


async def for_each_db(bench: str, args: argparse.Namespace,
                      body: Callable[[str, Store], Awaitable[None]]) -> None:
    """Run ``body(db, store)`` on a fresh store of each selected database."""
    for db in await reachable_databases(bench, args):
        async with fresh_store(db, args.pg_url) as store:
            await body(db, store)


class StatementCounter:
    """Counts the transactions and SQL statements (BEGIN itself not included) the store runs
    while ``active``: the part of an overhead that does not depend on how loaded the machine
    is."""

    def __init__(self, store: Store) -> None:
        from sqlalchemy import event

        self._active = False
        self._session_transactions = 0
        self._session_statements = 0
        # Transactions run as units straight on the driver (store/units.py) are counted there.
        self._units = store.unit_counts
        self._unit_counted = (0, 0)
        self._unit_start = (0, 0)
        engine = store.engine.sync_engine
        event.listen(engine, "begin", self._on_begin)
        event.listen(engine, "before_cursor_execute", self._on_statement)

    @property
    def active(self) -> bool:
        return self._active

    @active.setter
    def active(self, value: bool) -> None:
        now = (self._units.transactions, self._units.statements)
        if value and not self._active:
            self._unit_start = now
        elif self._active and not value:
            self._unit_counted = (self._unit_counted[0] + now[0] - self._unit_start[0],
                                  self._unit_counted[1] + now[1] - self._unit_start[1])
        self._active = value

    @property
    def transactions(self) -> int:
        return self._session_transactions + self._unit_counted[0]

    @property
    def statements(self) -> int:
        return self._session_statements + self._unit_counted[1]

    def _on_begin(self, conn: Any) -> None:
        if self._active:
            self._session_transactions += 1

    def _on_statement(self, conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if self._active and not statement.lstrip().upper().startswith("BEGIN"):
            self._session_statements += 1


# --- the bench tools ----------------------------------------------------------------------


@dataclass
class ToolClock:
    """Time spent inside the bench tools' own bodies (subtracted from overheads)."""

    spent_ns: int = 0
    calls: int = 0

    def take(self) -> int:
        spent, self.spent_ns = self.spent_ns, 0
        return spent


TOOL_CLOCK = ToolClock()


@tool(name=READ_TOOL, capability=Capability.READ, timeout_s=5,
      room_class=RoomClass.AUDIENCE_SAFE_READ)
async def bench_read(ctx: ToolContext, key: str = "") -> dict[str, Any]:
    """Return a small fixed record for the key (benchmark no-op read)."""
    start = now_ns()
    result = {"key": key, "value": 1}
    TOOL_CLOCK.spent_ns += now_ns() - start
    TOOL_CLOCK.calls += 1
    return result


@tool(name=WRITE_TOOL, capability=Capability.WRITE, timeout_s=5,
      room_class=RoomClass.ACTOR_BOUND_WRITE, write_category=WriteCategory.MEMBER_STORE)
async def bench_write(ctx: ToolContext, key: str, value: int = 0) -> dict[str, Any]:
    """Save a value under the key in the member's own store (benchmark no-op write)."""
    start = now_ns()
    result = {"saved": key, "value": value}
    TOOL_CLOCK.spent_ns += now_ns() - start
    TOOL_CLOCK.calls += 1
    return result


BENCH_TOOLS: tuple[RegisteredTool, ...] = (bench_read, bench_write)


def bench_registry() -> ToolRegistry:
    """A registry holding only the bench tools, registered as a third-party plugin would."""
    registry = ToolRegistry()
    for item in BENCH_TOOLS:
        registry.register(item, owner="kaizen-bench")
    return registry


def tool_backend(store: Store) -> PipelineToolBackend:
    """The real store-backed tool wiring (as app.py builds it), over the bench tools."""
    from prometheus_client import CollectorRegistry

    return PipelineToolBackend(store, bench_registry(), discovery_enabled=False,
                               metrics=ToolMetrics(CollectorRegistry()))


# --- rooms and runs ------------------------------------------------------------------------


@dataclass(frozen=True)
class Room:
    member: str
    agent: AgentRecord
    conversation: ConversationRecord


async def seed_room(store: Store, member: str, *, approval_mode: str = "never_ask") -> Room:
    """A member (with ``approval_mode``), the bench agent and one private conversation."""
    await store.members.ensure(member)
    await store.members.update_settings(member, approval_mode=approval_mode, model=None)
    agent = await store.agents.ensure_system_agent(
        BENCH_AGENT, "Bench", persona="You are a benchmark.", mode="chat",
        tool_ceiling=[t.descriptor.name for t in BENCH_TOOLS])
    conversation = await store.conversations.create(member, agent.id, "bench", shared=False)
    return Room(member, agent, conversation)


@dataclass
class AdmittedRun:
    run: RunRecord
    bundle: AuthorityBundle
    tools: FrozenTools


async def admit_run(store: Store, lane: RunLane, backend: PipelineToolBackend, room: Room,
                    text: str = "bench turn", owner: str = "bench") -> AdmittedRun:
    """Accept an input, claim its run and admit it, as LaneService does before a turn."""
    from datetime import timedelta

    await store.inputs.accept(room.conversation.id, room.member, text, kind="message",
                              idempotency_key=None)
    run = await lane.claim_next(room.conversation.id, owner, timedelta(seconds=30))
    if run is None:
        raise RuntimeError("the bench room has another active run")
    conversation = await store.runs.conversation_of(run.conversation_id)
    tools = backend.freeze(agent=room.agent, conversation=conversation, member=room.member,
                           request_text=text)
    bundle = AuthorityBundle(
        run_id=run.id, conversation_id=run.conversation_id, input_position=run.input_position,
        member=run.member, agent_version_id=room.agent.version_id,
        audience_version=conversation.audience_version,
        resource_digest=resource_digest(conversation, room.agent, tools.digest),
        fence=run.fence,
    )
    admitted = await lane.admit(run.id, run.fence, Admission(
        agent_version_id=room.agent.version_id, audience_version=conversation.audience_version,
        resource_digest=bundle.resource_digest, catalog_digest=tools.digest, model="fake",
    ), {"input_position": run.input_position})
    if not admitted:
        raise RuntimeError("the bench run could not be admitted")
    return AdmittedRun(run, bundle, tools)


# --- the in-process fake model ---------------------------------------------------------------


@dataclass
class FakeModel:
    """A scripted model with no HTTP: steps ``1..tool_steps`` each emit one ``bench_read``
    call, the next step answers with text. Keeps the time spent in its own body."""

    tool_steps: int = 1
    spent_ns: int = 0
    #: perf_counter_ns when the latest step's stream was exhausted.
    last_end_ns: int = 0
    steps: int = 0

    def script(self, step: int) -> list[StepEvent]:
        usage = StepFinished(Usage(prompt_tokens=20, completion_tokens=5), "stop", "fake")
        if step <= self.tool_steps:
            call = ToolCall(f"call-{step}", READ_TOOL, json.dumps({"key": f"k{step}"}))
            return [ToolCallEmitted(call), usage]
        return [TextDelta("Done: "), TextDelta("the bench answer."), usage]

    async def stream(self, snapshot: StepSnapshot) -> AsyncIterator[StepEvent]:
        start = now_ns()
        self.steps += 1
        for event in self.script(snapshot.step):
            self.spent_ns += now_ns() - start
            yield event
            start = now_ns()
        end = now_ns()
        self.spent_ns += end - start
        self.last_end_ns = end

    def take(self) -> int:
        spent, self.spent_ns = self.spent_ns, 0
        return spent


class FakeGateway:
    """``ModelGatewayPort`` for LaneService: every run gets the same script."""

    def __init__(self, tool_steps: int) -> None:
        self.tool_steps = tool_steps

    def stream_step(self, snapshot: StepSnapshot, *,
                    model: str | None = None) -> AsyncIterator[StepEvent]:
        return FakeModel(self.tool_steps).stream(snapshot)


def run_main(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(130)
