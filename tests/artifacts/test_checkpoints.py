"""Streamed update checkpoints: kept on interruption, resumed by the next turn, frozen into
exactly one version; an interrupted create leaves nothing (spec: What happens on a tool call,
Structured artifact output, Write tools and side effects)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from kaizen_plugins import artifacts as plugin
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.lanes.artifact_stream import ArtifactArgumentStream, checkpointed_step
from kaizen_server_extension.models import ModelGateway
from kaizen_server_extension.models.config import GatewayConfig
from kaizen_server_extension.protocol.errors import Conflict, NotFound
from kaizen_server_extension.protocol.model import (
    ChatMessage,
    ModelStepError,
    StepFinished,
    StepSnapshot,
    ToolCallEmitted,
)
from kaizen_server_extension.protocol.tools import AdvertisedTool, Capability
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.checkpoints import CheckpointScope, UpdateCheckpoints
from kaizen_server_extension.store.artifacts.repository import (
    ArtifactStore,
    ArtifactVersionRecord,
    WriteContext,
)
from kaizen_server_extension.store.records import RunRecord
from kaizen_server_extension.store.runs import RunLane
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.artifacts.support import Ctx, bundle_of, live_run, room

#: update_artifact as the frozen catalog declares it.
UPDATE = plugin.update_artifact.descriptor

NEW_TEXT = "# Plan\n\nStep one.\nStep two.\n"


def _fragments(arguments: str, size: int = 7) -> list[str]:
    """The argument text cut as a provider streams it: small pieces, keys split mid-word."""
    return [arguments[i:i + size] for i in range(0, len(arguments), size)]


async def _checkpoint_rows(store: Store) -> list[m.ArtifactUpdateCheckpoint]:
    async with store.transaction() as tx:
        return list((await tx.session.execute(select(m.ArtifactUpdateCheckpoint))).scalars())


async def _plan(store: Store) -> tuple[str, ArtifactStore, ArtifactVersionRecord,
                                       UpdateCheckpoints]:
    """A room with alice's "Plan" artifact (version 1) and the checkpoints over it."""
    conversation = await room(store)
    artifacts = ArtifactStore(store)
    made = await artifacts.create("alice", title="Plan", kind="markdown", content="# Plan\n",
                                  where=WriteContext(conversation))
    return conversation, artifacts, made, UpdateCheckpoints(store, artifacts)


async def _settle(store: Store, run: RunRecord, status: str = "failed") -> None:
    assert await RunLane(store).settle(run.id, status, "test", "system", fence=run.fence)


@pytest.mark.rule("R-245", "R-444")
async def test_an_interrupted_update_keeps_its_checkpoint_and_the_retry_freezes_it_once(
        store: Store) -> None:
    conversation, artifacts, made, checkpoints = await _plan(store)
    first = await live_run(store, conversation)
    stream = ArtifactArgumentStream(checkpoints, owner="alice", conversation_id=conversation,
                                    run_id=first.id)
    arguments = json.dumps({"artifact_id": made.artifact_id, "content": NEW_TEXT})
    pieces = _fragments(arguments)
    cut = len(pieces) - 3  # the stream dies before the closing pieces
    for piece in pieces[:cut]:
        await stream.fragment("call_1", "update_artifact", piece)
    held = stream.checkpoint("call_1")
    assert held is not None and held.arguments == "".join(pieces[:cut])
    await stream.interrupted()

    (row,) = await _checkpoint_rows(store)
    assert (row.id, row.status, row.owner, row.run_id, row.call_id) == (
        held.checkpoint_id, "interrupted", "alice", first.id, "call_1")
    assert row.arguments == "".join(pieces[:cut])
    assert await artifacts.versions("alice", made.artifact_id) == [1]  # nothing published
    assert [c.checkpoint_id for c in await checkpoints.unfinished("alice", conversation)] == [
        held.checkpoint_id]
    await _settle(store, first)

    # The next turn retries the update: the same row is resumed and frozen, one new version.
    second = await live_run(store, conversation, text="please finish that")
    ctx = Ctx(bundle_of(second), {"artifacts": artifacts})
    result = await plugin.update_artifact.impl(ctx, artifact_id=made.artifact_id,
                                               content=NEW_TEXT)
    assert result["version"] == 2 and result["resumed_checkpoint"] == held.checkpoint_id
    assert await artifacts.versions("alice", made.artifact_id) == [1, 2]
    assert (await artifacts.resolve("alice", made.artifact_id)).text() == NEW_TEXT
    (row,) = await _checkpoint_rows(store)
    assert (row.id, row.status, row.frozen_version, row.run_id) == (
        held.checkpoint_id, "frozen", 2, second.id)
    assert row.fence == held.fence + 1
    assert await checkpoints.unfinished("alice", conversation) == []


@pytest.mark.rule("R-245")
async def test_a_completed_stream_freezes_its_own_row_without_an_extra_version(
        store: Store) -> None:
    conversation = await room(store)
    artifacts = ArtifactStore(store)
    made = await artifacts.create("alice", title="Plan", kind="markdown", content="# Plan\n",
                                  where=WriteContext(conversation))
    run = await live_run(store, conversation)
    stream = ArtifactArgumentStream(UpdateCheckpoints(store, artifacts), owner="alice",
                                    conversation_id=conversation, run_id=run.id)
    arguments = json.dumps({"artifact_id": made.artifact_id, "content": NEW_TEXT})
    for piece in _fragments(arguments):
        await stream.fragment("call_1", "update_artifact", piece)
    held = stream.checkpoint("call_1")
    assert held is not None and held.arguments == arguments
    ctx = Ctx(bundle_of(run), {"artifacts": artifacts})
    result = await plugin.update_artifact.impl(ctx, **json.loads(stream.arguments("call_1")))
    assert result["version"] == 2 and "resumed_checkpoint" not in result
    assert await artifacts.versions("alice", made.artifact_id) == [1, 2]
    (row,) = await _checkpoint_rows(store)
    assert (row.id, row.status, row.frozen_version) == (held.checkpoint_id, "frozen", 2)
    # The stream's later fragments are fenced out once completion took the row over.
    with pytest.raises(Conflict):
        await UpdateCheckpoints(store).advance(
            CheckpointScope("alice", conversation, run.id, "call_1"), held.checkpoint_id,
            held.fence, "late")


@pytest.mark.rule("R-444")
async def test_only_the_fenced_holder_advances_a_checkpoint(store: Store) -> None:
    conversation = await room(store, members=())
    await store.members.ensure("bob")
    artifacts = ArtifactStore(store)
    made = await artifacts.create("alice", title="Plan", kind="markdown", content="# Plan\n",
                                  where=WriteContext(conversation))
    checkpoints = UpdateCheckpoints(store, artifacts)
    run = await live_run(store, conversation)
    holder = CheckpointScope("alice", conversation, run.id, "call_1")
    opened = await checkpoints.open(holder, made.artifact_id)
    await checkpoints.advance(holder, opened.checkpoint_id, opened.fence, '{"content": "a')
    intruders = [
        (CheckpointScope("bob", conversation, run.id, "call_1"), opened.fence),
        (CheckpointScope("alice", conversation, "another-run", "call_1"), opened.fence),
        (CheckpointScope("alice", conversation, run.id, "call_2"), opened.fence),
        (holder, opened.fence + 1),
    ]
    for scope, fence in intruders:
        with pytest.raises(Conflict):
            await checkpoints.advance(scope, opened.checkpoint_id, fence, "X")
        with pytest.raises(Conflict):
            await checkpoints.interrupt(scope, opened.checkpoint_id, fence)
    (row,) = await _checkpoint_rows(store)
    assert (row.arguments, row.status) == ('{"content": "a', "building")
    # A live turn's building row is not taken by another turn while that turn is active.
    with pytest.raises(Conflict):
        await checkpoints.open(CheckpointScope("alice", conversation, "other-run", "c"),
                               made.artifact_id)
    # bob cannot open a checkpoint on alice's artifact at all: it is not his to resolve.
    with pytest.raises(NotFound):
        await checkpoints.open(CheckpointScope("bob", conversation, run.id, "c"),
                               made.artifact_id)
    assert len(await _checkpoint_rows(store)) == 1


@pytest.mark.rule("R-445")
async def test_a_crashed_turns_building_row_is_resumed_by_the_next_turn(store: Store) -> None:
    conversation, artifacts, made, checkpoints = await _plan(store)
    first = await live_run(store, conversation)
    opened = await checkpoints.open(CheckpointScope("alice", conversation, first.id, "c1"),
                                    made.artifact_id)
    # The process dies mid-stream: nobody interrupts the row; recovery settles the run.
    await _settle(store, first)
    assert await checkpoints.interrupt_run(first.id) == 1
    second = await live_run(store, conversation)
    record, frozen = await checkpoints.freeze(
        CheckpointScope("alice", conversation, second.id, "c2"), made.artifact_id,
        content=NEW_TEXT, expected_version=1)
    assert (frozen.checkpoint_id, frozen.resumed, record.version) == (
        opened.checkpoint_id, True, 2)
    assert await artifacts.versions("alice", made.artifact_id) == [1, 2]


@pytest.mark.rule("R-109", "R-111")
async def test_an_interrupted_create_leaves_no_checkpoint_and_no_artifact(
        store: Store) -> None:
    conversation = await room(store)
    run = await live_run(store, conversation)
    stream = ArtifactArgumentStream(UpdateCheckpoints(store), owner="alice",
                                    conversation_id=conversation, run_id=run.id)
    # Early fragments that look ordinary; a later duplicate key could still change them.
    arguments = json.dumps({"title": "Plan", "kind": "markdown", "content": NEW_TEXT})
    for piece in _fragments(arguments)[:-2]:
        await stream.fragment("call_1", "create_artifact", piece)
    assert stream.checkpoint("call_1") is None
    await stream.interrupted()
    assert await _checkpoint_rows(store) == []
    async with store.transaction() as tx:
        assert (await tx.session.execute(
            select(func.count()).select_from(m.Artifact))).scalar_one() == 0


async def test_a_stream_naming_a_foreign_artifact_opens_nothing(store: Store) -> None:
    conversation = await room(store)
    await store.members.ensure("bob")
    theirs = await ArtifactStore(store).create("bob", title="Bob's", kind="markdown",
                                               content="x\n")
    run = await live_run(store, conversation)
    stream = ArtifactArgumentStream(UpdateCheckpoints(store), owner="alice",
                                    conversation_id=conversation, run_id=run.id)
    for piece in _fragments(json.dumps({"artifact_id": theirs.artifact_id, "content": "y"})):
        await stream.fragment("call_1", "update_artifact", piece)
    assert stream.checkpoint("call_1") is None
    assert await _checkpoint_rows(store) == []


async def test_the_database_allows_one_open_checkpoint_per_artifact(store: Store) -> None:
    conversation = await room(store)
    made = await ArtifactStore(store).create("alice", title="Plan", kind="markdown",
                                             content="# Plan\n")
    now = datetime.now(UTC)

    def row(ident: str, status: str = "building",
            frozen: int | None = None) -> m.ArtifactUpdateCheckpoint:
        return m.ArtifactUpdateCheckpoint(
            id=ident, owner="alice", conversation_id=conversation,
            artifact_id=made.artifact_id, base_version=1, run_id="r", call_id="c", fence=1,
            arguments="", status=status, frozen_version=frozen, created_at=now,
            updated_at=now)

    async with store.transaction() as tx:
        tx.session.add(row("one"))
        tx.session.add(row("done", "frozen", 2))  # frozen rows are history: any number
    for forged in (row("two", "interrupted"), row("bad", "frozen", None)):
        with pytest.raises(IntegrityError):
            async with store.transaction() as tx:
                tx.session.add(forged)
    assert sorted(r.id for r in await _checkpoint_rows(store)) == ["done", "one"]


@pytest.mark.rule("R-245", "R-444")
async def test_a_provider_stream_cut_mid_update_is_checkpointed_and_the_next_turn_resumes(
        store: Store) -> None:
    """Over real HTTP: the gateway streams update_artifact's argument fragments, the lane's
    observer keeps the cut call's building row, and the next turn completes that same row."""
    conversation = await room(store)
    artifacts = ArtifactStore(store)
    made = await artifacts.create("alice", title="Plan", kind="markdown", content="# Plan\n",
                                  where=WriteContext(conversation))
    content = "# Plan\n\n" + "".join(f"Step {i}: do the thing.\n" for i in range(40))
    arguments = json.dumps({"artifact_id": made.artifact_id, "content": content})
    call = {"id": "call_up", "name": "update_artifact", "arguments": arguments, "fragments": 8}
    # Chunks: role, the call's id and name, then its 8 argument pieces: cut after 4 pieces.
    fake = FakeOpenAI([{"responses": [{"attempts": [
        {"tool_calls": [call], "cut_after_chunks": 6}, {"tool_calls": [call]}]}]}])
    gateway = ModelGateway(GatewayConfig(base_url=fake.base_url, model="fake-model",
                                         api_key=None, connect_timeout=2.0, read_timeout=5.0))
    update_tool = AdvertisedTool(name="update_artifact", description="Update an artifact.",
                                 parameters={"type": "object"}, capability=Capability.WRITE)
    snapshot = StepSnapshot(step=0, messages=(ChatMessage(role="user", content="update"),),
                            tools=(update_tool,))
    try:
        first = await live_run(store, conversation)
        with pytest.raises(ModelStepError) as cut:
            async for _ in checkpointed_step(gateway, snapshot, model="fake-model", store=store,
                                             owner="alice", conversation_id=conversation,
                                             run_id=first.id, update_tool=UPDATE):
                pass
        assert cut.value.code == "provider_stream_interrupted"
        (row,) = await _checkpoint_rows(store)
        assert (row.status, row.owner, row.run_id, row.call_id) == (
            "interrupted", "alice", first.id, "call_up")
        assert row.arguments and arguments.startswith(row.arguments)
        assert row.arguments != arguments
        assert await artifacts.versions("alice", made.artifact_id) == [1]
        await _settle(store, first)

        second = await live_run(store, conversation, text="please finish that")
        events = [e async for e in checkpointed_step(
            gateway, snapshot, model="fake-model", store=store, owner="alice",
            conversation_id=conversation, run_id=second.id, update_tool=UPDATE)]
        # The controller sees only ordinary events: the one complete call, then the finish.
        assert [type(e) for e in events] == [ToolCallEmitted, StepFinished]
        emitted = events[0]
        assert isinstance(emitted, ToolCallEmitted) and emitted.call.arguments == arguments
        (row,) = await _checkpoint_rows(store)
        assert (row.status, row.run_id, row.arguments) == ("building", second.id, arguments)
        ctx = Ctx(bundle_of(second), {"artifacts": artifacts})
        result = await plugin.update_artifact.impl(ctx, **json.loads(emitted.call.arguments))
        assert result["version"] == 2
        (frozen,) = await _checkpoint_rows(store)
        assert (frozen.id, frozen.status, frozen.frozen_version) == (row.id, "frozen", 2)
        assert await artifacts.versions("alice", made.artifact_id) == [1, 2]
    finally:
        await gateway.aclose()
        fake.close()


async def test_a_step_that_does_not_advertise_update_artifact_opens_nothing(
        store: Store) -> None:
    conversation = await room(store)
    made = await ArtifactStore(store).create("alice", title="Plan", kind="markdown",
                                             content="# Plan\n",
                                             where=WriteContext(conversation))
    arguments = json.dumps({"artifact_id": made.artifact_id, "content": NEW_TEXT})
    fake = FakeOpenAI([{"responses": [{"tool_calls": [
        {"id": "call_up", "name": "update_artifact", "arguments": arguments,
         "fragments": 4}], "cut_after_chunks": 4}]}])
    gateway = ModelGateway(GatewayConfig(base_url=fake.base_url, model="fake-model",
                                         api_key=None, connect_timeout=2.0, read_timeout=5.0))
    other = AdvertisedTool(name="read_artifact", description="Read an artifact.",
                           parameters={"type": "object"}, capability=Capability.READ)
    snapshot = StepSnapshot(step=0, messages=(ChatMessage(role="user", content="update"),),
                            tools=(other,))
    try:
        run = await live_run(store, conversation)
        with pytest.raises(ModelStepError):
            async for _ in checkpointed_step(gateway, snapshot, model="fake-model", store=store,
                                             owner="alice", conversation_id=conversation,
                                             run_id=run.id, update_tool=UPDATE):
                pass
        assert await _checkpoint_rows(store) == []
    finally:
        await gateway.aclose()
        fake.close()


async def test_a_settled_call_that_wrote_nothing_is_not_listed_as_unfinished(
        store: Store) -> None:
    conversation, _artifacts, made, checkpoints = await _plan(store)
    run = await live_run(store, conversation)
    opened = await checkpoints.open(CheckpointScope("alice", conversation, run.id, "c1"),
                                    made.artifact_id)
    assert [c.checkpoint_id for c in await checkpoints.unfinished("alice", conversation)] == [
        opened.checkpoint_id]  # its turn is still running
    # The stream completed but the call was declined; the turn then completed normally.
    await _settle(store, run, "completed")
    assert await checkpoints.unfinished("alice", conversation) == []
    # The row is still the one the next update reuses: never a second open row.
    later = await live_run(store, conversation)
    _, frozen = await checkpoints.freeze(
        CheckpointScope("alice", conversation, later.id, "c2"), made.artifact_id,
        content=NEW_TEXT, expected_version=1)
    assert frozen.checkpoint_id == opened.checkpoint_id
