"""R-103 end to end, on SQLite and PostgreSQL: an answer that finds no support says so rather than
guessing, and it is the backend that makes it so, whatever the model wrote.

A grounded turn (a Search agent's, or one that called a retrieval tool) that gathered no
supporting evidence publishes the policy's no-support statement in place of the model's guess;
a supported answer, and an ordinary chat turn that retrieved nothing, are left as written.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kaizen_server_extension.policy.grounding import NO_SUPPORT_ANSWER
from kaizen_server_extension.testing.fake_openai import FakeOpenAI, last_user_message
from tests.conftest import BACKENDS, served_by
from tests.events.support import connect, read_until
from tests.lanes.test_turns import _events, _send, _settled
from tests.support.server import ServerProcess

GUESS = "Pelicans there number about 300, mostly juveniles."


@pytest.fixture(scope="module", params=BACKENDS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[tuple[ServerProcess, FakeOpenAI]]:
    root = tmp_path_factory.mktemp(f"no-support-{request.param}")
    with FakeOpenAI([{"responses": [{"text": "Hello."}]}]) as fake, \
            served_by(str(request.param), root, fake, extra_env={"KAIZEN_MODEL": "fake"}) \
            as server:
        with server.client("alice") as alice:
            uploaded = alice.post("documents", json={
                "filename": "herons.txt", "content_base64": base64.b64encode(
                    b"The grey heron colony at Marsh End has 42 nests.\n").decode()})
            assert uploaded.status_code == 201, uploaded.text
        yield server, fake


def _answer(client: httpx.Client, agent_id: str, text: str) -> dict[str, Any]:
    room = client.post("conversations", json={"agent_id": agent_id}).json()["id"]
    accepted = _send(client, room, text)
    run = _settled(client, accepted["run_id"], timeout=60)
    assert run["status"] == "completed", run
    [answer] = [e["data"] for e in _events(client, room, accepted["run_id"])
                if e["type"] == "answer.committed"]
    return {"room": room, **answer}


def _search(query: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "search", "arguments": {"query": query}}]}


@pytest.mark.rule("R-103")
def test_a_guess_after_searches_that_found_nothing_is_replaced_by_the_no_support_statement(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    fake.load([{"match": "pelicans", "responses": [
        _search("pelican count"), _search("pelican juveniles"), {"text": GUESS}]},
        {"match": "and the herons", "responses": [{"text": "Still nothing."}]}])
    with server.client("alice") as alice:
        answer = _answer(alice, "search", "how many pelicans are at Marsh End?")
        assert answer["text"] == NO_SUPPORT_ANSWER
        assert answer["grounding"] == "no_support" and answer["replaced_chars"] == len(GUESS)
        # The guess never reaches the room's history either: the next turn's model reads
        # the statement, not what was replaced.
        accepted = _send(alice, answer["room"], "and the herons?")
        _settled(alice, accepted["run_id"], timeout=60)
    [later] = [body for body in fake.requests()
               if "and the herons" in last_user_message(body["messages"])[0]]
    history = " ".join(str(message.get("content")) for message in later["messages"])
    assert NO_SUPPORT_ANSWER in history and GUESS not in history


@pytest.mark.rule("R-103")
def test_a_search_agent_answering_from_memory_without_retrieving_says_it_found_no_support(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    fake.load([{"responses": [{"text": GUESS}]}])
    with server.client("alice") as alice:
        answer = _answer(alice, "search", "tell me about pelicans")
    assert answer["text"] == NO_SUPPORT_ANSWER and answer["grounding"] == "no_support"


@pytest.mark.rule("R-103")
def test_any_turn_whose_retrieval_found_nothing_is_held_to_it(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    """The General agent is no Search agent, but once it looked something up (its docs
    search) and found nothing, its answer is a grounded one too."""
    server, fake = served
    fake.load([{"responses": [
        {"tool_calls": [{"name": "search_about", "arguments": {"query": "qqxv zzkw"}}]},
        {"text": "Kaizen supports quantum sync, set KAIZEN_QUANTUM=1."}]}])
    with server.client("alice") as alice:
        answer = _answer(alice, "general", "how do I enable qqxv zzkw?")
    assert answer["text"] == NO_SUPPORT_ANSWER


@pytest.mark.rule("R-103", "R-071")
def test_a_supported_answer_and_an_ordinary_chat_answer_are_published_as_written(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    with server.client("alice") as alice:
        hit = alice.get("document-search", params={"q": "heron"}).json()["hits"][0]
        ref = f"kaizen:document/{hit['document_id']}/v{hit['version']}#chunk={hit['chunk_id']}"
        cited = f"Marsh End has 42 heron nests [herons.txt]({ref})."
        fake.load([{"match": "heron nests", "responses": [_search("heron nests"),
                                                          {"text": cited}]},
                   {"responses": [{"text": "Hello there, how can I help?"}]}])
        supported = _answer(alice, "search", "how many heron nests?")
        chatted = _answer(alice, "general", "hi")
    assert supported["text"] == cited and "grounding" not in supported
    assert chatted["text"] == "Hello there, how can I help?" and "grounding" not in chatted


@pytest.mark.rule("R-071")
def test_a_supported_search_answer_that_cites_nothing_lists_what_it_retrieved(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    with server.client("alice") as alice:
        hit = alice.get("document-search", params={"q": "heron"}).json()["hits"][0]
        fake.load([{"match": "nests at Marsh End", "responses": [
            _search("heron nests"), {"text": "Marsh End has 42 heron nests."}]}])
        answer = _answer(alice, "search", "how many nests at Marsh End?")
        assert answer["text"] == f"Marsh End has 42 heron nests.\n\nSources: {hit['citation']}"
        assert answer["sources_listed"] == 1
        # The listed source is a link the member can open: the passage it names.
        version = alice.get(f"documents/{hit['document_id']}/versions/{hit['version']}")
        assert version.status_code == 200 and "42 nests" in version.json()["text"]


def _live_answer(server: ServerProcess, agent_id: str, text: str) -> list[dict[str, Any]]:
    """The frames an events websocket sees of one turn, up to its terminal."""
    with server.client("alice") as alice:
        room = alice.post("conversations", json={"agent_id": agent_id}).json()["id"]

    async def watch() -> list[dict[str, Any]]:
        ws = await connect(server, "alice", room)
        try:
            with server.client("alice") as alice:
                _send(alice, room, text)
            return await read_until(ws, lambda frames: any(
                f["type"] == "run.terminal" for f in frames), within=60)
        finally:
            ws.close()

    return asyncio.run(watch())


@pytest.mark.rule("R-103")
def test_a_guess_is_not_streamed_live_either(served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    fake.load([{"match": "pelicans", "responses": [_search("pelican count"), {"text": GUESS}]},
               {"responses": [{"text": "Hello there, how can I help?"}]}])
    guessed = _live_answer(server, "search", "how many pelicans live here?")
    chatted = _live_answer(server, "general", "hi")
    assert not [f for f in guessed if f["type"] == "answer.delta"]
    # Words of the guess, not "300" alone: an id or a timestamp in a frame may hold that.
    assert all("about 300" not in str(f.get("data")) and "juveniles" not in str(f.get("data"))
               for f in guessed)
    [committed] = [f for f in guessed if f["type"] == "answer.committed"]
    assert committed["data"]["text"] == NO_SUPPORT_ANSWER
    # The control: an ordinary answer streams as it is written.
    assert [f for f in chatted if f["type"] == "answer.delta"]
