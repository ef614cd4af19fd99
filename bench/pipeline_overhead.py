"""Guarded pipeline overhead per READ call and per WRITE call, against calling the tool directly.

Two variants:

* ``memory``: ``ToolPipeline`` over in-memory ports (authority, permissions, approval mode,
  audit): the pure cost of the nine steps, schema validation and projection included;
* ``store``: the real wiring, ``PipelineToolBackend.caller`` over a migrated store (the run
  row re-check, the tool-policy read, the member's approval mode and the audit row are each a
  transaction), on SQLite and/or PostgreSQL.

The member's approval mode is ``never_ask`` and the write tool is a ``member_store`` write,
so no call waits for a decision. The baseline is ``await tool.impl(ctx, **arguments)``.

    .venv/bin/python bench/pipeline_overhead.py [--db sqlite|postgresql|both] [--n N]
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from benchkit import (
    READ_TOOL,
    admit_run,
    bench_read,
    bench_write,
    emit,
    for_each_db,
    parse_args,
    percentile,
    ratio,
    run_main,
    seed_room,
    summary,
    time_calls,
    tool_backend,
    us,
)
from prometheus_client import CollectorRegistry

from kaizen_server_extension.host.tool_backend import RunToolContext
from kaizen_server_extension.policy.approvals import ApprovalMode
from kaizen_server_extension.protocol.authority import AuthorityBundle, verify_bundle
from kaizen_server_extension.protocol.tools import ToolCallRequest, ToolCallResult, ToolOutcome
from kaizen_server_extension.store.runs import RunLane
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.tools.authorization import CallAuthorization
from kaizen_server_extension.tools.metrics import ToolMetrics
from kaizen_server_extension.tools.pipeline import ToolPipeline
from kaizen_server_extension.tools.types import RegisteredTool

BENCH = "pipeline_overhead"
MEMORY_BUNDLE = AuthorityBundle(
    run_id="bench-run", conversation_id="bench-conv", input_position=1, member="bench",
    agent_version_id="bench-agent@1", audience_version=1, resource_digest="bench", fence=1,
)

Caller = Callable[[AuthorityBundle, ToolCallRequest], Awaitable[ToolCallResult]]


# --- in-memory ports ---------------------------------------------------------------------


class _FixedBundle:
    async def verify(self, bundle: AuthorityBundle, prefetched: object = None) -> None:
        verify_bundle(MEMORY_BUNDLE, bundle)


class _NeverAsk:
    async def mode_for(self, member: str, facts: object = None) -> ApprovalMode:
        return ApprovalMode.NEVER_ASK


class _AllowAll:
    async def allowed(self, member: str, tool_name: str, facts: object = None) -> bool:
        return True


class _NullAudit:
    async def record_tool_call(self, bundle: AuthorityBundle, request: ToolCallRequest,
                               outcome: ToolOutcome, raw: object,
                               authorization: CallAuthorization | None = None) -> None:
        return None


async def _only_initiator(bundle: AuthorityBundle, facts: object = None, /) -> bool:
    return True


def memory_caller() -> Caller:
    ctx = RunToolContext(MEMORY_BUNDLE)

    async def execute(tool: RegisteredTool, bundle: AuthorityBundle,
                      arguments: Mapping[str, Any], /) -> object:
        return await tool.impl(ctx, **arguments)

    tools = {t.descriptor.name: t for t in (bench_read, bench_write)}
    pipeline = ToolPipeline(
        tools=tools, ceiling=list(tools), authority=_FixedBundle(),
        permissions=_AllowAll(), approval_modes=_NeverAsk(),
        approvals=None, executor=execute, roster_is_only_initiator=_only_initiator,
        audit=_NullAudit(), metrics=ToolMetrics(CollectorRegistry()),
        cancelled=asyncio.Event(),
    )
    return pipeline.run


# --- measurement -------------------------------------------------------------------------


def _arguments(tool: str, i: int) -> dict[str, Any]:
    # Distinct arguments per call: nothing is a repeat the ledger would refuse or suppress.
    return {"key": f"k{i}"} if tool == READ_TOOL else {"key": f"k{i}", "value": i}


async def measure(caller: Caller, bundle: AuthorityBundle, n: int, *, variant: str,
                  db: str) -> None:
    ctx = RunToolContext(bundle)
    for registered in (bench_read, bench_write):
        name = registered.descriptor.name
        texts = {i: json.dumps(_arguments(name, i)) for i in range(-100, n)}

        async def through_pipeline(i: int, name: str = name,
                                   texts: dict[int, str] = texts) -> None:
            result = await caller(bundle, ToolCallRequest(f"{name}-{i}", name, texts[i], 1))
            if result.outcome is not ToolOutcome.OK:
                raise RuntimeError(f"{name} did not settle ok: {result.content}")

        async def direct(i: int, registered: RegisteredTool = registered) -> None:
            await registered.impl(ctx, **_arguments(registered.descriptor.name, i))

        baseline = await time_calls(direct, n)
        samples = await time_calls(through_pipeline, n)
        base_p50 = percentile(baseline, 50)
        figures = summary(samples)
        emit({
            "bench": BENCH, "variant": variant, "db": db,
            "call": "read" if name == READ_TOOL else "write",
            **figures,
            "baseline_p50_us": us(base_p50),
            "overhead_p50_us": us(figures["p50_us"] - base_p50),
            "ratio": ratio(figures["p50_us"], base_p50),
            "n": n,
        })


async def on_store(db: str, store: Store, n: int) -> None:
    room = await seed_room(store, "bench-member", approval_mode="never_ask")
    backend = tool_backend(store)
    admitted = await admit_run(store, RunLane(store), backend, room)
    caller = backend.caller(bundle=admitted.bundle, tools=admitted.tools,
                            cancelled=asyncio.Event())
    await measure(caller, admitted.bundle, n, variant="store", db=db)


async def main() -> None:
    args = parse_args(__doc__ or BENCH, default_n=1000)
    await measure(memory_caller(), MEMORY_BUNDLE, args.n, variant="memory", db="none")

    async def body(db: str, store: Store) -> None:
        await on_store(db, store, args.n)

    await for_each_db(BENCH, args, body)


if __name__ == "__main__":
    run_main(main)
