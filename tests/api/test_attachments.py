"""A message's attached files, end to end: REST acceptance with the artifact rules, the pinned
list in the run's bundle and audit, and a model's run_code call reading the read-only copies
in a real (jailed) kernel through ``KAIZEN_SHARED_RESOURCES_*``."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from sqlalchemy import select

from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, WriteContext
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by, with_server_store
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.server import ServerProcess, json_of

T = TypeVar("T")

# A distinctive row: it must never appear anywhere but in the sealed file itself.
CSV = b"region,total\nnorth,12\nZEBRA-ROW-7c1f,30\n"
CSV_V2 = b"region,total\nnorth,99\n"

PROGRAM = """
import errno, hashlib, json, os
out = {"dir": os.environ.get("KAIZEN_SHARED_RESOURCES_DIR"),
       "manifest": json.loads(os.environ.get("KAIZEN_SHARED_RESOURCES_MANIFEST") or "null")}
if out["manifest"]:
    entry = out["manifest"][0]
    out["read_sha256"] = hashlib.sha256(open(entry["path"], "rb").read()).hexdigest()
    try:
        open(os.path.join(out["dir"], "mine.txt"), "w").write("x")
        out["write"] = "written"
    except OSError as exc:
        out["write"] = errno.errorcode[exc.errno]
print("REPORT " + json.dumps(out))
"""

CALL = {"name": "run_code", "arguments": {"code": PROGRAM, "artifact_targets": []}}
SCRIPTS = [
    {"match": "attached figures", "responses": [
        {"tool_calls": [CALL]}, {"text": "I read the attached file."}]},
    {"match": "slowly read", "responses": [
        {"delay_ms": 2500, "tool_calls": [CALL]}, {"text": "Read after a while."}]},
    {"match": "no files", "responses": [
        {"tool_calls": [CALL]}, {"text": "There was nothing attached."}]},
    {"match": "path in the arguments", "responses": [
        # The model names the artifact and a path itself: that grants nothing.
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": PROGRAM, "artifact_targets": [], "resources": ["0123456789abcdef"]}}]},
        {"tool_calls": [CALL]}, {"text": "Nothing was attached."}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="module", params=BACKENDS)
def attach_server(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[
                      tuple[ServerProcess, FakeOpenAI]]:
    root: Path = tmp_path_factory.mktemp(f"attach-{request.param}")
    with FakeOpenAI(SCRIPTS) as fake, served_by(str(request.param), root, fake, {
            "KAIZEN_MODEL": "fake", "KAIZEN_KERNEL_POOL_SIZE": "1"}) as server:
        yield server, fake


def _artifact(server: ServerProcess, owner: str, content: bytes, title: str,
              room: str | None = None) -> str:
    async def create(store: Store) -> str:
        record = await ArtifactStore(store).create(
            owner, title=title, kind="file", content=content, mime="text/csv",
            where=WriteContext(room))
        return record.artifact_id
    return with_server_store(server, create)


def _audit(server: ServerProcess, conversation: str) -> list[tuple[str, Any]]:
    async def read(store: Store) -> list[tuple[str, Any]]:
        async with store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.AuditEvent.action, m.AuditEvent.data)
                .where(m.AuditEvent.conversation_id == conversation)
                .order_by(m.AuditEvent.id))).all()
            return [(str(a), d) for a, d in rows]
    return with_server_store(server, read)


def _input_count(server: ServerProcess, conversation: str) -> int:
    return with_server_store(server, lambda store: store.inputs.count(conversation))


def _report(client: httpx.Client, room: str, run_id: str) -> dict[str, Any]:
    run = _settled(client, run_id, timeout=120)
    assert run["status"] == "completed", run
    settled = [e for e in _events(client, room, run_id)
               if e["type"] == "tool.settled" and e["data"]["name"] == "run_code"]
    assert settled and settled[-1]["data"]["outcome"] == "ok", settled
    body = json.loads(settled[-1]["data"]["content"])
    line = next(x for x in body["stdout"].splitlines() if x.startswith("REPORT "))
    return {"payload": body, **json.loads(line.removeprefix("REPORT "))}


@pytest.mark.rule("R-175", "R-176", "R-454", "R-457")
def test_an_attached_file_reaches_run_code_read_only_and_its_bytes_nowhere_else(
        attach_server: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = attach_server
    with server.client("alice") as alice:
        room = _room(alice)
        artifact = _artifact(server, "alice", CSV, "Q3 sales.csv")
        accepted = _send(alice, room, "sum the attached figures", attachments=[artifact])
        seen = _report(alice, room, accepted["run_id"])
        entry = seen["manifest"][0]
        digest = hashlib.sha256(CSV).hexdigest()
        assert seen["read_sha256"] == digest == entry["sha256"]
        assert (entry["reference_id"], entry["version"], entry["kind"], entry["size"],
                entry["media_type"], entry["filename"]) == (
            artifact, 1, "artifact", len(CSV), "text/csv", "Q3 sales.csv")
        assert entry["path"] == str(Path(seen["dir"]) / "Q3 sales.csv")
        assert seen["write"] == "EROFS"  # the projection is mounted read-only
        # The result (and so the run_code call's audit) carries the bounded list.
        assert seen["payload"]["resources"] == [
            {"reference_id": artifact, "version": 1, "sha256": digest, "size": len(CSV)}]
        # The accepted input shows what was attached; the run audit has the bounded list.
        events = _events(alice, room)
        accepted_event = next(e for e in events if e["type"] == "input.accepted")
        assert [a["reference_id"] for a in accepted_event["data"]["attachments"]] == [artifact]
        audit = _audit(server, room)
        admitted = [d for action, d in audit if action == "run.resources"]
        assert admitted == [{"digest": admitted[0]["digest"], "resources": [
            {"reference_id": artifact, "version": 1, "sha256": digest, "size": len(CSV)}]}]
        # The bytes travelled only through the sealed file: not the journal, the audit,
        # the tool result or anything the model was sent.
        marker = "ZEBRA-ROW-7c1f"
        assert marker not in json.dumps(events)
        assert marker not in json.dumps([d for _, d in audit], default=str)
        assert marker not in json.dumps(fake.requests())


@pytest.mark.rule("R-175", "R-456")
def test_without_attachments_neither_variable_exists_and_arguments_add_nothing(
        attach_server: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, _ = attach_server
    with server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "no files here, run it")
        seen = _report(alice, room, accepted["run_id"])
        assert seen["dir"] is None and seen["manifest"] is None
        assert "resources" not in seen["payload"]
        # The model puts the id in its arguments: a schema error, and nothing is projected.
        artifact = _artifact(server, "alice", CSV, "named.csv")
        scripted = alice.post(f"conversations/{room}/messages",
                              json={"text": f"path in the arguments {artifact}"})
        assert scripted.status_code == 202
        run_id = scripted.json()["run_id"]
        seen = _report(alice, room, run_id)
        assert seen["dir"] is None and seen["manifest"] is None
        calls = [e["data"] for e in _events(alice, room, run_id)
                 if e["type"] == "tool.settled"]
        assert calls[0]["outcome"] == "error" and "resources" in calls[0]["content"]


@pytest.mark.rule("R-455")
def test_a_version_made_after_admission_is_not_served(
        attach_server: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, _ = attach_server
    with server.client("alice") as alice:
        room = _room(alice)
        artifact = _artifact(server, "alice", CSV, "live.csv")
        accepted = _send(alice, room, "slowly read the attached file", attachments=[artifact])
        deadline = time.monotonic() + 30
        while not [e for e in _events(alice, room, accepted["run_id"])
                   if e["type"] == "run.admitted"]:
            assert time.monotonic() < deadline, "the run was not admitted"
            time.sleep(0.05)

        async def revise(store: Store) -> int:
            record = await ArtifactStore(store).update("alice", artifact, content=CSV_V2,
                                                       expected_version=1)
            return record.version
        assert with_server_store(server, revise) == 2  # the latest version changed after admission
        seen = _report(alice, room, accepted["run_id"])
        entry = seen["manifest"][0]
        assert entry["version"] == 1
        assert seen["read_sha256"] == entry["sha256"] == hashlib.sha256(CSV).hexdigest()


def test_unreadable_attachments_are_refused_and_nothing_is_stored(
        attach_server: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, _ = attach_server
    with server.client("alice") as alice, server.client("bob") as bob:
        shared = alice.post("conversations", json={"agent_id": "general", "shared": True})
        room = shared.json()["id"]
        assert alice.post(f"conversations/{room}/participants",
                          json={"member": "bob"}).status_code == 200
        private = _artifact(server, "alice", CSV, "private.csv")
        elsewhere = _room(alice)
        in_room = _artifact(server, "alice", CSV, "room.csv", room=room)
        other_room = _artifact(server, "alice", CSV, "other.csv", room=elsewhere)
        before = _input_count(server, room)
        refusals = {
            "foreign private": private,
            "missing": "0" * 32,
            # Bound to another room (alice's private one): not this exact room.
            "another room": other_room,
        }
        for label, artifact_id in refusals.items():
            response = bob.post(f"conversations/{room}/messages",
                                json={"text": "look", "attachments": [in_room, artifact_id]})
            assert response.status_code == 404, (label, response.text)
            body = json_of(response)
            assert body["error"] == {"code": "attachment_not_found",
                                     "message": "No such artifact."}, label
        assert _input_count(server, room) == before  # nothing was written
        # A file bound to exactly this room is readable by its participant.
        ok = bob.post(f"conversations/{room}/messages",
                      json={"text": "look", "attachments": [in_room]})
        assert ok.status_code == 202, ok.text
        # Bounds and repeats are schema errors.
        for bad in ([in_room, in_room], [f"id-{i}" for i in range(9)], [""]):
            refused = alice.post(f"conversations/{room}/messages",
                                 json={"text": "look", "attachments": bad})
            assert refused.status_code == 422, refused.text
        _settled(bob, ok.json()["run_id"], timeout=60)


def test_an_idempotent_retry_must_repeat_the_same_attachments(
        attach_server: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, _ = attach_server
    with server.client("alice") as alice:
        room = _room(alice)
        first_file = _artifact(server, "alice", CSV, "a.csv")
        second_file = _artifact(server, "alice", CSV_V2, "b.csv")
        body = {"text": "hello", "idempotency_key": "k-attach", "attachments": [first_file]}
        first = alice.post(f"conversations/{room}/messages", json=body)
        again = alice.post(f"conversations/{room}/messages", json=body)
        assert first.status_code == again.status_code == 202
        assert first.json()["input_id"] == again.json()["input_id"]
        changed = alice.post(f"conversations/{room}/messages",
                             json={**body, "attachments": [second_file]})
        assert changed.status_code == 409
        assert json_of(changed)["error"]["code"] == "idempotency_key_reused"
        _settled(alice, first.json()["run_id"], timeout=60)
