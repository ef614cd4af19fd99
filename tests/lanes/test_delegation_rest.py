"""invoke_agent end to end, on SQLite and PostgreSQL: REST in, the room lane, a real server, the
scripted fake model for both the parent and the delegated child.

The child runs under the parent's member, selection, budgets and approvals and gains no
authority (R-060); its tools are its ceiling ∩ the parent's catalog, never wider (R-410); an
agent's own text grants it nothing and an agent the member may not use is refused (R-061);
what it did is journaled in the parent run with a delegation marker, and only its answer comes
back, as evidence; a child that fails or times out reports no detail, and a turn that
delegated asks the member to check the activity when it ends without an answer (R-049).
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from kaizen_server_extension.host.delegation import (
    DELEGATED_TASK_NOTE,
    FAILED_MESSAGE,
    TIMED_OUT_MESSAGE,
)
from kaizen_server_extension.policy.grounding import NO_SUPPORT_ANSWER
from kaizen_server_extension.runtime.fallback import CHECK_ACTIVITY
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.testing.fake_openai import FakeOpenAI, last_user_message
from tests.conftest import BACKENDS, served_by, with_server_store
from tests.lanes.test_turns import _events, _pending_approval, _send, _settled
from tests.support.delegation_agents_plugin import COORDINATOR, HELPER, HELPER_CLAIM, WRITER
from tests.support.server import ServerProcess

REPO = Path(__file__).resolve().parents[2]
#: Short, so a child that never answers is cut off quickly, yet long enough for a member to
#: answer the approval a child waits on.
TIMEOUT_S = 8


@pytest.fixture(scope="module", params=BACKENDS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[tuple[ServerProcess, FakeOpenAI]]:
    root = tmp_path_factory.mktemp(f"delegation-{request.param}")
    with FakeOpenAI([{"responses": [{"text": "Hello."}]}]) as fake, \
            served_by(str(request.param), root, fake, extra_env={
                "KAIZEN_MODEL": "fake",
                "KAIZEN_PLUGINS": "tests.support.delegation_agents_plugin",
                "KAIZEN_DELEGATION_TIMEOUT_SECONDS": str(TIMEOUT_S),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                            os.environ.get("PYTHONPATH")])),
            }) as server:
        for member in ("alice", "bob", "carol"):
            with server.client(member) as client:
                assert client.get("members/me").status_code == 200
        yield server, fake


def _room(client: httpx.Client, agent_id: str = COORDINATOR) -> str:
    response = client.post("conversations", json={"agent_id": agent_id})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _delegate(agent_id: str, task: str) -> dict[str, Any]:
    return {"name": "invoke_agent", "arguments": {"agent_id": agent_id, "task": task}}


def _calls(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


def _turn(client: httpx.Client, room: str, text: str,
          timeout: float = 60) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    accepted = _send(client, room, text)
    run = _settled(client, accepted["run_id"], timeout=timeout)
    return run, _events(client, room, accepted["run_id"])


def _settled_calls(events: list[dict[str, Any]], name: str, *,
                   delegated: bool) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "tool.settled"
            and e["data"]["name"] == name and ("delegation" in e["data"]) is delegated]


def _asked_with(fake: FakeOpenAI, text: str) -> list[dict[str, Any]]:
    """The model requests whose last user message contains ``text``."""
    return [body for body in fake.requests()
            if text in last_user_message(body["messages"])[0]]


def _tool_names(body: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools") or []}


def _titles(client: httpx.Client) -> set[str]:
    return {a["title"] for a in client.get("artifacts").json()}


@pytest.mark.rule("R-060", "R-410")
def test_the_child_answers_as_evidence_with_its_verified_citations_and_is_journaled(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    with server.client("alice") as alice:
        uploaded = alice.post("documents", json={
            "filename": "herons.txt", "content_base64": base64.b64encode(
                b"The grey heron colony at Marsh End has 42 nests this spring.\n").decode()})
        assert uploaded.status_code == 201, uploaded.text
        hit = alice.get("document-search", params={"q": "heron"}).json()["hits"][0]
        ref = f"kaizen:document/{hit['document_id']}/v{hit['version']}#chunk={hit['chunk_id']}"
        room = _room(alice)
        task = "Count the heron nests at Marsh End."
        fake.load([
            {"match": task, "responses": [
                _calls({"name": "search", "arguments": {"query": "heron nests"}}),
                {"text": f"Marsh End has 42 nests [herons.txt]({ref})."}]},
            {"match": "how many heron nests", "responses": [
                _calls(_delegate("search", task)),
                {"text": f"The colony has 42 nests [herons]({ref})."}]}])
        run, events = _turn(alice, room, "how many heron nests are there?")
    assert run["status"] == "completed", run

    [delegated] = _settled_calls(events, "invoke_agent", delegated=False)
    assert delegated["outcome"] == "ok", delegated
    body = json.loads(delegated["content"])
    assert body["agent_id"] == "search" and "42 nests" in body["answer"]
    assert body["citations"] == [{"citation": ref}]

    # The child's calls are the parent run's journal, marked, their ids its own.
    [searched] = _settled_calls(events, "search", delegated=True)
    marker = searched["delegation"]
    assert marker["agent_id"] == "search" and marker["depth"] == 1
    assert marker["id"] == body["delegation_id"]
    assert searched["call_id"].startswith(f"{body['delegation_id']}:")
    assert hit["chunk_id"] in searched["content"]
    requested = [e["data"] for e in events if e["type"] == "tool.requested"
                 and e["data"]["name"] == "search"]
    assert requested and all(d["delegation"]["id"] == marker["id"] for d in requested)
    # Its steps are the run's steps; its answer is not the room's answer.
    child_steps = [e for e in events if e["type"] == "model.step.started"
                   and "delegation" in e["data"]]
    assert len(child_steps) == 2
    assert run["steps"] >= 4, run
    [answer] = [e["data"] for e in events if e["type"] == "answer.committed"]
    # The delegated citation is the parent's evidence: it survives citation discipline.
    assert ref in answer["text"] and "citations_removed" not in answer, answer

    # The child saw its task and its persona, not the conversation, and got the Search
    # agent's tools narrowed to the coordinator's: never query_document or search_about,
    # which the coordinator does not have.
    [first, _] = _asked_with(fake, task)
    system = first["messages"][0]["content"]
    assert DELEGATED_TASK_NOTE in system and "You find and cite" in system
    assert all("how many heron nests" not in str(msg.get("content"))
               for msg in first["messages"])
    assert _tool_names(first) == {"list_available_agents", "search"}


@pytest.mark.rule("R-061", "R-410")
def test_an_agents_own_text_grants_nothing_and_the_child_is_never_wider_than_its_parent(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    note = {"title": "Helper's note", "kind": "markdown", "content": "# Noted\n"}
    with server.client("alice") as alice:
        room = _room(alice)
        fake.load([
            # The helper's persona claims create_artifact; its ceiling is search alone.
            {"match": "Save the note", "responses": [
                _calls({"name": "create_artifact", "arguments": note}),
                {"text": "Saved."}]},
            # The writer may run code, but the coordinator may not: so neither may its child.
            {"match": "Check the sum with code", "responses": [
                _calls({"name": "run_code", "arguments": {"code": "print(1 + 1)",
                                                          "artifact_targets": []}}),
                {"text": "It is 2."}]},
            {"match": "delegate the chores", "responses": [
                _calls(_delegate(HELPER, "Save the note as an artifact.")),
                _calls(_delegate(WRITER, "Check the sum with code.")),
                {"text": "Neither could do it."}]}])
        run, events = _turn(alice, room, "delegate the chores")
        titles = _titles(alice)
    assert run["status"] == "completed", run

    [helper_step] = _asked_with(fake, "Save the note")
    assert HELPER_CLAIM in helper_step["messages"][0]["content"]
    assert _tool_names(helper_step) == {"search"}
    [writer_step] = _asked_with(fake, "Check the sum with code")
    assert _tool_names(writer_step) == {"create_artifact"}

    # Each call outside the child's tools was refused before anything ran.
    [write] = _settled_calls(events, "create_artifact", delegated=True)
    [code] = _settled_calls(events, "run_code", delegated=True)
    for refused, agent in ((write, HELPER), (code, WRITER)):
        assert refused["outcome"] == "error" and refused["delegation"]["agent_id"] == agent
        assert "not available to this agent" in refused["content"], refused
    assert note["title"] not in titles
    # The refusal ended each child's turn; the parent got a typed error with no detail.
    results = _settled_calls(events, "invoke_agent", delegated=False)
    assert [r["outcome"] for r in results] == ["error", "error"]
    for result in results:
        assert result["content"] == FAILED_MESSAGE
        assert "not available" not in result["content"]


@pytest.mark.rule("R-060")
def test_a_childs_write_parks_on_the_members_approval_like_any_turn(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    note = {"title": "Delegated note", "kind": "markdown", "content": "# Minutes\n"}
    with server.client("bob") as bob:
        assert bob.put("members/me/settings",
                       json={"approval_mode": "always_ask"}).status_code == 200
        room = _room(bob)
        fake.load([
            {"match": "Write the minutes", "responses": [
                _calls({"name": "create_artifact", "arguments": note}),
                {"text": "Wrote the minutes."}]},
            {"match": "get the minutes written", "responses": [
                _calls(_delegate(WRITER, "Write the minutes as an artifact.")),
                {"text": "The minutes are written."}]}])
        accepted = _send(bob, room, "get the minutes written")
        approval = _pending_approval(bob, accepted["run_id"])
        # Nothing is written before the member decides; the run waits for them.
        assert approval["tool"] == "create_artifact"
        assert bob.get(f"runs/{accepted['run_id']}").json()["status"] == "awaiting_approval"
        assert note["title"] not in _titles(bob)
        assert bob.post(f"approvals/{approval['id']}",
                        json={"decision": "approve"}).status_code == 200
        run = _settled(bob, accepted["run_id"], timeout=60)
        events = _events(bob, room, accepted["run_id"])
        assert note["title"] in _titles(bob)
        assert bob.put("members/me/settings",
                       json={"approval_mode": "ask_for_writes"}).status_code == 200
    assert run["status"] == "completed", run
    [written] = _settled_calls(events, "create_artifact", delegated=True)
    assert written["outcome"] == "ok" and written["delegation"]["agent_id"] == WRITER
    [result] = _settled_calls(events, "invoke_agent", delegated=False)
    assert json.loads(result["content"])["answer"] == "Wrote the minutes."


@pytest.mark.rule("R-060")
def test_delegation_depth_is_bounded(served: tuple[ServerProcess, FakeOpenAI]) -> None:
    """Depth 2 by default: the coordinator's child may delegate once more, and that
    grandchild is offered no invoke_agent; calling it anyway is refused."""
    server, fake = served
    with server.client("alice") as alice:
        room = _room(alice)
        fake.load([
            {"match": "Level two", "responses": [
                _calls(_delegate(HELPER, "Level three: anything.")),
                {"text": "unreachable"}]},
            {"match": "Level one", "responses": [
                _calls(_delegate(COORDINATOR, "Level two: go deeper.")),
                {"text": "Level one is done."}]},
            {"match": "go deep", "responses": [
                _calls(_delegate(COORDINATOR, "Level one: go deeper.")),
                {"text": "Done deep."}]}])
        run, events = _turn(alice, room, "go deep please")
    assert run["status"] == "completed", run
    [level_one] = _asked_with(fake, "Level one")[:1]
    assert "invoke_agent" in _tool_names(level_one)
    [level_two] = _asked_with(fake, "Level two")
    assert "invoke_agent" not in _tool_names(level_two)
    assert _asked_with(fake, "Level three") == []
    # The grandchild's call was refused, so its turn failed and its parent was told so.
    results = [e["data"] for e in events if e["type"] == "tool.settled"
               and e["data"]["name"] == "invoke_agent"]
    depths = {r.get("delegation", {}).get("depth") for r in results}
    assert depths == {None, 1, 2}, results
    deepest = next(r for r in results if r.get("delegation", {}).get("depth") == 2)
    assert deepest["outcome"] == "error" and "not available" in deepest["content"]
    middle = next(r for r in results if r.get("delegation", {}).get("depth") == 1)
    assert middle["content"] == FAILED_MESSAGE
    top = next(r for r in results if "delegation" not in r)
    assert json.loads(top["content"])["answer"] == "Level one is done."


@pytest.mark.rule("R-060")
def test_delegations_per_run_are_bounded(served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    with server.client("alice") as alice:
        room = _room(alice)
        fake.load([
            {"match": "Chore", "responses": [{"text": "ok"}]},
            {"match": "fan out", "responses": [
                _calls(*(_delegate(HELPER, f"Chore {n}.") for n in range(5))),
                {"text": "Four of five."}]}])
        run, events = _turn(alice, room, "fan out five chores")
    assert run["status"] == "completed", run
    results = _settled_calls(events, "invoke_agent", delegated=False)
    assert [r["outcome"] for r in results] == ["ok"] * 4 + ["error"]
    assert "used all 4 delegations" in results[-1]["content"]
    assert len(_asked_with(fake, "Chore")) == 4


async def _bobs_own_agent(store: Store) -> None:
    await store.agents.ensure_system_agent("bobs-agent", "Bob's", persona="Bob's helper.",
                                           mode="chat", tool_ceiling=["search"])
    async with store.transaction() as tx:
        await tx.session.execute(update(m.Agent).where(m.Agent.id == "bobs-agent")
                                 .values(owner="bob"))


@pytest.mark.rule("R-061")
def test_an_unknown_agent_or_one_the_member_may_not_use_is_refused(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    with_server_store(server, _bobs_own_agent)
    with server.client("bob") as bob:
        assert "bobs-agent" in {a["id"] for a in bob.get("agents").json()}
    with server.client("alice") as alice:
        room = _room(alice)
        fake.load([
            {"match": "Secret", "responses": [{"text": "leaked"}]},
            {"match": "ask strangers", "responses": [
                _calls(_delegate("nobody", "Secret task.")),
                _calls(_delegate("bobs-agent", "Secret task.")),
                {"text": "No one could."}]}])
        run, events = _turn(alice, room, "ask strangers")
    assert run["status"] == "completed", run
    results = _settled_calls(events, "invoke_agent", delegated=False)
    assert [r["outcome"] for r in results] == ["error", "error"]
    # Bob's private agent is as unknown to alice as one that does not exist.
    assert results[0]["content"] == results[1]["content"]
    assert "No agent with that id is available to you" in results[0]["content"]
    assert _asked_with(fake, "Secret") == []


@pytest.mark.rule("R-049", "R-060")
def test_a_failed_delegation_reports_no_detail_and_the_fallback_asks_to_check_activity(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    with server.client("carol") as carol:
        room = _room(carol)
        fake.load([
            {"match": "Look it up", "responses": [
                _calls({"name": "search", "arguments": {"query": "anything"}}),
                {"error": {"status": 400}}]},
            {"match": "try the helper", "responses": [
                _calls(_delegate(HELPER, "Look it up.")),
                {"empty": True}]}])
        run, events = _turn(carol, room, "try the helper")
    assert run["status"] == "answer_unavailable", run
    [result] = _settled_calls(events, "invoke_agent", delegated=False)
    assert result["outcome"] == "error" and result["content"] == FAILED_MESSAGE
    # What the child did is in the activity, not in the result.
    assert _settled_calls(events, "search", delegated=True)
    assert CHECK_ACTIVITY in events[-1]["data"]["message"]


@pytest.mark.rule("R-060")
def test_a_child_that_does_not_finish_in_time_is_cut_off_with_a_typed_error(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    with server.client("alice") as alice:
        room = _room(alice)
        fake.load([
            {"match": "Take your time", "responses": [
                {"text": "finally", "delay_ms": (TIMEOUT_S + 3) * 1000}]},
            {"match": "be quick", "responses": [
                _calls(_delegate(HELPER, "Take your time.")),
                {"text": "The helper was too slow."}]}])
        started = time.monotonic()
        run, events = _turn(alice, room, "be quick")
    assert run["status"] == "completed", run
    assert time.monotonic() - started < TIMEOUT_S + 20
    [result] = _settled_calls(events, "invoke_agent", delegated=False)
    assert result["outcome"] == "error" and result["content"] == TIMED_OUT_MESSAGE


@pytest.mark.rule("R-103", "R-060")
def test_a_delegated_search_that_found_nothing_returns_the_no_support_statement(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    """The child's answer passes the same grounding guard as any answer: its guess never
    reaches the parent as evidence."""
    server, fake = served
    with server.client("alice") as alice:
        room = _room(alice)
        fake.load([
            {"match": "Find the pelican count", "responses": [
                _calls({"name": "search", "arguments": {"query": "pelican count"}}),
                {"text": "There are 300 pelicans."}]},
            {"match": "ask search about pelicans", "responses": [
                _calls(_delegate("search", "Find the pelican count.")),
                {"text": "Search found nothing on pelicans."}]}])
        run, events = _turn(alice, room, "ask search about pelicans")
    assert run["status"] == "completed", run
    [result] = _settled_calls(events, "invoke_agent", delegated=False)
    body = json.loads(result["content"])
    assert body["answer"] == NO_SUPPORT_ANSWER and body["citations"] == []
    assert "300" not in result["content"]


@pytest.mark.rule("R-060")
def test_an_approval_a_cut_off_child_waited_on_is_withdrawn(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    """The member never answered; when the delegation's time is up the request is withdrawn,
    so a late approval runs nothing, and the parent's turn carries on."""
    server, fake = served
    note = {"title": "Never approved", "kind": "markdown", "content": "# Late\n"}
    with server.client("carol") as carol:
        assert carol.put("members/me/settings",
                         json={"approval_mode": "always_ask"}).status_code == 200
        room = _room(carol)
        fake.load([
            {"match": "Write it down", "responses": [
                _calls({"name": "create_artifact", "arguments": note}),
                {"text": "Written."}]},
            {"match": "note it, quickly", "responses": [
                _calls(_delegate(WRITER, "Write it down.")),
                {"text": "The writer ran out of time."}]}])
        accepted = _send(carol, room, "note it, quickly")
        approval = _pending_approval(carol, accepted["run_id"])
        run = _settled(carol, accepted["run_id"], timeout=TIMEOUT_S + 30)
        late = carol.post(f"approvals/{approval['id']}", json={"decision": "approve"})
        pending = [a for a in carol.get("approvals", params={"status": "pending"}).json()
                   if a["run_id"] == accepted["run_id"]]
        events = _events(carol, room, accepted["run_id"])
        titles = _titles(carol)
        assert carol.put("members/me/settings",
                         json={"approval_mode": "ask_for_writes"}).status_code == 200
    assert run["status"] == "completed", run
    [result] = _settled_calls(events, "invoke_agent", delegated=False)
    assert result["content"] == TIMED_OUT_MESSAGE
    assert pending == [] and late.status_code == 409, late.text
    [withdrawn] = [e["data"] for e in events if e["type"] == "approval.decided"]
    assert withdrawn["approval_id"] == approval["id"] and withdrawn["withdrawn"] is True
    assert note["title"] not in titles


@pytest.mark.rule("R-049")
def test_a_turn_that_delegated_successfully_still_asks_to_check_the_activity(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    """Every call read and completed, yet one delegated: whatever its agent did is not in the
    parent's own calls, so a turn ending without an answer asks the member to look."""
    server, fake = served
    with server.client("carol") as carol:
        room = _room(carol)
        fake.load([
            {"match": "Say ok", "responses": [{"text": "ok"}]},
            {"match": "delegate then stall", "responses": [
                _calls(_delegate(HELPER, "Say ok.")), {"empty": True}]}])
        run, events = _turn(carol, room, "delegate then stall")
    assert run["status"] == "failed" and run["outcome"] == "empty_response", run
    [result] = _settled_calls(events, "invoke_agent", delegated=False)
    assert result["outcome"] == "ok" and result["delegated"] is True
    assert CHECK_ACTIVITY in events[-1]["data"]["message"]
