"""Documents added from the member's Jupyter tree, and what a citation link opens, through REST
against a real server on SQLite and PostgreSQL.

``POST jupyter-documents`` reads the file through the server's ContentsManager (never bytes a
browser sent): text, Markdown, notebooks, PDF and DOCX become a document; adding the same path
again makes the next version of that document, never a second one, and unchanged bytes add
nothing. Bad paths and files (``..``, absolute, hidden, symlinks out of the root, missing,
folders, too large, unsupported or unreadable) are refused with the usual error body and
write nothing. ``GET documents/{id}/versions/{n}/passages`` gives one exact version's passages
with their chunk ids, for the member who may read it and nobody else.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from kaizen_server_extension.document_text import MAX_DOCUMENT_BYTES
from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by
from tests.lanes.test_turns import _events, _send, _settled
from tests.support.contents_authorizer import NO_CONTENTS
from tests.support.server import ServerProcess, start_server

POLICY = "# Travel policy\n\nEconomy class is required for flights under six hours.\n"
NOTEBOOK = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
    {"cell_type": "markdown", "metadata": {}, "id": "m1",
     "source": "# Churn analysis\nChurn fell after the pelican loyalty programme."},
    {"cell_type": "code", "metadata": {}, "id": "c1", "execution_count": None, "outputs": [],
     "source": "churn = orders.groupby('month').size()"}]}


@pytest.fixture(scope="module", params=BACKENDS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[tuple[ServerProcess, FakeOpenAI]]:
    root = tmp_path_factory.mktemp(f"jupyter-documents-{request.param}")
    with FakeOpenAI([{"responses": [{"text": "Hello."}]}]) as fake, \
            served_by(str(request.param), root, fake) as server:
        for member in ("alice", "bob"):  # known members, so they can be added to rooms
            with server.client(member) as client:
                assert client.get("members/me").status_code == 200
        yield server, fake


@pytest.fixture(scope="module")
def tree(served: tuple[ServerProcess, FakeOpenAI],
         tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Jupyter server's root (tests/support/server.py: root_dir) with files to add."""
    root = Path(served[0].env["JUPYTER_DATA_DIR"]).parent
    (root / "notes").mkdir()
    (root / "notes" / "policy.md").write_text(POLICY)
    (root / "notes" / "empty.txt").write_text("   \n")
    (root / "notes" / "broken.ipynb").write_text("{not json")
    (root / "notes" / "tool.exe").write_bytes(b"MZ\x90\x00")
    (root / "analysis.ipynb").write_text(json.dumps(NOTEBOOK))
    (root / ".private").mkdir()
    (root / ".private" / "keys.txt").write_text("secret\n")
    (root / "notes" / ".draft.md").write_text("# Draft\n")
    outside = tmp_path_factory.mktemp("outside")
    (outside / "passwd.txt").write_text("root:x:0:0\n")
    (root / "notes" / "escape.txt").symlink_to(outside / "passwd.txt")
    # Sparse: one byte over a document's bound without writing 10 MiB.
    with (root / "notes" / "huge.txt").open("wb") as big:
        big.truncate(MAX_DOCUMENT_BYTES + 1)
    return root


def _add(client: httpx.Client, path: str, **extra: Any) -> httpx.Response:
    return client.post("jupyter-documents", json={"path": path, **extra})


def _hits(client: httpx.Client, query: str) -> list[dict[str, Any]]:
    response = client.get("document-search", params={"q": query})
    assert response.status_code == 200, response.text
    return list(response.json()["hits"])


def test_a_jupyter_file_becomes_a_document_and_adding_it_again_a_version(
        served: tuple[ServerProcess, FakeOpenAI], tree: Path) -> None:
    server, _ = served
    with server.client("alice") as alice, server.client("bob") as bob:
        first = _add(alice, "notes/policy.md", title="Travel policy")
        assert first.status_code == 201, first.text
        body = first.json()
        document = body["document"]
        assert (body["path"], body["outcome"]) == ("notes/policy.md", "created")
        assert (document["title"], document["filename"], document["media_type"],
                document["version"], document["owner"], document["source_path"],
                document["size"]) == ("Travel policy", "policy.md", "text/markdown", 1,
                                      "alice", "notes/policy.md", len(POLICY))
        assert first.headers["Location"].endswith(f"/kaizen/api/documents/{document['id']}")
        (hit,) = [h for h in _hits(alice, "economy flights")
                  if h["document_id"] == document["id"]]
        assert "six hours" in hit["excerpt"]

        # Unchanged bytes: nothing new.
        again = _add(alice, "notes/policy.md")
        assert again.status_code == 200, again.text
        assert (again.json()["outcome"], again.json()["document"]["id"],
                again.json()["document"]["version"]) == ("unchanged", document["id"], 1)
        # A title with a later add changes nothing: it names the document the first add made.
        retitled = _add(alice, "notes/policy.md", title="Something else")
        assert (retitled.status_code, retitled.json()["document"]["title"]) == (
            200, "Travel policy")

        # Changed on disk: the next version of the same document, the title kept.
        (tree / "notes" / "policy.md").write_text(POLICY.replace("Economy", "Business"))
        changed = _add(alice, "notes/policy.md")
        assert changed.status_code == 201, changed.text
        assert (changed.json()["outcome"], changed.json()["document"]["id"],
                changed.json()["document"]["version"],
                changed.json()["document"]["title"]) == (
            "new_version", document["id"], 2, "Travel policy")
        mine = [d for d in alice.get("documents").json() if d["source_path"] == "notes/policy.md"]
        assert [d["id"] for d in mine] == [document["id"]]  # one document, not a duplicate
        view = alice.get(f"documents/{document['id']}").json()
        assert [v["version"] for v in view["versions"]] == [1, 2]
        assert not [h for h in _hits(alice, "economy") if h["document_id"] == document["id"]]

        # Bob's add of the same path is his own document; alice's stays hers alone.
        (tree / "notes" / "policy.md").write_text(POLICY)
        bobs = _add(bob, "notes/policy.md")
        assert bobs.status_code == 201 and bobs.json()["document"]["id"] != document["id"]
        assert bob.get(f"documents/{document['id']}").status_code == 404

        # Deleted: the next add of the path starts a new document.
        assert alice.delete(f"documents/{document['id']}").status_code == 204
        fresh = _add(alice, "notes/policy.md")
        assert fresh.status_code == 201 and fresh.json()["outcome"] == "created"
        assert fresh.json()["document"]["id"] != document["id"]
        assert fresh.json()["document"]["version"] == 1


def test_notebooks_and_word_files_are_added_like_uploads(
        served: tuple[ServerProcess, FakeOpenAI], tree: Path) -> None:
    import docx

    word = docx.Document()
    word.add_heading("Quarterly review", level=1)
    word.add_paragraph("The kestrel programme met its target.")
    buffer = io.BytesIO()
    word.save(buffer)
    (tree / "review.docx").write_bytes(buffer.getvalue())
    server, _ = served
    with server.client("alice") as alice:
        notebook = _add(alice, "analysis.ipynb")
        assert notebook.status_code == 201, notebook.text
        assert (notebook.json()["document"]["media_type"],
                notebook.json()["document"]["chunks"]) == ("application/x-ipynb+json", 2)
        (cell,) = [h for h in _hits(alice, "pelican loyalty")
                   if h["document_id"] == notebook.json()["document"]["id"]]
        assert cell["locator"].startswith("cell 1 (markdown)")
        review = _add(alice, "review.docx")
        assert review.status_code == 201, review.text
        assert [h["document_id"] for h in _hits(alice, "kestrel")] == [
            review.json()["document"]["id"]]


def test_concurrent_adds_of_one_path_make_one_document(
        served: tuple[ServerProcess, FakeOpenAI], tree: Path) -> None:
    """The source row's key (owner, path) is the database's word: racing first adds of a path
    make one document with one version, the others see it unchanged."""
    (tree / "notes" / "race.md").write_text("# Race\n\nThe heron race starts at noon.\n")
    server, _ = served

    def add() -> httpx.Response:
        with server.client("alice") as alice:
            return _add(alice, "notes/race.md")

    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda _: add(), range(4)))
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 201], [
        a.text for a in answers]
    assert len({a.json()["document"]["id"] for a in answers}) == 1
    with server.client("alice") as alice:
        mine = [d for d in alice.get("documents").json() if d["source_path"] == "notes/race.md"]
    assert [d["version"] for d in mine] == [1]


@pytest.mark.parametrize(("path", "status", "code"), [
    ("../outside.txt", 400, "invalid_path"),
    ("notes/../../etc/passwd.txt", 400, "invalid_path"),
    ("/etc/passwd.txt", 400, "invalid_path"),
    ("~/notes.txt", 400, "invalid_path"),
    ("notes//policy.md", 400, "invalid_path"),
    ("../tool.exe", 400, "invalid_path"),  # the path's rules before its type
    (".private/keys.txt", 403, "hidden_path"),
    ("notes/.draft.md", 403, "hidden_path"),
    ("notes/escape.txt", 403, "outside_root"),
    ("notes/missing.md", 404, "file_not_found"),
    ("notes", 422, "unsupported_document"),  # no suffix: not a document type, not read
    ("notes.md", 404, "file_not_found"),
    ("notes/huge.txt", 413, "file_too_large"),
    ("notes/tool.exe", 422, "unsupported_document"),
    ("notes/empty.txt", 422, "document_empty"),
    ("notes/broken.ipynb", 422, "document_unreadable"),
], ids=lambda v: str(v))
def test_bad_paths_and_files_are_refused_and_write_nothing(
        served: tuple[ServerProcess, FakeOpenAI], tree: Path, path: str, status: int,
        code: str) -> None:
    server, _ = served
    with server.client("bob") as bob:
        before = bob.get("documents").json()
        refused = _add(bob, path)
        assert refused.status_code == status, refused.text
        error = refused.json()["error"]
        assert error["code"] == code, error
        # Member-safe: no server path or exception text in the sentence.
        assert str(tree) not in error["message"] and "Traceback" not in error["message"]
        if code == "file_too_large":
            assert "10.0 MiB" in error["message"] and "document" in error["message"]
        assert bob.get("documents").json() == before


def test_a_folder_with_a_document_suffix_is_not_a_file(
        served: tuple[ServerProcess, FakeOpenAI], tree: Path) -> None:
    (tree / "looks-like.md").mkdir()
    server, _ = served
    with server.client("bob") as bob:
        before = bob.get("documents").json()
        refused = _add(bob, "looks-like.md")
        assert (refused.status_code, refused.json()["error"]["code"]) == (400, "not_a_file")
        assert bob.get("documents").json() == before


@pytest.mark.parametrize("body", [{}, {"path": 7}, {"path": "a.md", "extra": 1},
                                  {"path": "a.md", "title": ""}], ids=str)
def test_a_malformed_body_is_a_schema_violation(
        served: tuple[ServerProcess, FakeOpenAI], body: dict[str, Any]) -> None:
    server, _ = served
    with server.client("bob") as bob:
        refused = bob.post("jupyter-documents", json=body)
        assert (refused.status_code, refused.json()["error"]["code"]) == (
            422, "schema_violation")


def test_a_versions_passages_open_for_readers_only_and_the_source_stays_the_owners(
        served: tuple[ServerProcess, FakeOpenAI], tree: Path) -> None:
    (tree / "notes" / "otters.md").write_text(
        "# Otters\n\nOtters hold hands while sleeping.\n\n" + "filler line\n" * 150
        + "# Beavers\n\nBeavers build dams from willow.\n")
    server, _ = served
    with server.client("alice") as alice, server.client("bob") as bob:
        document = _add(alice, "notes/otters.md").json()["document"]
        (hit,) = [h for h in _hits(alice, "beavers willow")
                  if h["document_id"] == document["id"]]
        opened = alice.get(f"documents/{document['id']}/versions/1/passages")
        assert opened.status_code == 200, opened.text
        body = opened.json()
        assert (body["title"], body["version"], body["current_version"],
                body["source_path"]) == ("otters.md", 1, 1, "notes/otters.md")
        assert [p["ordinal"] for p in body["passages"]] == list(range(len(body["passages"])))
        (cited,) = [p for p in body["passages"] if p["chunk_id"] == hit["chunk_id"]]
        assert "willow" in cited["text"] and cited["locator"] == hit["locator"]

        # Another member: the same 404 as a document that never existed.
        assert bob.get(f"documents/{document['id']}/versions/1/passages").status_code == 404
        room = alice.post("conversations", json={"agent_id": "general", "shared": True})
        room_id = room.json()["id"]
        assert alice.post(f"conversations/{room_id}/participants",
                          json={"member": "bob"}).status_code in (200, 201)
        assert alice.put(f"documents/{document['id']}/shares/{room_id}").status_code == 200
        shared = bob.get(f"documents/{document['id']}/versions/1/passages")
        assert shared.status_code == 200 and shared.json()["source_path"] is None
        assert bob.get(f"documents/{document['id']}").json()["source_path"] is None

        # An earlier version's passages still open after a new one.
        (tree / "notes" / "otters.md").write_text("# Otters\n\nOtters eat sea urchins.\n")
        assert _add(alice, "notes/otters.md").json()["document"]["version"] == 2
        old = alice.get(f"documents/{document['id']}/versions/1/passages").json()
        assert hit["chunk_id"] in [p["chunk_id"] for p in old["passages"]]
        assert old["current_version"] == 2

        for version, status, code in (("3", 404, "version_not_found"),
                                      ("0", 400, "invalid_version"),
                                      ("x", 400, "invalid_version")):
            refused = alice.get(f"documents/{document['id']}/versions/{version}/passages")
            assert (refused.status_code, refused.json()["error"]["code"]) == (status, code)
        assert alice.delete(f"documents/{document['id']}").status_code == 204
        gone = bob.get(f"documents/{document['id']}/versions/1/passages")
        assert (gone.status_code, gone.json()["error"]["code"]) == (404, "document_not_found")


@pytest.mark.rule("R-071")
def test_a_citation_kept_in_an_answer_opens_the_passage_it_cites(
        served: tuple[ServerProcess, FakeOpenAI], tree: Path) -> None:
    """The link the panel renders is the citation the answer kept: its document, version and
    chunk open, through REST, the very passage the turn retrieved."""
    (tree / "lynx.md").write_text("# Lynx\n\nLynx sightings doubled in the northern valley.\n")
    server, fake = served
    with server.client("alice") as alice:
        document = _add(alice, "lynx.md").json()["document"]
        (hit,) = [h for h in _hits(alice, "lynx sightings")
                  if h["document_id"] == document["id"]]
        room = alice.post("conversations", json={"agent_id": "search"}).json()["id"]
    question = "how did lynx sightings change?"
    fake.load([{"match": question, "responses": [
        {"tool_calls": [{"name": "search", "arguments": {"query": "lynx sightings"}}]},
        {"text": f"They doubled {hit['citation']}."}]},
        {"responses": [{"text": "Hello."}]}])
    with server.client("alice") as alice:
        accepted = _send(alice, room, question)
        assert _settled(alice, accepted["run_id"], timeout=60)["status"] == "completed"
        (committed,) = [e["data"] for e in _events(alice, room, accepted["run_id"])
                        if e["type"] == "answer.committed"]
        assert hit["citation"] in committed["text"]
        assert committed.get("citations_removed", 0) == 0
        target = committed["text"].split("](kaizen:document/", 1)[1].split(")", 1)[0]
        document_id, rest = target.split("/v", 1)
        version, chunk = rest.split("#chunk=")
        passages = alice.get(f"documents/{document_id}/versions/{version}/passages").json()
        (cited,) = [p for p in passages["passages"] if p["chunk_id"] == chunk]
        assert "doubled in the northern valley" in cited["text"]


def test_without_the_jupyter_servers_permission_for_its_files_nothing_is_read(
        tmp_path: Path) -> None:
    """The Jupyter server's Authorizer is asked for ``contents`` besides Kaizen's own check: a
    member it refuses adds nothing (the permission is the Jupyter server's, not a database's:
    SQLite only)."""
    root = tmp_path / "server"
    root.mkdir()
    (root / "policy.md").write_text(POLICY)
    server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_args=[
        "--ServerApp.authorizer_class=tests.support.contents_authorizer.NoContentsForCarol"])
    try:
        with server.client(NO_CONTENTS) as carol, server.client("alice") as alice:
            refused = _add(carol, "policy.md")
            assert (refused.status_code, refused.json()["error"]["code"]) == (
                403, "contents_forbidden"), refused.text
            assert carol.get("documents").json() == []
            assert _add(alice, "policy.md").status_code == 201  # the others are unaffected
    finally:
        server.stop()


def test_the_routes_are_in_the_openapi_document(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, _ = served
    with server.client("alice") as alice:
        document = alice.get("openapi.json").json()
    paths = document["paths"]
    add = paths["/kaizen/api/jupyter-documents"]["post"]
    assert add["operationId"] == "addJupyterDocument"
    assert {"200", "201", "400", "403", "404", "413", "422"} <= set(add["responses"])
    assert "get" in paths["/kaizen/api/documents/{document_id}/versions/{version}/passages"]
    schemas = document["components"]["schemas"]
    assert "source_path" in schemas["Document"]["properties"]
    assert set(schemas["AddJupyterDocument"]["properties"]) == {"path", "title"}
