"""R-002 through a real server on SQLite and PostgreSQL: a plugin agent with a knowledge scope,
driven by the scripted fake model over REST.

The scoped agent's Library tools see only alice's items inside its scope, never bob's private
collection that the scope names; the unscoped General agent, given the same script in the same
server, sees everything alice can open; and alice's own REST view of her Library is unchanged
by any agent's scope.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.repository import ArtifactStore
from kaizen_server_extension.store.core import utcnow
from kaizen_server_extension.store.library import LibraryStore
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by, with_server_store
from tests.lanes.test_turns import _events, _send, _settled
from tests.support.scoped_agent_plugin import (
    ALICES_SCOPED_COLLECTION,
    BOBS_PRIVATE_COLLECTION,
    SCOPED_AGENT,
)
from tests.support.server import ServerProcess

REPO = Path(__file__).resolve().parents[2]
QUESTION = "what is in my notes?"


@dataclass(frozen=True)
class Notes:
    outside_collection: str
    doc_in: str
    doc_out: str
    bobs_doc: str


@pytest.fixture(scope="module", params=BACKENDS)
def scoped(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[tuple[ServerProcess, FakeOpenAI, Notes]]:
    root = tmp_path_factory.mktemp(f"knowledge-scope-{request.param}")
    with FakeOpenAI([{"responses": [{"text": "Hello."}]}]) as fake, \
            served_by(str(request.param), root, fake, extra_env={
                "KAIZEN_PLUGINS": "tests.support.scoped_agent_plugin",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                            os.environ.get("PYTHONPATH")])),
            }) as server:
        notes = with_server_store(server, _notes)
        # The model reads the whole Library surface it is given, and both documents.
        fake.load([{"match": QUESTION, "responses": [
            {"tool_calls": [
                {"name": "inspect_library", "arguments": {"surface": "collections"}},
                {"name": "inspect_library", "arguments": {"surface": "artifacts"}},
                {"name": "read_artifact", "arguments": {"artifact_id": notes.doc_in}},
                {"name": "read_artifact", "arguments": {"artifact_id": notes.doc_out}},
                {"name": "read_artifact", "arguments": {"artifact_id": notes.bobs_doc}}]},
            {"text": "Here is what your notes say."}]}])
        yield server, fake, notes


async def _notes(store: Store) -> Notes:
    """Alice's scoped and outside collections with a document each; bob's private one."""
    for member in ("alice", "bob"):
        await store.members.ensure(member)
    async with store.transaction() as tx:
        for ident, owner, name in ((ALICES_SCOPED_COLLECTION, "alice", "Scoped notes"),
                                   (BOBS_PRIVATE_COLLECTION, "bob", "Bob private")):
            tx.session.add(m.LibraryCollection(id=ident, owner=owner, name=name,
                                               created_at=utcnow()))
    artifacts, library = ArtifactStore(store), LibraryStore(store)
    outside = await library.create_collection("alice", "Outside")
    ids = {}
    for owner, title, collection in (("alice", "Doc in", ALICES_SCOPED_COLLECTION),
                                     ("alice", "Doc out", outside),
                                     ("bob", "Bob's doc", BOBS_PRIVATE_COLLECTION)):
        doc = await artifacts.create(owner, title=title, kind="markdown",
                                     content=f"# {title}\n")
        await library.file_into_collection(owner, collection, doc.artifact_id)
        ids[title] = doc.artifact_id
    return Notes(outside, ids["Doc in"], ids["Doc out"], ids["Bob's doc"])


def _tool_results(server: ServerProcess, agent_id: str) -> list[dict[str, Any]]:
    """Alice asks ``agent_id``; the settled tool calls of that run, as she sees them."""
    with server.client("alice") as alice:
        created = alice.post("conversations", json={"agent_id": agent_id})
        assert created.status_code == 201, created.text
        room = created.json()["id"]
        accepted = _send(alice, room, QUESTION)
        run = _settled(alice, accepted["run_id"])
        assert run["status"] == "completed", run
        return [e["data"] for e in _events(alice, room, accepted["run_id"])
                if e["type"] == "tool.settled"]


def _listed(result: dict[str, Any]) -> set[str]:
    assert result["outcome"] == "ok", result
    return {item["id"] for item in json.loads(result["content"])["items"]}


@pytest.mark.rule("R-002")
def test_a_scoped_agent_over_rest_sees_only_the_members_items_inside_its_scope(
        scoped: tuple[ServerProcess, FakeOpenAI, Notes]) -> None:
    server, _, notes = scoped
    collections, artifacts, doc_in, doc_out, bobs = _tool_results(server, SCOPED_AGENT)
    assert _listed(collections) == {ALICES_SCOPED_COLLECTION}  # not bob's, not "Outside"
    assert _listed(artifacts) == {notes.doc_in}
    assert doc_in["outcome"] == "ok" and "# Doc in" in doc_in["content"]
    # Out of scope and not alice's: the same not-found answer, nothing of either document.
    assert doc_out["outcome"] == bobs["outcome"] == "error"
    assert doc_out["content"] == bobs["content"]
    assert "Doc out" not in doc_out["content"] and "Bob" not in bobs["content"]

    # The unscoped General agent, same script, same server: everything alice can open.
    collections, artifacts, doc_in, doc_out, bobs = _tool_results(server, "general")
    assert _listed(collections) == {ALICES_SCOPED_COLLECTION, notes.outside_collection}
    assert _listed(artifacts) == {notes.doc_in, notes.doc_out}
    assert (doc_in["outcome"], doc_out["outcome"], bobs["outcome"]) == ("ok", "ok", "error")

    # Alice's own REST view is hers, whatever an agent's scope says.
    with server.client("alice") as alice:
        listed = alice.get("collections")
        assert listed.status_code == 200, listed.text
        assert {c["id"] for c in listed.json()} == {ALICES_SCOPED_COLLECTION,
                                                    notes.outside_collection}
        outside = alice.get(f"collections/{notes.outside_collection}/documents").json()
        assert outside["artifact_ids"] == [notes.doc_out]
        assert alice.get(f"collections/{BOBS_PRIVATE_COLLECTION}/documents").status_code \
            == 404
