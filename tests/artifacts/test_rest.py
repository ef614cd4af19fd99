"""GET artifacts, one artifact, one version and downloads through a real server (API.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from kaizen_server_extension.store.artifacts.content import (
    attest_trusted_result,
    validate_envelope,
)
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, WriteContext
from tests.conftest import with_server_store
from tests.support.server import ServerProcess, json_of

T = TypeVar("T")

ENVELOPE = {"version": 2, "renderer": "table", "title": "Jobs", "text_fallback": "3 jobs",
            "markings": {"overall": "UNCLASSIFIED"}, "provenance": {"cluster": "c1"},
            "result": {"rows": [[1]]}}


def _with_store(server: ServerProcess, work: Callable[[ArtifactStore], Awaitable[T]]) -> T:
    return with_server_store(server, lambda store: work(ArtifactStore(store)))


def _error(response: Any, status: int, code: str | None = None) -> None:
    assert response.status_code == status, response.text
    body = json_of(response)
    assert set(body) == {"error"}
    if code:
        assert body["error"]["code"] == code


def test_owner_and_room_reads_and_404_for_everything_else(server: ServerProcess) -> None:
    with server.client("alice") as alice, server.client("bob") as bob, \
            server.client("carol") as carol:
        for client in (alice, bob, carol):
            assert client.get("agents").status_code == 200  # members exist
        room = alice.post("conversations", json={"agent_id": "general", "shared": True})
        room_id = room.json()["id"]
        assert alice.post(f"conversations/{room_id}/participants",
                          json={"member": "bob"}).status_code == 200

        async def seed(artifacts: ArtifactStore) -> tuple[str, str]:
            shared = await artifacts.create("alice", title="Plan", kind="markdown",
                                            content="# Plan\n", where=WriteContext(room_id))
            await artifacts.update("alice", shared.artifact_id, content="# Plan v2\n",
                                   expected_version=1)
            private = await artifacts.create("alice", title="Diary", kind="html",
                                             content="<script>alert(1)</script>")
            return shared.artifact_id, private.artifact_id

        shared_id, private_id = _with_store(server, seed)

        listed = {a["id"] for a in json_of(alice.get("artifacts"))}
        assert {shared_id, private_id} <= listed
        assert shared_id not in {a["id"] for a in json_of(bob.get("artifacts"))}
        in_room = json_of(bob.get("artifacts", params={"conversation_id": room_id}))
        assert [a["id"] for a in in_room] == [shared_id]
        _error(carol.get("artifacts", params={"conversation_id": room_id}), 404)

        mine = json_of(alice.get(f"artifacts/{shared_id}"))
        assert mine["version"] == 2 and mine["content"] == "# Plan v2\n"
        assert mine["versions"] == [1, 2]
        # bob sees only the version bound to the room he is in, never the later private one.
        theirs = json_of(bob.get(f"artifacts/{shared_id}"))
        assert theirs["version"] == 1 and theirs["versions"] == [1]
        _error(bob.get(f"artifacts/{shared_id}/versions/2"), 404, "artifact_not_found")
        assert json_of(bob.get(f"artifacts/{shared_id}/versions/1"))["content"] == "# Plan\n"

        for path in (f"artifacts/{private_id}", f"artifacts/{private_id}/versions/1",
                     f"artifacts/{private_id}/download",
                     f"artifacts/{private_id}/versions/1/download", "artifacts/nope",
                     f"artifacts/{shared_id}/versions/9"):
            _error(bob.get(path), 404, "artifact_not_found")
        for path in (f"artifacts/{shared_id}", f"artifacts/{shared_id}/download"):
            _error(carol.get(path), 404, "artifact_not_found")

        download = alice.get(f"artifacts/{private_id}/download")
        assert download.status_code == 200
        assert download.content == b"<script>alert(1)</script>"
        # Never rendered in the Jupyter origin: an attachment, plain text, no sniffing.
        assert download.headers["content-type"].startswith("text/plain")
        assert download.headers["content-disposition"].startswith("attachment;")
        assert download.headers["x-content-type-options"] == "nosniff"
        assert bob.get(f"artifacts/{shared_id}/versions/1/download").content == b"# Plan\n"
        for bad in ("0", "x", "-1"):
            _error(alice.get(f"artifacts/{shared_id}/versions/{bad}"), 400, "invalid_version")


@pytest.mark.rule("R-125", "R-126", "R-123")
def test_rename_is_owner_only_and_refused_for_governed(server: ServerProcess) -> None:
    with server.client("alice") as alice, server.client("bob") as bob:
        for client in (alice, bob):
            assert client.get("agents").status_code == 200

        async def seed(artifacts: ArtifactStore) -> tuple[str, str]:
            ordinary = await artifacts.create("alice", title="Old", kind="markdown",
                                              content="x")
            envelope = validate_envelope(ENVELOPE)
            governed = await artifacts.create_governed(
                "alice", envelope, attest_trusted_result("call-1", envelope),
                where=WriteContext())
            return ordinary.artifact_id, governed.artifact_id

        ordinary, governed = _with_store(server, seed)
        _error(bob.patch(f"artifacts/{ordinary}", json={"title": "Mine"}), 404)
        _error(bob.patch(f"artifacts/{governed}", json={"title": "Mine"}), 404,
               "artifact_not_found")  # a foreign governed root does not reveal its type
        _error(alice.patch(f"artifacts/{governed}", json={"title": "Renamed"}), 422,
               "validation_failed")
        _error(alice.patch(f"artifacts/{ordinary}", json={"title": ""}), 422)
        renamed = alice.patch(f"artifacts/{ordinary}", json={"title": "New"})
        assert renamed.status_code == 200 and renamed.json()["title"] == "New"
        assert json_of(alice.get(f"artifacts/{governed}"))["title"] == "Jobs"
        download = alice.get(f"artifacts/{governed}/download")
        assert download.headers["content-type"].startswith("application/json")
        assert download.json() == ENVELOPE  # the inert canonical envelope


def test_rename_sticks_in_reads_listings_and_downloads_and_versions_keep_their_titles(
        server: ServerProcess) -> None:
    """The artifact's current title lives on the artifact: a rename shows in every read,
    listing and download (and to a room participant), the response is what was stored, no
    version is appended, and each version keeps the title it was created with."""
    with server.client("alice") as alice, server.client("bob") as bob:
        for client in (alice, bob):
            assert client.get("agents").status_code == 200
        room_id = alice.post("conversations",
                             json={"agent_id": "general", "shared": True}).json()["id"]
        assert alice.post(f"conversations/{room_id}/participants",
                          json={"member": "bob"}).status_code == 200

        async def seed(artifacts: ArtifactStore) -> str:
            first = await artifacts.create("alice", title="Old", kind="markdown",
                                           content="# one\n", where=WriteContext(room_id))
            await artifacts.update("alice", first.artifact_id, content="# two\n",
                                   expected_version=1, where=WriteContext(room_id))
            return first.artifact_id

        artifact = _with_store(server, seed)
        renamed = alice.patch(f"artifacts/{artifact}", json={"title": "New name"})
        assert renamed.status_code == 200, renamed.text
        body = json_of(renamed)
        assert body["title"] == "New name" and body["version_title"] == "Old"
        assert body["version"] == body["latest_version"] == 2  # no version appended

        view = json_of(alice.get(f"artifacts/{artifact}"))
        assert view["title"] == "New name" and view["versions"] == [1, 2]
        assert view["content"] == "# two\n"
        listed = {a["id"]: a for a in json_of(alice.get("artifacts"))}
        assert listed[artifact]["title"] == "New name"
        in_room = {a["id"]: a for a in json_of(bob.get("artifacts",
                                                       params={"conversation_id": room_id}))}
        assert in_room[artifact]["title"] == "New name"
        for path in (f"artifacts/{artifact}/download",
                     f"artifacts/{artifact}/versions/1/download"):
            download = alice.get(path)
            assert download.headers["content-disposition"] == \
                'attachment; filename="New name.md"', path
        # History: each version keeps the title it was created with.
        first = json_of(alice.get(f"artifacts/{artifact}/versions/1"))
        assert first["title"] == "New name" and first["version_title"] == "Old"

        async def revise(artifacts: ArtifactStore) -> tuple[str, str]:
            record = await artifacts.update("alice", artifact, content="# three\n",
                                            expected_version=2)
            return record.title, record.version_title

        # The next version is created with the current title.
        assert _with_store(server, revise) == ("New name", "New name")
        third = json_of(alice.get(f"artifacts/{artifact}/versions/3"))
        assert third["version_title"] == "New name"
        assert json_of(alice.get(f"artifacts/{artifact}/versions/2"))["version_title"] == "Old"


@pytest.mark.rule("R-117", "R-118", "R-126", "R-164")
def test_fork_copies_exact_bytes_and_refuses_replacement_fields(server: ServerProcess) -> None:
    with server.client("alice") as alice, server.client("bob") as bob, \
            server.client("carol") as carol:
        for client in (alice, bob, carol):
            assert client.get("agents").status_code == 200
        room_id = alice.post("conversations",
                             json={"agent_id": "general", "shared": True}).json()["id"]
        assert alice.post(f"conversations/{room_id}/participants",
                          json={"member": "bob"}).status_code == 200

        async def seed(artifacts: ArtifactStore) -> tuple[str, str]:
            envelope = validate_envelope(ENVELOPE)
            governed = await artifacts.create_governed(
                "alice", envelope, attest_trusted_result("call-1", envelope),
                where=WriteContext(room_id))
            private = await artifacts.create("alice", title="Diary", kind="markdown",
                                             content="# mine\n")
            return governed.artifact_id, private.artifact_id

        governed, private = _with_store(server, seed)
        source = json_of(alice.get(f"artifacts/{governed}/download"))
        # The server is shared by the module's tests, so count what alice had before.
        before = {row["id"] for row in json_of(alice.get("artifacts"))}
        # A copy request cannot bring content, a title or an envelope field.
        for body in ({"content": "{}"}, {"title": "Relabelled"},
                     {"markings": {"overall": "NONE"}}):
            _error(alice.post(f"artifacts/{governed}/fork", json=body), 422, "schema_violation")
        _error(alice.post(f"artifacts/{governed}/fork", content=b"{"), 400, "malformed_json")
        assert {row["id"] for row in json_of(alice.get("artifacts"))} == before  # none written

        # The room collaborator forks the version bound to the room into a root of his own.
        fork = bob.post(f"artifacts/{governed}/fork", params={"conversation_id": room_id})
        assert fork.status_code == 201, fork.text
        copy = fork.json()
        assert copy["owner"] == "bob" and copy["id"] != governed
        assert copy["governed"] and copy["derived_from"] == governed
        assert bob.get(f"artifacts/{copy['id']}/download").json() == source  # exact bytes
        # Still governed: the member metadata routes refuse it.
        _error(bob.patch(f"artifacts/{copy['id']}", json={"title": "Mine"}), 422,
               "validation_failed")
        # One copy per member and exact source version: the second names the first.
        again = bob.post(f"artifacts/{governed}/fork")
        _error(again, 409, "already_derived")
        assert copy["id"] in again.json()["error"]["message"]
        # Anything private to alice, or in a room carol is not in, is 404.
        _error(bob.post(f"artifacts/{private}/fork"), 404, "artifact_not_found")
        _error(carol.post(f"artifacts/{governed}/fork"), 404, "artifact_not_found")
        # The owner's ordinary fork is an editable copy with the same content.
        mine = alice.post(f"artifacts/{private}/fork", json={})
        assert mine.status_code == 201
        assert json_of(alice.get(f"artifacts/{mine.json()['id']}"))["content"] == "# mine\n"
