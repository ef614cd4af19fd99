"""The versioned artifact store on SQLite and PostgreSQL: versions, scopes, the version check."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from kaizen_server_extension.protocol.errors import Conflict, NotFound
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.content import ValidationFailed
from kaizen_server_extension.store.artifacts.repository import (
    ArtifactStore,
    WriteContext,
    content_digest,
)
from kaizen_server_extension.store.core import utcnow
from tests.artifacts.support import live_run, room


async def test_create_appends_version_one_and_its_journal_event(store: Store) -> None:
    conv = await room(store)
    run = await live_run(store, conv)
    artifacts = ArtifactStore(store)
    record = await artifacts.create("alice", title="Notes", kind="markdown", content="# Hi\n",
                                    where=WriteContext(conv, run.id))
    assert (record.version, record.latest_version) == (1, 1)
    assert record.digest == content_digest(b"# Hi\n") and record.size == 5
    assert record.owner == "alice" and record.room_id is None  # a private room
    events = [e for e in await store.journal.read(conv, "alice", limit=100)
              if e.type == "artifact.version"]
    assert len(events) == 1 and events[0].run_id == run.id
    assert events[0].data["artifact_id"] == record.artifact_id
    assert events[0].data["digest"] == record.digest
    assert "content" not in events[0].data


async def test_versions_are_immutable_rows(store: Store) -> None:
    artifacts = ArtifactStore(store)
    await store.members.ensure("alice")
    record = await artifacts.create("alice", title="t", kind="code", content="x = 1\n")
    with pytest.raises(DBAPIError, match="immutable"):
        async with store.transaction() as tx:
            await tx.session.execute(update(m.ArtifactVersion)
                                     .where(m.ArtifactVersion.artifact_id
                                            == record.artifact_id)
                                     .values(content=b"tampered"))
    again = await artifacts.resolve("alice", record.artifact_id, version=1)
    assert again.content == b"x = 1\n"


async def test_update_appends_and_keeps_every_version(store: Store) -> None:
    artifacts = ArtifactStore(store)
    await store.members.ensure("alice")
    first = await artifacts.create("alice", title="t", kind="markdown", content="one")
    second = await artifacts.update("alice", first.artifact_id, content="two",
                                    expected_version=1)
    assert second.version == 2 and second.latest_version == 2
    assert (await artifacts.resolve("alice", first.artifact_id, version=1)).text() == "one"
    assert (await artifacts.resolve("alice", first.artifact_id)).text() == "two"
    assert await artifacts.versions("alice", first.artifact_id) == [1, 2]


@pytest.mark.rule("R-093")
async def test_a_stale_expected_version_is_a_conflict_and_writes_nothing(store: Store) -> None:
    artifacts = ArtifactStore(store)
    await store.members.ensure("alice")
    first = await artifacts.create("alice", title="t", kind="markdown", content="one")
    await artifacts.update("alice", first.artifact_id, content="two", expected_version=1)
    with pytest.raises(Conflict) as refused:
        await artifacts.update("alice", first.artifact_id, content="stale",
                               expected_version=1)
    assert refused.value.status == 409 and refused.value.code == "version_conflict"
    assert await artifacts.count_versions(first.artifact_id) == 2


@pytest.mark.rule("R-093")
async def test_two_updates_racing_on_one_version_one_wins_one_409(store: Store) -> None:
    artifacts = ArtifactStore(store)
    await store.members.ensure("alice")
    first = await artifacts.create("alice", title="t", kind="markdown", content="base")
    for round_ in range(3):
        base = round_ + 1
        results = await asyncio.gather(
            artifacts.update("alice", first.artifact_id, content=f"A{round_}",
                             expected_version=base),
            artifacts.update("alice", first.artifact_id, content=f"B{round_}",
                             expected_version=base),
            return_exceptions=True)
        wins = [r for r in results if not isinstance(r, BaseException)]
        losses = [r for r in results if isinstance(r, BaseException)]
        assert len(wins) == 1 and len(losses) == 1, results
        assert isinstance(losses[0], Conflict) and losses[0].status == 409
        latest = await artifacts.resolve("alice", first.artifact_id)
        assert latest.version == base + 1 and latest.text() == wins[0].text()
    # No lost version: 1 + one winner per round, numbered without gaps.
    assert await artifacts.versions("alice", first.artifact_id) == [1, 2, 3, 4]


@pytest.mark.rule("R-254")
async def test_another_members_artifact_is_not_found_for_read_and_update(
        store: Store) -> None:
    artifacts = ArtifactStore(store)
    await store.members.ensure("alice")
    await store.members.ensure("bob")
    mine = await artifacts.create("alice", title="secret", kind="markdown", content="s")
    for call in (artifacts.resolve("bob", mine.artifact_id),
                 artifacts.update("bob", mine.artifact_id, content="x", expected_version=1),
                 artifacts.resolve("bob", "no-such-id"),
                 artifacts.update("bob", "no-such-id", content="x", expected_version=1)):
        with pytest.raises(NotFound) as refused:
            await call
        assert refused.value.code == "artifact_not_found"  # one answer for both cases
    assert await artifacts.count_versions(mine.artifact_id) == 1


@pytest.mark.rule("R-090")
async def test_room_scope_admits_only_participants_of_the_exact_bound_room(
        store: Store) -> None:
    artifacts = ArtifactStore(store)
    shared = await room(store, "alice", shared=True, members=("bob",))
    await store.members.ensure("carol")
    record = await artifacts.create("alice", title="plan", kind="markdown", content="v1",
                                    where=WriteContext(shared))
    assert record.room_id == shared
    seen = await artifacts.resolve("bob", record.artifact_id)
    assert seen.text() == "v1"
    # A later version written outside the room is not bound to it: bob still sees v1 only.
    await artifacts.update("alice", record.artifact_id, content="private v2",
                           expected_version=1)
    assert (await artifacts.resolve("bob", record.artifact_id)).version == 1
    with pytest.raises(NotFound):
        await artifacts.resolve("bob", record.artifact_id, version=2)
    with pytest.raises(NotFound):
        await artifacts.resolve("carol", record.artifact_id)
    other = await room(store, "bob", shared=True)
    with pytest.raises(NotFound):  # another room of bob's is not the exact reference
        await artifacts.resolve("bob", record.artifact_id, room=other)
    await store.conversations.remove_participant(shared, "alice", "bob")
    with pytest.raises(NotFound):  # removal takes effect at once
        await artifacts.resolve("bob", record.artifact_id)


async def test_listing_is_owner_scoped_or_room_scoped(store: Store) -> None:
    artifacts = ArtifactStore(store)
    shared = await room(store, "alice", shared=True, members=("bob",))
    in_room = await artifacts.create("alice", title="room", kind="markdown", content="r",
                                     where=WriteContext(shared))
    private = await artifacts.create("alice", title="mine", kind="markdown", content="p")
    assert {r.artifact_id for r in await artifacts.list_for("alice")} == {
        in_room.artifact_id, private.artifact_id}
    assert await artifacts.list_for("bob") == []
    assert [r.artifact_id for r in await artifacts.list_for("bob", room=shared)] == [
        in_room.artifact_id]
    await store.members.ensure("carol")
    with pytest.raises(NotFound):
        await artifacts.list_for("carol", room=shared)


async def test_a_failed_write_leaves_no_version_and_no_event(store: Store) -> None:
    conv = await room(store)
    artifacts = ArtifactStore(store)
    with pytest.raises(ValidationFailed):
        await artifacts.create("alice", title="bad", kind="json", content="{not json",
                               where=WriteContext(conv))
    assert await artifacts.list_for("alice") == []
    events = await store.journal.read(conv, "alice", limit=100)
    assert not [e for e in events if e.type == "artifact.version"]


@pytest.mark.rule("R-119", "R-130")
async def test_database_rejects_the_reserved_pair_without_the_attestation_marker(
        store: Store) -> None:
    """What an older replica that cannot stamp the marker would do: a raw INSERT."""
    await store.members.ensure("alice")
    artifacts = ArtifactStore(store)
    root = await artifacts.create("alice", title="t", kind="code", content="{}",
                                  language="json")

    def row(version: int, attestation: str | None) -> dict[str, object]:
        return dict(id=f"v{version}-{root.artifact_id[:8]}", artifact_id=root.artifact_id,
                    version=version, kind="code", language="renderable-artifact", title="t",
                    mime="application/json", content=b"{}", digest="0" * 64, size=2,
                    author="alice", attestation=attestation, created_at=utcnow())

    with pytest.raises(IntegrityError):
        async with store.transaction() as tx:
            await tx.session.execute(insert(m.ArtifactVersion).values(**row(2, None)))
    async with store.transaction() as tx:  # the same row with the marker is accepted
        await tx.session.execute(insert(m.ArtifactVersion).values(**row(2, "kz-attest:v1:x")))
    async with store.transaction() as tx:
        languages = (await tx.session.execute(
            select(m.ArtifactVersion.language)
            .where(m.ArtifactVersion.artifact_id == root.artifact_id)
            .order_by(m.ArtifactVersion.version))).scalars().all()
    assert languages == ["json", "renderable-artifact"]


async def test_ordinary_writes_cannot_use_the_reserved_pair(store: Store) -> None:
    await store.members.ensure("alice")
    artifacts = ArtifactStore(store)
    with pytest.raises(ValidationFailed) as refused:
        await artifacts.create("alice", title="t", kind="code", content="{}",
                               language="renderable-artifact")
    assert refused.value.code == "reserved_artifact_language"
    assert await artifacts.list_for("alice") == []
