"""Text the databases cannot store, through a real server on both databases
(store/storable.py; docs/architecture.md, "Text the databases cannot store").

A program printing U+0000, a model answering with it or with an unpaired surrogate, and a
tool call carrying it in its arguments: the turn goes on, every ``tool.requested`` gets its
``tool.settled`` (R-264, R-267), and what was journaled is the stated escaping of what
happened, flagged ``text_escaped``, which ``restore`` reverses exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from kaizen_server_extension.store.storable import (
    ESCAPED_FLAG,
    UNSTORABLE,
    restore,
    storable_document,
)
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by
from tests.lanes.test_turns import _events, _pending_approval, _room, _send, _settled
from tests.support.server import ServerProcess
from tests.support.unicode import any_text

# The program holds only printable source; what it prints holds NUL and other controls.
PRINTS_CONTROLS = ("print('x\\x00y')\n"
                   "print('bell\\x07 esc\\x1b[31m del\\x7f bs\\x08 vt\\x0b ff\\x0c end')\n")
CONTROLS_OUT = "bell\x07 esc\x1b[31m del\x7f bs\x08 vt\x0b ff\x0c end"

SCRIPTS: list[dict[str, Any]] = [
    {"match": "print controls", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": PRINTS_CONTROLS, "artifact_targets": []}}]},
        {"text": "It printed them."}]},
    {"match": "nul in the code", "responses": [
        # The argument itself holds U+0000 (Python refuses such a source: a caller error).
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": "print(1)\x00", "artifact_targets": []}}]},
        {"text": "The code had a NUL."}]},
    {"match": "answer with nul", "responses": [{"text": "before\x00after and \\ slash"}]},
    {"match": "answer with a surrogate", "responses": [{"text": "lone \ud800 half"}]},
    {"match": "artifact with nul", "responses": [
        {"tool_calls": [{"name": "create_artifact", "arguments": {
            "title": "Plan\x00B", "kind": "markdown", "content": "# Plan\n"}}]},
        {"tool_calls": [{"name": "create_artifact", "arguments": {
            "title": "NUL inside", "kind": "markdown", "content": "a\x00b\n"}}]},
        {"text": "Saved the second."}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="module", params=BACKENDS)
def nul_server(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess,
                                                                           FakeOpenAI]]:
    root: Path = tmp_path_factory.mktemp(f"unstorable-{request.param}")
    with FakeOpenAI(SCRIPTS) as fake, served_by(str(request.param), root, fake, {
            "KAIZEN_KERNEL_POOL_SIZE": "1", "AGENT_LOOP_MAX_CYCLES": "4"}) as proc:
        yield proc, fake


@pytest.fixture(scope="module")
def server(nul_server: tuple[ServerProcess, FakeOpenAI]) -> ServerProcess:
    return nul_server[0]


def _turn(client: httpx.Client, text: str, timeout: float = 90) -> tuple[dict[str, Any],
                                                                          list[dict[str, Any]]]:
    room = _room(client)
    accepted = _send(client, room, text)
    run = _settled(client, accepted["run_id"], timeout=timeout)
    return run, _events(client, room, accepted["run_id"])


def _assert_every_call_settled_once(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each ``tool.requested`` is followed by exactly one ``tool.settled`` of its call
    (call ids may repeat across steps), and none is left open when the run has settled."""
    open_calls: set[str] = set()
    requested = settled = 0
    for event in events:
        call = event["data"].get("call_id")
        if event["type"] == "tool.requested":
            assert call not in open_calls, events
            open_calls.add(call)
            requested += 1
        elif event["type"] == "tool.settled":
            assert call in open_calls, events
            open_calls.discard(call)
            settled += 1
    assert requested and requested == settled and not open_calls, (requested, settled)
    return [e["data"] for e in events if e["type"] == "tool.settled"]


def _never_unstorable(events: list[dict[str, Any]]) -> None:
    """What the journal serves holds no code point a database could not store."""
    assert not UNSTORABLE.search(json.dumps(events, ensure_ascii=False))


@pytest.fixture(autouse=True)
def _never_ask(server: ServerProcess) -> None:
    with server.client("alice") as alice:
        assert alice.put("members/me/settings",
                         json={"approval_mode": "never_ask"}).status_code == 200


@pytest.mark.rule("R-264", "R-267")
def test_a_program_printing_nul_and_controls_is_settled_and_the_turn_goes_on(
        server: ServerProcess) -> None:
    with server.client("alice") as alice:
        run, events = _turn(alice, "please print controls")
        assert run["status"] == "completed", run
        [settled] = _assert_every_call_settled_once(events)
        assert settled["outcome"] == "ok", settled
        _never_unstorable(events)
        # Restoring (a no-op unless it was stored escaped and flagged) gives exactly what the
        # program printed.
        original = restore(settled)
        stdout = json.loads(original["content"])["stdout"]
        assert "x\x00y\n" in stdout and CONTROLS_OUT in stdout
        assert storable_document(original) == settled  # the stated escaping, nothing else


@pytest.mark.rule("R-264", "R-267")
def test_tool_arguments_holding_nul_are_journaled_escaped_and_settled(
        server: ServerProcess) -> None:
    with server.client("alice") as alice:
        run, events = _turn(alice, "nul in the code please")
        assert run["status"] == "completed", run
        [settled] = _assert_every_call_settled_once(events)
        assert settled["outcome"] == "error"  # Python refuses a source holding NUL
        [requested] = [e["data"] for e in events if e["type"] == "tool.requested"]
        assert requested[ESCAPED_FLAG] is True
        assert restore(requested)["arguments"]["code"] == "print(1)\x00"
        _never_unstorable(events)


@pytest.mark.rule("R-264", "R-267")
def test_an_approval_request_for_arguments_holding_nul_is_stored_and_decided(
        server: ServerProcess) -> None:
    with server.client("alice") as alice:
        assert alice.put("members/me/settings",
                         json={"approval_mode": "always_ask"}).status_code == 200
        room = _room(alice)
        accepted = _send(alice, room, "nul in the code, asking first")
        approval = _pending_approval(alice, accepted["run_id"])
        shown = approval["arguments"]  # stored escaped and flagged (approvals.arguments)
        assert shown[ESCAPED_FLAG] is True
        assert restore(shown)["code"] == "print(1)\x00"
        assert alice.post(f"approvals/{approval['id']}",
                          json={"decision": "approve"}).status_code == 200
        run = _settled(alice, accepted["run_id"], timeout=90)
        assert run["status"] == "completed", run
        events = _events(alice, room, accepted["run_id"])
        _assert_every_call_settled_once(events)
        _never_unstorable(events)


@pytest.mark.parametrize(("ask", "answer"), [
    ("answer with nul", "before\x00after and \\ slash"),
    ("answer with a surrogate", "lone \ud800 half"),
])
def test_a_model_answer_holding_unstorable_text_is_committed_escaped(
        server: ServerProcess, ask: str, answer: str) -> None:
    with server.client("alice") as alice:
        run, events = _turn(alice, ask)
        assert run["status"] == "completed" and run["outcome"] == "answered", run
        [committed] = [e["data"] for e in events if e["type"] == "answer.committed"]
        assert committed[ESCAPED_FLAG] is True
        assert restore(committed)["text"] == answer
        _never_unstorable(events)
        # The next turn's context holds that answer again, restored: it still reaches the
        # model (sent as ASCII-escaped JSON) and the turn completes.
        room = events[0]["conversation_id"]
        follow_up = _send(alice, room, "and then?")
        assert _settled(alice, follow_up["run_id"])["status"] == "completed"


@pytest.mark.rule("R-264", "R-267")
def test_create_artifact_refuses_a_nul_title_and_keeps_nul_content_exactly(
        server: ServerProcess) -> None:
    with server.client("alice") as alice:
        before = {a["id"] for a in alice.get("artifacts").json()}
        run, events = _turn(alice, "make an artifact with nul")
        assert run["status"] == "completed", run
        refused, saved = _assert_every_call_settled_once(events)
        # A title is a text column: refused, nothing saved, and the model may repair it.
        assert refused["outcome"] == "error", refused
        assert "cannot be stored" in restore(refused)["content"]
        assert saved["outcome"] == "ok", saved
        created = [a for a in alice.get("artifacts").json() if a["id"] not in before]
        assert [a["title"] for a in created] == ["NUL inside"]
        # Content is stored as bytes: U+0000 is kept exactly, not escaped.
        download = alice.get(f"artifacts/{created[0]['id']}/download")
        assert download.content == b"a\x00b\n"
        assert alice.get(f"artifacts/{created[0]['id']}").json()["content"] == "a\x00b\n"
        _never_unstorable(events)


@pytest.mark.rule("R-264", "R-267")
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=any_text)
def test_any_text_in_a_model_answer_and_tool_arguments_never_loses_a_settlement(
        nul_server: tuple[ServerProcess, FakeOpenAI], text: str) -> None:
    """Whatever a model says or passes to a tool: the turn settles, each requested call is
    settled once, and the journal holds exactly the stated escaping of it."""
    server, fake = nul_server
    # What arrives over JSON: an escaped surrogate pair decodes to one astral code point.
    text = json.loads(json.dumps(text))
    fake.load([{"match": "property turn", "responses": [
        {"tool_calls": [{"name": "list_available_agents", "arguments": {"note": text}}]},
        {"text": [text]}]}, *SCRIPTS])
    try:
        with server.client("alice") as alice:
            run, events = _turn(alice, "property turn")
            # A blank answer may be unavailable; nothing may fail the controller.
            assert run["status"] in ("completed", "answer_unavailable"), run
            _assert_every_call_settled_once(events)
            _never_unstorable(events)
            [requested] = [e["data"] for e in events if e["type"] == "tool.requested"]
            assert restore(requested)["arguments"] == {"note": text}
            committed = [e["data"] for e in events if e["type"] == "answer.committed"]
            if committed:
                assert restore(committed[0])["text"] == text
    finally:
        fake.load(SCRIPTS)
