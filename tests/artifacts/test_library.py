"""inspect_library / manage_library over the member's own collections and projects."""

from __future__ import annotations

from typing import Any

import pytest
from kaizen_plugins import library as plugin

from kaizen_server_extension.store import Store
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, WriteContext
from kaizen_server_extension.store.library import LibraryStore
from kaizen_server_extension.tools import MemberSafeError
from tests.artifacts.support import Ctx, bundle_of, live_run, room


async def _ctx(store: Store, member: str = "alice") -> Ctx:
    run = await live_run(store, await room(store, member), member)
    return Ctx(bundle_of(run), {"artifacts": ArtifactStore(store)})


async def _manage(ctx: Ctx, **arguments: Any) -> dict[str, Any]:
    result: dict[str, Any] = await plugin.manage_library.impl(ctx, **arguments)
    return result


@pytest.mark.rule("R-141")
async def test_inspect_lists_identity_only_and_only_what_the_member_could_open(
        store: Store) -> None:
    alice, bob = await _ctx(store), await _ctx(store, "bob")
    artifacts, library = ArtifactStore(store), LibraryStore(store)
    mine = await artifacts.create("alice", title="Notes", kind="markdown", content="n")
    await artifacts.create("bob", title="Bob's", kind="markdown", content="b")
    collection = await library.create_collection("alice", "Research")
    listed = await plugin.inspect_library.impl(alice, surface="artifacts")
    assert listed["items"] == [{"id": mine.artifact_id, "name": "Notes",
                                "hint": "markdown, version 1"}]
    assert [i["id"] for i in (await plugin.inspect_library.impl(
        alice, surface="collections"))["items"]] == [collection]
    assert (await plugin.inspect_library.impl(bob, surface="collections"))["items"] == []


@pytest.mark.rule("R-143", "R-144", "R-147", "R-148")
async def test_filing_is_idempotent_and_every_refusal_writes_nothing(store: Store) -> None:
    alice, bob = await _ctx(store), await _ctx(store, "bob")
    artifacts, library = ArtifactStore(store), LibraryStore(store)
    doc = await artifacts.create("alice", title="Doc", kind="markdown", content="d")
    canvas = await artifacts.create("alice", title="App", kind="html", content="<p>")
    theirs = await artifacts.create("bob", title="Theirs", kind="markdown", content="t")
    mine = await library.create_collection("alice", "Mine")
    foreign = await library.create_collection("bob", "Bob's")

    first = await _manage(alice, action="file_into_collection", destination_id=mine,
                          item_id=doc.artifact_id)
    again = await _manage(alice, action="file_into_collection", destination_id=mine,
                          item_id=doc.artifact_id)
    assert (first["changed"], again["changed"]) == (True, False)

    refusals = []
    for destination, item in ((foreign, doc.artifact_id),        # not my collection
                              (mine, theirs.artifact_id),        # an item I cannot see
                              (mine, "0" * 32), ("0" * 32, doc.artifact_id)):  # missing
        with pytest.raises(MemberSafeError) as refused:
            await _manage(alice, action="file_into_collection", destination_id=destination,
                          item_id=item)
        refusals.append((refused.value.code, str(refused.value)))
    assert len(set(refusals)) == 1  # indistinguishable
    with pytest.raises(MemberSafeError) as wrong_kind:
        await _manage(alice, action="file_into_collection", destination_id=mine,
                      item_id=canvas.artifact_id)
    assert wrong_kind.value.code == "library_wrong_kind"
    assert "not a document" in str(wrong_kind.value)
    assert await library.collection_items("alice", mine) == [doc.artifact_id]
    assert await library.collection_items("bob", foreign) == []
    del bob


@pytest.mark.rule("R-145")
async def test_project_links_re_resolve_the_item_and_refuse_a_cycle(store: Store) -> None:
    alice = await _ctx(store)
    shared = await room(store, "bob", shared=True, members=("alice",))
    artifacts, library = ArtifactStore(store), LibraryStore(store)
    in_room = await artifacts.create("bob", title="Shared", kind="html", content="<p>",
                                     where=WriteContext(shared))
    outer = await library.create_project("alice", "Outer")
    inner = await library.create_project("alice", "Inner")
    # A room-visible artifact can be linked (a pointer, not a copy); a canvas is fine here.
    await _manage(alice, action="link_into_project", destination_id=outer,
                  item_id=in_room.artifact_id)
    await _manage(alice, action="link_into_project", destination_id=outer, item_id=inner,
                  item_kind="project")
    for destination, item in ((inner, outer), (outer, outer)):
        with pytest.raises(MemberSafeError) as cycle:
            await _manage(alice, action="link_into_project", destination_id=destination,
                          item_id=item, item_kind="project")
        assert cycle.value.code == "library_cycle"
    assert sorted(await library.project_items("alice", outer)) == sorted(
        [("artifact", in_room.artifact_id), ("project", inner)])
    assert await library.project_items("alice", inner) == []
