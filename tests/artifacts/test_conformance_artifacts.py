"""Artifact-domain conformance: each test tries one spec rule where a member would meet it.

Most tests drive whole turns through a real server answered by the fake OpenAI-compatible
model (one server per backend for the module, a fresh scenario per test) and look at what the
member sees over REST and at what the database holds. Where a rule lives inside the store or a
tool body (the order of an edit's checks, a fenced draft's refusal) the test calls that layer
directly, as ``tests/artifacts/test_tools.py`` does.

The module's server runs with ``AGENT_LOOP_MAX_CYCLES=3`` (so a staged artifact exceeds the
general round budget, R-074) and tool discovery on (so first-step visibility is what the catalog
decides, R-299). Every test sets the approval mode it relies on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kaizen_plugins import artifacts as plugin
from sqlalchemy import select, update

from kaizen_server_extension.lanes.artifact_stream import ArtifactArgumentStream
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.checkpoints import UpdateCheckpoints
from kaizen_server_extension.store.artifacts.content import (
    MAX_TEXT_BYTES,
    attest_trusted_result,
    validate_envelope,
)
from kaizen_server_extension.store.artifacts.drafts import (
    EMPTY_DIGEST,
    DraftScope,
    DraftStore,
    next_digest,
)
from kaizen_server_extension.store.artifacts.edit import content_tag
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, WriteContext
from kaizen_server_extension.store.runs import RunLane
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from kaizen_server_extension.tools import MemberSafeError
from tests.artifacts.support import Ctx, bundle_of, live_run, room
from tests.conftest import BACKENDS, served_by, with_server_store
from tests.support.server import ServerProcess, json_of

TERMINAL = {"completed", "failed", "answer_unavailable", "cancelled"}
# A small general round budget: staged protocol rounds must not draw from it.
MAX_CYCLES = 3
SERVER_ENV = {"AGENT_LOOP_MAX_CYCLES": str(MAX_CYCLES), "AGENT_TOOL_DISCOVERY_ENABLED": "true"}


# --- a real server, shared by the module --------------------------------------------------


@pytest.fixture(scope="module", params=BACKENDS)
def served(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, FakeOpenAI]]:
    root = tmp_path_factory.mktemp(f"artifact-conformance-{request.param}")
    fake = FakeOpenAI([{"responses": [{"text": "Nothing scripted."}]}])
    with fake, served_by(str(request.param), root, fake, SERVER_ENV) as proc:
        yield proc, fake


def _member(client: httpx.Client, approval_mode: str) -> None:
    """Make the member exist and fix the approval mode the test relies on."""
    assert client.get("agents").status_code == 200
    saved = client.put("members/me/settings", json={"approval_mode": approval_mode})
    assert saved.status_code == 200, saved.text


def _room(client: httpx.Client, *members: str) -> str:
    created = client.post("conversations", json={"agent_id": "general",
                                                  "shared": bool(members)})
    assert created.status_code == 201, created.text
    room_id = str(created.json()["id"])
    for member in members:
        added = client.post(f"conversations/{room_id}/participants", json={"member": member})
        assert added.status_code == 200, added.text
    return room_id


def _send(client: httpx.Client, room_id: str, text: str) -> str:
    sent = client.post(f"conversations/{room_id}/messages", json={"text": text})
    assert sent.status_code == 202, sent.text
    return str(sent.json()["run_id"])


def _run(client: httpx.Client, run_id: str) -> dict[str, Any]:
    return dict(json_of(client.get(f"runs/{run_id}")))


def _settled(client: httpx.Client, run_id: str, *, approve: bool = False,
             timeout: float = 90) -> dict[str, Any]:
    """Wait for the run's terminal status, approving its pending calls when asked to."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = _run(client, run_id)
        if run["status"] in TERMINAL:
            return run
        if approve:
            for pending in _pending(client, run_id):
                _decide(client, pending["id"], "approve")
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not settle: {_run(client, run_id)}")


def _pending(client: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    listed = json_of(client.get("approvals", params={"status": "pending"}))
    return [a for a in listed if a["run_id"] == run_id]


def _decide(client: httpx.Client, approval_id: str, decision: str) -> None:
    decided = client.post(f"approvals/{approval_id}", json={"decision": decision})
    assert decided.status_code == 200, decided.text


def _wait_for_approval(client: httpx.Client, run_id: str, tool: str,
                       timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = [a for a in _pending(client, run_id) if a["tool"] == tool]
        if waiting:
            return waiting[0]
        assert _run(client, run_id)["status"] not in TERMINAL, _run(client, run_id)
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} never asked about {tool}")


def _journal(client: httpx.Client, room_id: str) -> list[dict[str, Any]]:
    return list(json_of(client.get(f"conversations/{room_id}/journal",
                                   params={"limit": 1000}))["events"])


def _settled_calls(client: httpx.Client, room_id: str, run_id: str) -> dict[str, dict[str, Any]]:
    return {e["data"]["call_id"]: e["data"] for e in _journal(client, room_id)
            if e["type"] == "tool.settled" and e["run_id"] == run_id}


def _call(call_id: str, name: str, arguments: dict[str, Any] | str,
          fragments: int = 3) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments, "fragments": fragments}


def _seed(server: ServerProcess, owner: str, *, title: str, kind: str, content: str,
          room_id: str | None) -> str:
    async def work(store: Store) -> str:
        made = await ArtifactStore(store).create(owner, title=title, kind=kind,
                                                 content=content, where=WriteContext(room_id))
        return made.artifact_id
    return with_server_store(server, work)


def _checkpoints(server: ServerProcess, artifact_id: str) -> list[m.ArtifactUpdateCheckpoint]:
    async def work(store: Store) -> list[m.ArtifactUpdateCheckpoint]:
        async with store.transaction() as tx:
            return list((await tx.session.execute(
                select(m.ArtifactUpdateCheckpoint)
                .where(m.ArtifactUpdateCheckpoint.artifact_id == artifact_id))).scalars())
    return with_server_store(server, work)


# --- an admitted create row gets kind, content, title and language together ---------


@pytest.mark.rule("R-448")
def test_a_created_row_gets_its_kind_and_language_whatever_the_argument_order(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    """The content streams first and kind/language last, and the first attempt is cut after
    one complete call: no row exists until a whole call is admitted, and each admitted row
    carries its final kind, content, title and language from its one insert."""
    server, fake = served
    page = "<!doctype html>\n<h1>Launch</h1>\n<p>Countdown.</p>\n"
    script = "print('launch')\n"
    # Raw argument text in this exact field order: the labels come after the content.
    html_call = _call("call_page", "create_artifact", json.dumps(
        {"content": page, "title": "Launch page", "kind": "html"}))
    code_call = _call("call_code", "create_artifact",
                      '{"content": ' + json.dumps(script) + ', "title": "launch.py", '
                      '"kind": "code", "language": "python"}')
    # Chunks: role, page header, 3 page pieces, code header, code pieces: cut after the first
    # code piece, so the page's object is complete in the cut attempt and the code's is not.
    fake.load([{"match": "make the launch files", "responses": [
        {"attempts": [{"tool_calls": [html_call, code_call], "cut_after_chunks": 7},
                      {"tool_calls": [html_call, code_call]}]},
        {"text": "Both files are made."}]}])
    with server.client("alice") as alice:
        _member(alice, "never_ask")
        room_id = _room(alice)
        run_id = _send(alice, room_id, "make the launch files")
        assert _settled(alice, run_id)["status"] == "completed"

        listed = json_of(alice.get("artifacts", params={"conversation_id": room_id}))
        by_title = {a["title"]: a for a in listed}
        assert sorted(by_title) == ["Launch page", "launch.py"]  # the cut attempt left none
        assert (by_title["Launch page"]["kind"], by_title["Launch page"]["language"],
                by_title["Launch page"]["version"]) == ("html", None, 1)
        assert (by_title["launch.py"]["kind"], by_title["launch.py"]["language"],
                by_title["launch.py"]["version"]) == ("code", "python", 1)
        assert json_of(alice.get(f"artifacts/{by_title['Launch page']['id']}"))["content"] \
            == page
        assert json_of(alice.get(f"artifacts/{by_title['launch.py']['id']}"))["content"] \
            == script
        events = [e["data"] for e in _journal(alice, room_id) if e["type"] == "artifact.version"]
        assert sorted((e["title"], e["kind"], e["language"]) for e in events) == [
            ("Launch page", "html", None), ("launch.py", "code", "python")]

    async def rows(store: Store) -> tuple[list[m.ArtifactVersion], int, int]:
        async with store.transaction() as tx:
            versions = list((await tx.session.execute(
                select(m.ArtifactVersion).where(m.ArtifactVersion.conversation_id == room_id)
            )).scalars())
            drafts = len((await tx.session.execute(
                select(m.ArtifactDraft.id).where(m.ArtifactDraft.conversation_id == room_id)
            )).all())
            checkpoints = len((await tx.session.execute(
                select(m.ArtifactUpdateCheckpoint.id)
                .where(m.ArtifactUpdateCheckpoint.conversation_id == room_id))).all())
        return versions, drafts, checkpoints

    versions, drafts, checkpoints = with_server_store(server, rows)
    # Immutable rows (a trigger refuses UPDATE): what each holds is what its insert wrote.
    assert sorted((v.title, v.kind, v.language, bytes(v.content).decode(), v.version)
                  for v in versions) == [("Launch page", "html", None, page, 1),
                                         ("launch.py", "code", "python", script, 1)]
    assert (drafts, checkpoints) == (0, 0)  # no partial create anywhere


# --- no failed, stopped, malformed or stale edit is durable or shared --------

BUDGET = '{\n  "rent": 1200,\n  "food": 300\n}\n'


@pytest.mark.rule("R-168", "R-094")
def test_no_refused_or_stopped_edit_reaches_any_viewer(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    """In a shared room, alice's agent tries malformed, stale, syntax-breaking and
    unauthorized edits, and one valid edit that the member stops mid-stream: alice and bob
    both keep seeing the committed version, and nothing new is journaled or shared.

    (The pane has no hidden React/Mermaid validation frame: it shows those kinds as source
    text, and ``test_conformance_governed.py`` pins the panel's only frame.)"""
    server, fake = served
    tag = content_tag(BUDGET)
    with server.client("alice") as alice, server.client("bob") as bob, \
            server.client("carol") as carol:
        _member(alice, "never_ask")
        _member(bob, "never_ask")
        _member(carol, "never_ask")
        room_id = _room(alice, "bob")
        budget = _seed(server, "alice", title="Budget", kind="json", content=BUDGET,
                       room_id=room_id)
        carols = _seed(server, "carol", title="Carol's notes", kind="markdown",
                       content="# Mine\n", room_id=None)

        def edit(call_id: str, edits: str, *, target: str = budget, version: int = 1,
                 with_tag: str = tag, fragments: int = 3) -> dict[str, Any]:
            return _call(call_id, "edit_artifact", {"artifact_id": target, "version": version,
                                                    "tag": with_tag, "edits": edits},
                         fragments)

        fake.load([
            {"match": "fix the budget", "responses": [
                {"tool_calls": [edit("malformed", "PUT 2.=2:\nrent is 1300\n")]},
                {"tool_calls": [edit("stale", "PUT 2.=2:\n+  \"rent\": 1300,\n",
                                     with_tag="0000")]},
                {"tool_calls": [edit("syntax", "PUT 2.=2:\n+  \"rent\": ,\n")]},
                {"text": "I could not change the budget."}]},
            {"match": "tidy carol's notes", "responses": [
                {"tool_calls": [edit("foreign", "CUT 1.=1\n", target=carols,
                                     with_tag=content_tag("# Mine\n"))]},
                {"text": "Those notes are not available."}]},
            {"match": "raise the rent", "responses": [
                # A valid patch, streamed slowly enough for the member to stop it.
                {"tool_calls": [edit("stopped", "PUT 2.=2:\n+  \"rent\": 1500,\n",
                                     fragments=12)], "chunk_delay_ms": 400},
                {"text": "Raised."}]},
        ])

        first = _send(alice, room_id, "fix the budget")
        assert _settled(alice, first)["status"] == "completed"
        second = _send(alice, room_id, "tidy carol's notes")
        assert _settled(alice, second)["status"] == "completed"
        settled = _settled_calls(alice, room_id, first) | _settled_calls(alice, room_id, second)
        assert {call: data["outcome"] for call, data in settled.items()} == dict.fromkeys(
            ("malformed", "stale", "syntax", "foreign"), "error")
        for call in ("malformed", "stale", "syntax", "foreign"):
            assert "nothing was saved" in settled[call]["content"].lower() \
                or "was not run" in settled[call]["content"], settled[call]

        third = _send(alice, room_id, "raise the rent")
        deadline = time.monotonic() + 30
        while not any(e["type"] == "model.step.started" and e["run_id"] == third
                      for e in _journal(alice, room_id)):
            assert time.monotonic() < deadline, "the stopped turn never started its step"
            time.sleep(0.05)
        time.sleep(1.0)  # a few of the patch's pieces have streamed
        assert alice.post(f"runs/{third}/cancel").status_code == 202
        assert _settled(alice, third)["status"] == "cancelled"

        # Every viewer still sees the committed version, and only it.
        for viewer in (alice, bob):
            view = json_of(viewer.get(f"artifacts/{budget}",
                                      params={"conversation_id": room_id}))
            assert (view["version"], view["versions"], view["content"]) == (1, [1], BUDGET)
            listed = json_of(viewer.get("artifacts", params={"conversation_id": room_id}))
            assert [(a["id"], a["version"]) for a in listed] == [(budget, 1)]  # no remix
            versions = [e for e in _journal(viewer, room_id) if e["type"] == "artifact.version"]
            assert [(e["data"]["artifact_id"], e["data"]["version"]) for e in versions] == [
                (budget, 1)]
        assert json_of(carol.get(f"artifacts/{carols}"))["versions"] == [1]
        assert all(a["derived_from"] is None for a in json_of(alice.get("artifacts")))
    assert _checkpoints(server, budget) == []  # edits keep no checkpoint either


# --- the next version opens only after the required approval ------------------------


@pytest.mark.rule("R-244")
def test_an_update_waiting_for_approval_opens_no_version_until_approved(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    """Under "always ask", update_artifact streams its whole content, then waits for the
    member: while it waits no building row exists; the row opens after the approval and is
    frozen into exactly one new version in the same transaction."""
    server, fake = served
    content = "# Roadmap\n\n" + "".join(f"- Milestone {i}\n" for i in range(30))
    with server.client("alice") as alice:
        _member(alice, "always_ask")
        room_id = _room(alice)
        roadmap = _seed(server, "alice", title="Roadmap", kind="markdown",
                        content="# Roadmap\n", room_id=room_id)
        fake.load([{"match": "extend the roadmap", "responses": [
            {"tool_calls": [_call("call_up", "update_artifact",
                                  {"artifact_id": roadmap, "content": content}, 8)]},
            {"text": "The roadmap is extended."}]}])
        run_id = _send(alice, room_id, "extend the roadmap")
        waiting = _wait_for_approval(alice, run_id, "update_artifact")
        assert _run(alice, run_id)["status"] == "awaiting_approval"

        # The whole call has streamed and is waiting: nothing of it is stored or visible.
        assert _checkpoints(server, roadmap) == []
        view = json_of(alice.get(f"artifacts/{roadmap}"))
        assert (view["versions"], view["content"]) == ([1], "# Roadmap\n")

        _decide(alice, waiting["id"], "approve")
        assert _settled(alice, run_id)["status"] == "completed"
        view = json_of(alice.get(f"artifacts/{roadmap}"))
        assert (view["versions"], view["content"]) == ([1, 2], content)

    async def decided_at(store: Store) -> Any:
        async with store.transaction() as tx:
            return (await tx.session.execute(select(m.Approval.decided_at).where(
                m.Approval.id == waiting["id"]))).scalar_one()

    (row,) = _checkpoints(server, roadmap)
    assert (row.status, row.frozen_version, row.run_id) == ("frozen", 2, run_id)
    assert row.created_at >= with_server_store(server, decided_at)


# --- an unfinished version puts update_artifact on the first step -------------------


@pytest.mark.rule("R-299")
def test_an_unfinished_version_puts_update_artifact_on_the_first_step(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    """A turn's update stream is cut for good, leaving an unfinished version. The next turn's
    request ("please finish that") names no tool; with discovery on, its very first provider
    request still carries update_artifact, the roster tells the model to complete the version
    with it, and the call completes that same checkpoint."""
    server, fake = served
    content = "# Plan\n\n" + "".join(f"Step {i}: do the thing.\n" for i in range(40))
    with server.client("alice") as alice:
        _member(alice, "never_ask")
        room_id = _room(alice)
        plan = _seed(server, "alice", title="Plan", kind="markdown", content="# Plan\n",
                     room_id=room_id)
        update = _call("call_up", "update_artifact", {"artifact_id": plan, "content": content},
                       8)
        fake.load([
            # Every attempt of this step is cut mid-arguments: the turn fails.
            {"match": "write out the plan", "responses": [
                {"tool_calls": [update], "cut_after_chunks": 6}]},
            {"match": "please finish that", "responses": [
                {"tool_calls": [update]}, {"text": "The plan is finished."}]},
        ])
        failed = _send(alice, room_id, "write out the plan")
        assert _settled(alice, failed)["status"] == "failed"
        (open_row,) = _checkpoints(server, plan)
        assert open_row.status == "interrupted"

        fake.reset()
        finished = _send(alice, room_id, "please finish that")
        assert _settled(alice, finished)["status"] == "completed"
        first = fake.requests()[0]
        offered = [t["function"]["name"] for t in first["tools"]]
        assert "update_artifact" in offered
        assert "tool_search" in offered  # discovery is on; update_artifact is not behind it
        system = first["messages"][0]["content"]
        assert f"{plan} \"Plan\" (markdown, version 1) - has an unfinished new version: " \
               "complete it with update_artifact using this artifact_id" in system
        assert json_of(alice.get(f"artifacts/{plan}"))["versions"] == [1, 2]
    (frozen,) = _checkpoints(server, plan)
    assert (frozen.id, frozen.status, frozen.frozen_version) == (open_row.id, "frozen", 2)


# --- staged calls have their own ceiling, but every fence still holds ---------------


def _draft_of(server: ServerProcess, run_id: str) -> m.ArtifactDraft:
    async def work(store: Store) -> m.ArtifactDraft:
        async with store.transaction() as tx:
            return (await tx.session.execute(select(m.ArtifactDraft).where(
                m.ArtifactDraft.run_id == run_id))).scalar_one()
    return with_server_store(server, work)


@pytest.mark.rule("R-074")
def test_staged_calls_past_the_general_budget_still_meet_every_fence(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    """One staged creation takes more tool rounds than AGENT_LOOP_MAX_CYCLES and still
    completes; on the way, a chunk over the byte bound, a stale sequence, another member's
    draft and an earlier turn's draft are each refused and change nothing."""
    server, fake = served
    with server.client("alice") as alice, server.client("bob") as bob:
        _member(alice, "always_ask")
        _member(bob, "never_ask")
        bobs_room, alices_room = _room(bob), _room(alice)
        begin = {"title": "Story", "kind": "markdown"}
        fake.load([
            {"match": "bob starts a draft", "responses": [
                {"tool_calls": [_call("b1", "begin_artifact", begin)]}, {"text": "Begun."}]},
            {"match": "start the old draft", "responses": [
                {"tool_calls": [_call("o1", "begin_artifact", begin)]}, {"text": "Begun."}]},
        ])
        bobs_run = _send(bob, bobs_room, "bob starts a draft")
        assert _settled(bob, bobs_run)["status"] == "completed"
        old_run = _send(alice, alices_room, "start the old draft")
        assert _settled(alice, old_run, approve=True)["status"] == "completed"
        bobs_draft, old_draft = _draft_of(server, bobs_run).id, _draft_of(server, old_run).id

        def append(call_id: str, draft: str, sequence: int, digest: str,
                   chunk: str) -> dict[str, Any]:
            return _call(call_id, "append_artifact", {"draft_id": draft, "sequence": sequence,
                                                      "digest": digest, "chunk": chunk})

        # Until the turn's own draft exists its id is unknown, so the scenario is loaded in two
        # parts; the second call's approval wait is the point where the test swaps them.
        opening = [
            {"tool_calls": [_call("s1", "begin_artifact", begin)]},
            {"tool_calls": [append("own", bobs_draft, 0, EMPTY_DIGEST, "taken")]},
        ]
        fake.load([{"match": "write the story", "responses": opening}])
        run_id = _send(alice, alices_room, "write the story")
        _decide(alice, _wait_for_approval(alice, run_id, "begin_artifact")["id"], "approve")
        held = _wait_for_approval(alice, run_id, "append_artifact")
        draft = _draft_of(server, run_id).id
        first = "Once upon a time.\n"
        after_first = next_digest(EMPTY_DIGEST, first)
        fake.load([{"match": "write the story", "responses": [*opening,
            {"tool_calls": [append("ok", draft, 0, EMPTY_DIGEST, first)]},
            {"tool_calls": [append("seq", draft, 0, EMPTY_DIGEST, "Twice upon a time.\n")]},
            {"tool_calls": [append("bytes", draft, 1, after_first,
                                   "x" * (plugin.MAX_CHUNK_CHARS + 1))]},
            {"tool_calls": [append("fence", old_draft, 0, EMPTY_DIGEST, "hijack")]},
            {"tool_calls": [_call("fin", "finalize_artifact", {
                "draft_id": draft, "sequence": 1, "digest": after_first})]},
            {"text": "The story is saved."}]}])
        _decide(alice, held["id"], "approve")
        run = _settled(alice, run_id, approve=True)
        assert run["status"] == "completed", run

        calls = _settled_calls(alice, alices_room, run_id)
        assert len(calls) == 7 > MAX_CYCLES  # every round was a staged one
        assert {c: calls[c]["outcome"] for c in calls} == {
            "s1": "ok", "own": "error", "ok": "ok", "seq": "error", "bytes": "error",
            "fence": "error", "fin": "ok"}
        assert "No such draft" in calls["own"]["content"]  # ownership
        assert "Stale draft cursor" in calls["seq"]["content"]  # sequence and digest
        assert "chunk" in calls["bytes"]["content"]  # the bounded piece
        assert "another turn" in calls["fence"]["content"]  # the turn's execution fence

        (story,) = json_of(alice.get("artifacts", params={"conversation_id": alices_room}))
        assert json_of(alice.get(f"artifacts/{story['id']}"))["content"] == first
    for untouched, its_run in ((bobs_draft, bobs_run), (old_draft, old_run)):
        kept = _draft_of(server, its_run)
        assert (kept.id, kept.sequence, kept.digest, kept.content, kept.status) == (
            untouched, 0, EMPTY_DIGEST, "", "open")


@pytest.mark.rule("R-074")
async def test_a_staged_draft_never_grows_past_its_byte_bound(store: Store) -> None:
    conversation = await room(store)
    run = await live_run(store, conversation)
    drafts = DraftStore(store)
    scope = DraftScope("alice", conversation, run.id, run.fence)
    begun = await drafts.begin(scope, title="Big", kind="markdown", language=None)
    almost = "a" * (MAX_TEXT_BYTES - 8)
    cursor = await drafts.append(scope, begun.draft_id, sequence=0, digest=EMPTY_DIGEST,
                                 chunk=almost)
    with pytest.raises(MemberSafeError) as refused:
        await plugin.append_artifact.impl(
            Ctx(bundle_of(run), {"artifacts": ArtifactStore(store)}), draft_id=cursor.draft_id,
            sequence=cursor.sequence, digest=cursor.digest, chunk="é" * 5)  # 10 bytes
    assert refused.value.code == "artifact_too_large"
    kept = await drafts.get("alice", begun.draft_id)
    assert (kept.sequence, kept.digest, kept.size) == (1, cursor.digest, len(almost))


# --- every check passes before exactly one version is appended ----------------------


class _RacedArtifacts(ArtifactStore):
    """Lands another writer's version after the edit tool's own version check and before
    its write, so only the store's locked version check stands between them."""

    raced = False

    async def update(self, member: str, artifact_id: str, **kwargs: Any) -> Any:
        if not self.raced and kwargs.get("tx") is None:
            self.raced = True
            await ArtifactStore(self.store).update(
                member, artifact_id, content='{"rent": 1}\n', expected_version=1)
        return await super().update(member, artifact_id, **kwargs)


async def _edit_refused(ctx: Ctx, artifact_id: str, text: str, edits: str, code: str) -> None:
    with pytest.raises(MemberSafeError) as refused:
        await plugin.edit_artifact.impl(ctx, artifact_id=artifact_id, version=1,
                                        tag=content_tag(text), edits=edits)
    assert refused.value.code == code, refused.value
    assert "nothing was saved" in str(refused.value).lower()


@pytest.mark.rule("R-163")
async def test_an_edit_appends_one_version_only_after_every_check_passes(
        store: Store) -> None:
    """Kind validators (json, graph, svg), the governed-content rule, the size bound, line
    bounds, overlap and the store's locked version check each refuse an otherwise valid edit
    before anything is appended; a valid edit then appends exactly one version.

    (This product has no prompt-chain artifact kind, so there is no prompt-chain rule to run.)
    """
    conversation = await room(store)
    run = await live_run(store, conversation)
    artifacts = ArtifactStore(store)
    ctx = Ctx(bundle_of(run), {"artifacts": artifacts})
    where = WriteContext(conversation, run.id)
    graph = json.dumps({"nodes": [{"id": "a", "label": "A"}, {"id": "b", "label": "B"}],
                        "edges": [{"id": "e", "source": "a", "target": "b"}],
                        "sources": [], "references": []}, indent=2) + "\n"
    svg = '<svg xmlns="http://www.w3.org/2000/svg">\n<circle r="4"/>\n</svg>\n'
    made = {kind: await artifacts.create("alice", title=kind, kind=kind, content=text,
                                         where=where)
            for kind, text in (("json", BUDGET), ("graph", graph), ("svg", svg))}
    envelope = validate_envelope({"version": 2, "renderer": "table", "title": "Jobs",
                                  "text_fallback": "1 job", "markings": {"overall": "U"},
                                  "provenance": {"job": "j1"}, "result": {"rows": [[1]]}})
    governed = await artifacts.create_governed(
        "alice", envelope, attest_trusted_result("call-163", envelope), where=where)
    texts = {"json": BUDGET, "graph": graph, "svg": svg}

    budget = made["json"].artifact_id
    target = next(n for n, line in enumerate(graph.split("\n"), 1) if '"target"' in line)
    refusals = [
        (budget, BUDGET, 'PUT 2.=2:\n+  "rent": ,\n', "validation_failed"),   # json syntax
        (made["graph"].artifact_id, graph,                                     # dangling edge
         f'PUT {target}.={target}:\n+          "target": "nowhere"\n', "graph_invalid"),
        (made["svg"].artifact_id, svg, "PUT 1.=1:\n+<g>\n", "validation_failed"),  # no <svg>
        (budget, BUDGET, "PUT 2.=2:\n+" + "\U0001d11e" * 600_000 + "\n",      # > 2 MiB
         "artifact_too_large"),
        (budget, BUDGET, "CUT 4.=5\n", "invalid_edit"),                        # out of range
        (budget, BUDGET, "PUT 2.=3:\n+x\nCUT 3.=3\n", "invalid_edit"),          # overlap
        (governed.artifact_id, envelope.canonical.decode(),                      # governed
         "PUT 1.=1:\n+{}\n", "validation_failed"),
    ]
    for artifact_id, text, edits, code in refusals:
        await _edit_refused(ctx, artifact_id, text, edits, code)

    # The locked version check: the tool saw version 1, another writer landed version 2
    # after that, and the store's check under the root's lock refuses the stale edit.
    raced = Ctx(ctx.bundle, {"artifacts": _RacedArtifacts(store)})
    await _edit_refused(raced, budget, BUDGET, 'PUT 2.=2:\n+  "rent": 1300,\n',
                        "version_conflict")
    assert (await artifacts.resolve("alice", budget)).text() == '{"rent": 1}\n'

    for record in (*made.values(), governed):
        expected = [1, 2] if record.artifact_id == budget else [1]  # only the racer's version
        assert await artifacts.versions("alice", record.artifact_id) == expected
    for kind in ("graph", "svg"):
        assert (await artifacts.resolve("alice", made[kind].artifact_id)).text() == texts[kind]

    events_before = await _version_events(store, conversation)
    edited = await plugin.edit_artifact.impl(ctx, artifact_id=budget, version=2,
                                             tag=content_tag('{"rent": 1}\n'),
                                             edits='PUT 1.=1:\n+{"rent": 2}\n')
    assert edited["version"] == 3
    assert await artifacts.versions("alice", budget) == [1, 2, 3]
    assert await _version_events(store, conversation) == events_before + 1


async def _version_events(store: Store, conversation: str) -> int:
    return sum(1 for e in await store.journal.read(conversation, "alice")
               if e.type == "artifact.version")


# --- a fenced streamed generation never says "nothing was saved" --------------------


def _claims_nothing_saved(error: MemberSafeError) -> bool:
    text = str(error).lower()
    return "nothing was saved" in text or "nothing was written" in text


@pytest.mark.rule("R-367")
async def test_a_fenced_draft_is_reported_as_kept_not_as_nothing_saved(store: Store) -> None:
    """A staged draft whose execution was taken over, or whose turn was stopped, refuses
    later calls, but says the draft saved so far is kept; and it is."""
    conversation = await room(store)
    artifacts = ArtifactStore(store)
    for fenced_by in ("taken over", "stopped"):
        run = await live_run(store, conversation, text=fenced_by)
        ctx = Ctx(bundle_of(run), {"artifacts": artifacts})
        begun = await plugin.begin_artifact.impl(ctx, title="Essay", kind="markdown")
        first = await plugin.append_artifact.impl(
            ctx, draft_id=begun["draft_id"], sequence=0, digest=begun["digest"],
            chunk="The first part.\n")
        if fenced_by == "taken over":  # a recovery bumped the run's fence
            async with store.transaction() as tx:
                await tx.session.execute(update(m.Run).where(m.Run.id == run.id)
                                         .values(fence=m.Run.fence + 1))
        else:  # the member stopped the turn
            assert await RunLane(store).settle(run.id, "cancelled", "member", "alice",
                                               fence=run.fence)
        calls = (
            plugin.append_artifact.impl(ctx, draft_id=begun["draft_id"], sequence=1,
                                        digest=first["digest"], chunk="More.\n"),
            plugin.finalize_artifact.impl(ctx, draft_id=begun["draft_id"], sequence=1,
                                          digest=first["digest"]),
        )
        for call in calls:
            with pytest.raises(MemberSafeError) as refused:
                await call
            assert refused.value.code == "draft_fenced", refused.value
            assert not _claims_nothing_saved(refused.value), refused.value
            assert "kept" in str(refused.value)
        kept = await DraftStore(store).get("alice", begun["draft_id"])
        assert (kept.sequence, kept.digest, kept.status) == (1, first["digest"], "open")
        if fenced_by == "taken over":
            await RunLane(store).settle(run.id, "failed", "test", "system")
    assert await artifacts.list_for("alice") == []


@pytest.mark.rule("R-367")
async def test_an_update_whose_checkpoint_was_taken_over_is_not_reported_as_nothing_saved(
        store: Store) -> None:
    """alice's update stream in one chat is cut; her turn in another chat takes the same
    artifact's checkpoint over. When the first turn's call then completes, it is refused
    without claiming nothing was saved: its streamed draft went into that checkpoint. A plain
    version conflict, by contrast, is still a definite "nothing was saved" (R-366)."""
    here, there = await room(store), await room(store)
    artifacts = ArtifactStore(store)
    checkpoints = UpdateCheckpoints(store, artifacts)
    made = await artifacts.create("alice", title="Plan", kind="markdown", content="# Plan\n",
                                  where=WriteContext(here))
    arguments = json.dumps({"artifact_id": made.artifact_id, "content": "# Plan\n\nMore.\n"})
    named = arguments[:arguments.index('"content"')]  # a prefix naming the whole id
    first_run = await live_run(store, here)
    cut = ArtifactArgumentStream(checkpoints, owner="alice", conversation_id=here,
                                 run_id=first_run.id)
    await cut.fragment("call_1", "update_artifact", named)
    await cut.interrupted()
    other_run = await live_run(store, there)
    taker = ArtifactArgumentStream(checkpoints, owner="alice", conversation_id=there,
                                   run_id=other_run.id)
    await taker.fragment("call_2", "update_artifact", named)
    held = taker.checkpoint("call_2")
    assert held is not None and held.run_id == other_run.id

    ctx = Ctx(bundle_of(first_run), {"artifacts": artifacts})
    with pytest.raises(MemberSafeError) as refused:
        await plugin.update_artifact.impl(ctx, artifact_id=made.artifact_id,
                                          content="# Plan\n\nMore.\n")
    assert refused.value.code == "checkpoint_busy"
    assert not _claims_nothing_saved(refused.value), refused.value
    assert await artifacts.versions("alice", made.artifact_id) == [1]
    async with store.transaction() as tx:
        row = (await tx.session.execute(select(m.ArtifactUpdateCheckpoint))).scalar_one()
    assert (row.status, row.run_id) == ("building", other_run.id)  # still the taker's

    with pytest.raises(MemberSafeError) as conflict:
        await plugin.update_artifact.impl(
            Ctx(bundle_of(other_run), {"artifacts": artifacts}), artifact_id=made.artifact_id,
            content="# Plan v3\n", expected_version=7)
    assert conflict.value.code == "version_conflict"
    assert "nothing was saved" in str(conflict.value).lower()

