"""request_document end to end on SQLite and PostgreSQL: a retrieved chunk id's parent document
is re-resolved and its exact version read by run_code from the read-only projection in a real
kernel; a document id, a chunk id this turn did not retrieve, and another member's chunk are
refused (R-181)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by
from tests.lanes.test_turns import _events, _send, _settled
from tests.support.researcher_agent_plugin import RESEARCHER
from tests.support.server import ServerProcess

REPO = Path(__file__).resolve().parents[2]
REPORT = """
import hashlib, json, os
manifest = json.loads(os.environ.get("KAIZEN_SHARED_RESOURCES_MANIFEST") or "[]")
out = [{"kind": e["kind"], "reference_id": e["reference_id"], "version": e["version"],
        "filename": e["filename"],
        "sha256": hashlib.sha256(open(e["path"], "rb").read()).hexdigest()} for e in manifest]
print("REPORT " + json.dumps(out))
"""
CONTENT = b"region,total\nnorth,12\nheron-row,30\n"


@pytest.fixture(scope="module", params=BACKENDS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[tuple[ServerProcess, FakeOpenAI]]:
    root = tmp_path_factory.mktemp(f"request-document-{request.param}")
    with FakeOpenAI([{"responses": [{"text": "Hello."}]}]) as fake, \
            served_by(str(request.param), root, fake, extra_env={
                "KAIZEN_MODEL": "fake", "KAIZEN_KERNEL_POOL_SIZE": "1",
                "KAIZEN_PLUGINS": "tests.support.researcher_agent_plugin",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                            os.environ.get("PYTHONPATH")])),
            }) as server:
        for member in ("alice", "bob"):
            with server.client(member) as client:
                assert client.get("members/me").status_code == 200
        yield server, fake


def _upload(client: httpx.Client, filename: str, raw: bytes) -> dict[str, Any]:
    response = client.post("documents", json={
        "filename": filename, "content_base64": base64.b64encode(raw).decode()})
    assert response.status_code == 201, response.text
    return dict(response.json())


def _chunk(client: httpx.Client, query: str) -> str:
    hits = client.get("document-search", params={"q": query}).json()["hits"]
    return str(hits[0]["chunk_id"])


@pytest.mark.rule("R-181")
def test_request_document_projects_the_retrieved_chunks_exact_version(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    with server.client("alice") as alice, server.client("bob") as bob:
        doc = _upload(alice, "regions.csv", CONTENT)
        _upload(alice, "other.txt", b"pelican facts, never searched for in the turn\n")
        unretrieved = _chunk(alice, "pelican")
        chunk = _chunk(alice, "heron")
        _upload(bob, "bob.txt", b"bob's heron notes\n")
        room = alice.post("conversations", json={"agent_id": RESEARCHER}).json()["id"]
    question = "analyse the heron rows"

    def one(call: dict[str, Any]) -> dict[str, Any]:
        return {"tool_calls": [call]}

    fake.load([{"match": question, "responses": [
        one({"name": "search", "arguments": {"query": "heron"}}),
        one({"name": "request_document", "arguments": {"chunk_id": doc["id"]}}),
        one({"name": "request_document", "arguments": {"chunk_id": unretrieved}}),
        one({"name": "request_document", "arguments": {"chunk_id": chunk}}),
        one({"name": "run_code", "arguments": {"code": REPORT, "artifact_targets": []}}),
        {"text": "The heron row totals 30."}]},
        {"responses": [{"text": "Hello."}]}])
    with server.client("alice") as alice:
        accepted = _send(alice, room, question)
        run = _settled(alice, accepted["run_id"], timeout=120)
        assert run["status"] == "completed", run
        settled = [e["data"] for e in _events(alice, room, accepted["run_id"])
                   if e["type"] == "tool.settled"]
    searched, by_doc_id, not_retrieved, requested, ran = settled
    assert chunk in searched["content"] and "bob" not in searched["content"]
    # A document id, and a chunk id of hers this turn never retrieved: refused. (Three
    # failures of one tool would close it for the turn, so bob's chunk, refused by the same
    # check and by the store's re-resolution, is tried in tests/store/test_documents.py.)
    for refused in (by_doc_id, not_retrieved):
        assert refused["outcome"] == "error", refused
        assert "bob" not in refused["content"] and "heron-row" not in refused["content"]
    assert requested["outcome"] == "ok", requested["content"]
    assert json.loads(requested["content"])["document_id"] == doc["id"]
    assert ran["outcome"] == "ok", ran
    report = json.loads(json.loads(ran["content"])["stdout"].split("REPORT ", 1)[1])
    assert report == [{"kind": "document", "reference_id": doc["id"], "version": 1,
                       "filename": "regions.csv",
                       "sha256": hashlib.sha256(CONTENT).hexdigest()}]
