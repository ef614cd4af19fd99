"""begin/append/finalize/discard: owner-only drafts, receipts, cursors and fences."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from kaizen_plugins import artifacts as plugin

from kaizen_server_extension.store import Store
from kaizen_server_extension.store.artifacts.repository import ArtifactStore
from kaizen_server_extension.store.runs import RunLane
from kaizen_server_extension.tools import MemberSafeError
from kaizen_server_extension.tools.catalog import freeze_catalog
from kaizen_server_extension.tools.registry import ToolRegistry
from tests.artifacts.support import Ctx, bundle_of, live_run, room

STAGED = ("begin_artifact", "append_artifact", "finalize_artifact", "discard_artifact")


async def _ctx(store: Store, member: str = "alice", conv: str | None = None) -> Ctx:
    conv = conv or await room(store, member)
    run = await live_run(store, conv, member)
    return Ctx(bundle_of(run), {"artifacts": ArtifactStore(store)})


async def _refused(call: Any, code: str) -> None:
    with pytest.raises(MemberSafeError) as refused:
        await call
    assert refused.value.code == code, refused.value


async def _append(ctx: Ctx, cursor: dict[str, Any], chunk: str) -> dict[str, Any]:
    result: dict[str, Any] = await plugin.append_artifact.impl(
        ctx, draft_id=cursor["draft_id"], sequence=cursor["sequence"],
        digest=cursor["digest"], chunk=chunk)
    return result


@pytest.mark.rule("R-247", "R-248")
async def test_staged_creation_end_to_end_with_a_converging_replay(store: Store) -> None:
    ctx = await _ctx(store)
    begun = await plugin.begin_artifact.impl(ctx, title="Game", kind="html")
    assert begun["sequence"] == 0
    first = await _append(ctx, begun, "<h1>Hi</h1>\n")
    assert first["sequence"] == 1 and "receipt" in first
    replay = await _append(ctx, begun, "<h1>Hi</h1>\n")  # the same append again
    assert replay["receipt"] == first["receipt"] and replay["replayed"] is True
    assert replay["sequence"] == 1
    second = await _append(ctx, first, "<p>Play</p>\n")
    # A different chunk at an old cursor, a stale sequence, a wrong digest: fail closed.
    await _refused(_append(ctx, begun, "<h1>Other</h1>\n"), "stale_cursor")
    await _refused(_append(ctx, {**second, "sequence": 5}, "x"), "stale_cursor")
    await _refused(_append(ctx, {**second, "digest": "0" * 64}, "x"), "stale_cursor")
    # Finalize verifies the exact cursor.
    await _refused(plugin.finalize_artifact.impl(ctx, draft_id=begun["draft_id"],
                                                 sequence=first["sequence"],
                                                 digest=first["digest"]), "stale_cursor")
    done = await plugin.finalize_artifact.impl(ctx, draft_id=begun["draft_id"],
                                               sequence=second["sequence"],
                                               digest=second["digest"])
    stored = await ArtifactStore(store).resolve("alice", done["artifact_id"])
    assert stored.text() == "<h1>Hi</h1>\n<p>Play</p>\n" and stored.version == 1
    again = await plugin.finalize_artifact.impl(ctx, draft_id=begun["draft_id"],
                                                sequence=second["sequence"],
                                                digest=second["digest"])
    assert again["artifact_id"] == done["artifact_id"]  # converges, no second artifact
    assert len(await ArtifactStore(store).list_for("alice")) == 1
    await _refused(_append(ctx, second, "late"), "draft_closed")


@pytest.mark.rule("R-248", "R-249")
async def test_another_owner_turn_or_fence_cannot_write_the_draft(store: Store) -> None:
    conv = await room(store, "alice", shared=True, members=("bob",))
    ctx = await _ctx(store, "alice", conv)
    begun = await plugin.begin_artifact.impl(ctx, title="Doc", kind="markdown")
    # Another member: the draft does not exist for them.
    bob = Ctx(replace(ctx.bundle, member="bob"), ctx.services)
    await _refused(_append(bob, begun, "x"), "draft_not_found")
    # The same member in another turn.
    other_turn = Ctx(replace(ctx.bundle, run_id="another-run"), ctx.services)
    await _refused(_append(other_turn, begun, "x"), "draft_other_turn")
    # The run was recovered: its fence moved on, the old execution cannot resume writing.
    lane = RunLane(store)
    async with store.transaction() as tx:
        from sqlalchemy import update

        from kaizen_server_extension.store import models as m

        await tx.session.execute(update(m.Run).where(m.Run.id == ctx.bundle.run_id)
                                 .values(fence=m.Run.fence + 1))
    await _refused(_append(ctx, begun, "x"), "draft_fenced")
    newer = Ctx(replace(ctx.bundle, fence=ctx.bundle.fence + 1), ctx.services)
    await _refused(_append(newer, begun, "x"), "draft_fenced")  # not the draft's fence
    # A settled run holds no execution at all.
    await lane.settle(ctx.bundle.run_id, "completed", "done", "alice")
    fresh = await _ctx(store, "alice", conv)
    await _refused(plugin.begin_artifact.impl(
        Ctx(replace(fresh.bundle, fence=fresh.bundle.fence + 7), fresh.services),
        title="x", kind="markdown"), "draft_fenced")
    assert (await _append(fresh, await plugin.begin_artifact.impl(
        fresh, title="ok", kind="markdown"), "fine"))["sequence"] == 1


async def test_discard_closes_the_draft_and_creates_nothing(store: Store) -> None:
    ctx = await _ctx(store)
    begun = await plugin.begin_artifact.impl(ctx, title="Doc", kind="markdown")
    cursor = await _append(ctx, begun, "draft text")
    discarded = await plugin.discard_artifact.impl(ctx, draft_id=begun["draft_id"])
    assert discarded["status"] == "discarded"
    await _refused(_append(ctx, cursor, "more"), "draft_closed")
    await _refused(plugin.finalize_artifact.impl(ctx, draft_id=begun["draft_id"],
                                                 sequence=cursor["sequence"],
                                                 digest=cursor["digest"]), "draft_closed")
    assert await ArtifactStore(store).list_for("alice") == []


@pytest.mark.rule("R-458")
async def test_an_invalid_graph_draft_is_not_materialized(store: Store) -> None:
    ctx = await _ctx(store)
    begun = await plugin.begin_artifact.impl(ctx, title="G", kind="graph")
    cursor = await _append(ctx, begun, '{"nodes": [{"id": "a", "name": "A"}]}')
    await _refused(plugin.finalize_artifact.impl(ctx, draft_id=begun["draft_id"],
                                                 sequence=cursor["sequence"],
                                                 digest=cursor["digest"]), "graph_invalid")
    assert await ArtifactStore(store).list_for("alice") == []


@pytest.mark.rule("R-251")
def test_the_staged_protocol_is_exposed_whole_or_not_at_all() -> None:
    registry = ToolRegistry.from_plugins(load_entrypoints=False)
    groups = {d.name: d.protocol_group for d in registry.descriptors() if d.name in STAGED}
    assert groups == dict.fromkeys(STAGED, plugin.STAGED_PROTOCOL)

    def names(ceiling: set[str]) -> set[str]:
        catalog = freeze_catalog(registry.descriptors(), agent_ceiling=ceiling,
                                 room_shared=False, roster_is_only_initiator=True,
                                 discovery_enabled=False)
        return set(catalog.names) & set(STAGED)

    assert names(set(STAGED)) == set(STAGED)
    assert names({"begin_artifact", "append_artifact"}) == set()  # never a prefix
