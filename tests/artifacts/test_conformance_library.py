"""Conformance of inspect_library / manage_library (spec: tools, "The closed built-in registry"):
discovery is identity only, organizing has exactly two destinations, and every model-supplied
id is re-resolved inside the write."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kaizen_plugins import library as plugin

from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.store import Store
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, WriteContext
from kaizen_server_extension.store.library import LibraryStore
from kaizen_server_extension.tools import MemberSafeError
from kaizen_server_extension.tools.registry import ToolRegistry
from kaizen_server_extension.tools.schema import InvalidArguments, validate_arguments
from tests.artifacts.support import Ctx, bundle_of, live_run, room

# A distinctive body: if any of it shows up in a listing, content leaked.
SECRET_BODY = "QUARTERLY-MARGIN-7731 " * 200


async def _ctx(store: Store, member: str = "alice") -> Ctx:
    run = await live_run(store, await room(store, member), member)
    return Ctx(bundle_of(run), {"artifacts": ArtifactStore(store)})


async def _manage(ctx: Ctx, **arguments: Any) -> dict[str, Any]:
    result: dict[str, Any] = await plugin.manage_library.impl(ctx, **arguments)
    return result


@pytest.mark.rule("R-139")
async def test_every_surface_lists_id_name_and_one_short_hint_never_content(
        store: Store) -> None:
    alice = await _ctx(store)
    artifacts, library = ArtifactStore(store), LibraryStore(store)
    doc = await artifacts.create("alice", title="Margins", kind="markdown",
                                 content=SECRET_BODY)
    collection = await library.create_collection("alice", "Finance")
    project = await library.create_project("alice", "Board pack")
    await library.file_into_collection("alice", collection, doc.artifact_id)
    await library.link_into_project("alice", project, "artifact", doc.artifact_id)

    expected_ids = {"artifacts": doc.artifact_id, "collections": collection,
                    "projects": project}
    for surface, expected_id in expected_ids.items():
        listed = await plugin.inspect_library.impl(alice, surface=surface)
        assert listed["surface"] == surface
        (item,) = listed["items"]
        assert set(item) == {"id", "name", "hint"}, item  # identity, nothing else
        assert item["id"] == expected_id
        assert isinstance(item["hint"], str) and 0 < len(item["hint"]) <= 80
        serialized = json.dumps(listed)
        assert "QUARTERLY-MARGIN" not in serialized
        # Membership is content of a collection/project too: no item ids inside them.
        if surface != "artifacts":
            assert doc.artifact_id not in serialized
    assert plugin.inspect_library.descriptor.capability is Capability.READ


@pytest.mark.rule("R-142")
def test_manage_library_has_exactly_two_organizing_actions_and_nothing_else() -> None:
    descriptor = plugin.manage_library.descriptor
    schema = descriptor.input_schema
    assert schema["properties"]["action"]["enum"] == ["file_into_collection",
                                                      "link_into_project"]
    # No field could carry a new name, content, a share target or a connector source.
    assert set(schema["properties"]) == {"action", "destination_id", "item_id", "item_kind"}
    valid = {"action": "file_into_collection", "destination_id": "c", "item_id": "a"}
    validate_arguments(descriptor, json.dumps(valid))
    for forbidden in ("create_collection", "create", "rename", "delete", "reshare", "share",
                      "copy_from_connector"):
        with pytest.raises(InvalidArguments):
            validate_arguments(descriptor, json.dumps(valid | {"action": forbidden}))
    for extra in ({"name": "Renamed"}, {"share_with": "bob"}, {"content": "copied"},
                  {"connector_id": "drive"}):
        with pytest.raises(InvalidArguments):
            validate_arguments(descriptor, json.dumps(valid | extra))
    # The Library surface holds only the discovery read and this organizing write.
    registry = ToolRegistry.from_plugins(load_entrypoints=False)
    library_tools = {d.name: d.capability for d in registry.descriptors()
                     if d.surface == "library"}
    assert library_tools == {"inspect_library": Capability.READ,
                             "manage_library": Capability.WRITE}


@pytest.mark.rule("R-142")
async def test_organizing_creates_renames_deletes_and_copies_nothing(store: Store) -> None:
    alice = await _ctx(store)
    shared = await room(store, "bob", shared=True, members=("alice",))
    artifacts, library = ArtifactStore(store), LibraryStore(store)
    doc = await artifacts.create("alice", title="Doc", kind="markdown", content="d")
    theirs = await artifacts.create("bob", title="Room notes", kind="markdown", content="r",
                                    where=WriteContext(shared))
    collection = await library.create_collection("alice", "Reading")
    project = await library.create_project("alice", "Plan")

    async def library_state() -> tuple[Any, ...]:
        return (await library.inspect("alice", "collections"),
                await library.inspect("alice", "projects"),
                await library.inspect("alice", "artifacts"),
                await library.inspect("bob", "artifacts"))

    before = await library_state()
    await _manage(alice, action="file_into_collection", destination_id=collection,
                  item_id=doc.artifact_id)
    await _manage(alice, action="link_into_project", destination_id=project,
                  item_id=theirs.artifact_id)
    await _manage(alice, action="link_into_project", destination_id=project,
                  item_id=collection, item_kind="collection")
    # Same collections, projects and artifacts, same names and versions: only pointers moved.
    assert await library_state() == before
    # The room artifact is linked as bob's own id, not copied into alice's library.
    assert sorted(await library.project_items("alice", project)) == sorted(
        [("artifact", theirs.artifact_id), ("collection", collection)])
    assert (await artifacts.resolve("bob", theirs.artifact_id)).version == 1


@pytest.mark.rule("R-146")
async def test_ids_are_selectors_re_resolved_inside_the_write(store: Store) -> None:
    """An id the agent learned earlier grants nothing: visibility and the destination's
    ownership are read again by the write itself."""
    alice = await _ctx(store)
    shared = await room(store, "bob", shared=True, members=("alice",))
    artifacts, library = ArtifactStore(store), LibraryStore(store)
    first = await artifacts.create("bob", title="First", kind="markdown", content="1",
                                   where=WriteContext(shared))
    second = await artifacts.create("bob", title="Second", kind="markdown", content="2",
                                    where=WriteContext(shared))
    project = await library.create_project("alice", "Plan")
    collection = await library.create_collection("alice", "Reading")
    bobs_project = await library.create_project("bob", "Bob's plan")

    # While alice sits in the room, both room artifacts are visible to her and linkable.
    await _manage(alice, action="link_into_project", destination_id=project,
                  item_id=first.artifact_id)
    # Bob removes her from the room: the id she still holds no longer selects anything.
    await store.conversations.remove_participant(shared, "bob", "alice")
    refusals = []
    for action, destination, item in (
            ("link_into_project", project, second.artifact_id),
            ("file_into_collection", collection, second.artifact_id),
            # A destination id that is somebody else's is only a selector too.
            ("link_into_project", bobs_project, first.artifact_id)):
        with pytest.raises(MemberSafeError) as refused:
            await _manage(alice, action=action, destination_id=destination, item_id=item)
        refusals.append((refused.value.code, str(refused.value)))
    assert len(set(refusals)) == 1 and refusals[0][0] == "library_not_found"
    # No partial write anywhere.
    assert await library.project_items("alice", project) == [("artifact", first.artifact_id)]
    assert await library.collection_items("alice", collection) == []
    assert await library.project_items("bob", bobs_project) == []
