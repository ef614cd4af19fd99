"""``kaizen.client`` against a live server: its models match the served OpenAPI document, and
every exchange it makes round-trips through the documented response schema of its route;
conversations, messages, journal pages, the events websocket with resume, approvals and
artifact downloads, sync and async."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from kaizen.client import AsyncClient, Client, KaizenError
from kaizen.client.models import COMPONENTS, EventFrame, LiveFrame
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by
from tests.support.server import ServerProcess, member_token

NOTE = "# Notes\n\nThe client saved this.\n"
SCRIPTS = [
    {"match": "hello client", "responses": [
        {"text": ["Hello ", "from ", "the ", "streamed ", "model."], "chunk_delay_ms": 30}]},
    {"match": "save a note", "responses": [
        {"tool_calls": [{"name": "create_artifact", "arguments": {
            "title": "Notes", "kind": "markdown", "content": NOTE}}]},
        {"text": "Saved your note."}]},
    {"responses": [{"text": "Default answer."}]},
]


class Recording(httpx.HTTPTransport):
    """The real HTTP transport, keeping each exchange for the schema round trip."""

    def __init__(self) -> None:
        super().__init__()
        self.exchanges: list[httpx.Response] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        response.read()
        self.exchanges.append(response)
        return response


@pytest.fixture(scope="module", params=BACKENDS)
def live(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root: Path = tmp_path_factory.mktemp(f"client-{request.param}")
    with FakeOpenAI(SCRIPTS) as fake, served_by(str(request.param), root, fake) as server:
        yield server


def _client(server: ServerProcess, member: str = "alice",
            transport: httpx.BaseTransport | None = None) -> Client:
    return Client(server.base_url, member_token(member), transport=transport)


def test_the_models_match_the_served_openapi_components(live: ServerProcess) -> None:
    with _client(live) as client:
        schemas = client.openapi()["components"]["schemas"]
    for name, model in COMPONENTS.items():
        component = schemas[name]
        properties = set(component.get("properties", {}))
        fields = set(model.model_fields)
        assert set(component.get("required", ())) <= fields, name
        assert fields <= properties, (name, fields - properties)


def _operation(document: dict[str, Any], response: httpx.Response) -> dict[str, Any]:
    path = response.request.url.path.removeprefix("/")
    for template, item in document["paths"].items():
        pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template.removeprefix("/")))
        if re.fullmatch(pattern, path):
            return dict(item[response.request.method.lower()])
    raise AssertionError(f"{response.request.method} {path} is not in the OpenAPI document")


def _check(document: dict[str, Any], response: httpx.Response) -> None:
    """The body matches the schema the document gives this route and status."""
    answer = _operation(document, response)["responses"][str(response.status_code)]
    content = answer.get("content", {})
    if "application/json" not in content:
        return  # a download: bytes
    schema = {**content["application/json"]["schema"], "components": document["components"]}
    errors = list(Draft202012Validator(schema).iter_errors(response.json()))
    assert not errors, (response.request.url, [e.message for e in errors[:3]])


def test_every_exchange_round_trips_through_its_documented_schema(live: ServerProcess) -> None:
    recording = Recording()
    with _client(live, transport=recording) as client, _client(live, "bob") as bob:
        document = client.openapi()
        assert client.me().member == "alice"
        assert "general" in [a.id for a in client.agents()]
        room = client.create_conversation(title="Client round trip")
        assert room.id in [c.id for c in client.conversations()]
        answer = client.ask(room.id, "hello client")
        assert answer.run.status == "completed" and answer.text == "Hello from the streamed model."
        page = client.journal(room.id, limit=2)
        assert [e.seq for e in page.events] == [1, 2] and page.next == 2
        assert [e.seq for e in client.iter_journal(room.id, page=2)] == list(
            range(1, client.conversation(room.id).last_seq + 1))
        assert client.run(answer.run.id).settled
        client.approvals("pending")
        assert client.kernel_access(room.id).allowed is False
        with pytest.raises(KaizenError) as foreign:
            bob.conversation(room.id)
        assert (foreign.value.status, foreign.value.code) == (404, "conversation_not_found")
        with pytest.raises(KaizenError) as bad:
            client.journal(room.id, limit=5000)
        assert bad.value.status == 400
    checked = 0
    for response in recording.exchanges:
        _check(document, response)
        checked += 1
    assert checked >= 12


def test_events_resume_after_a_disconnect_with_no_gap_or_duplicate(live: ServerProcess) -> None:
    with _client(live) as client:
        room = client.create_conversation()
        client.ask(room.id, "hello client")
        first: list[int] = []
        for frame in client.events(room.id):
            if isinstance(frame, EventFrame):
                first.append(frame.seq)
            if len(first) == 3:
                break  # the socket closes here; nothing is cancelled
        accepted = client.post_message(room.id, "hello client, again")
        rest: list[int] = []
        live_seen = False
        for frame in client.events(room.id, after=first[-1]):
            if isinstance(frame, LiveFrame):
                live_seen = live_seen or frame.type == "answer.delta"
                continue
            rest.append(frame.seq)
            if frame.type == "run.terminal" and frame.run_id == accepted.run_id:
                break
        journal = [e.seq for e in client.iter_journal(room.id)]
        assert first + rest == journal
        assert live_seen


def test_approvals_are_decided_and_artifacts_downloaded(live: ServerProcess) -> None:
    with _client(live) as client:
        with httpx.Client(base_url=live.base_url + "kaizen/api/", headers={
                "Authorization": f"token {member_token('alice')}"}) as raw:
            raw.put("members/me/settings", json={"approval_mode": "always_ask"})
        try:
            room = client.create_conversation()
            accepted = client.post_message(room.id, "save a note")
            pending = _wait(lambda: [a for a in client.approvals("pending")
                                     if a.run_id == accepted.run_id])
            assert pending[0].tool == "create_artifact"
            client.decide_approval(pending[0].id, approve=True)
            run = _wait(lambda: [r for r in [client.run(accepted.run_id)] if r.settled])[0]
            assert run.status == "completed"
            [artifact] = client.artifacts(room.id)
            assert client.download_artifact(artifact.id) == NOTE.encode()
            assert client.download_artifact(artifact.id, version=1) == NOTE.encode()
            with pytest.raises(KaizenError) as second:
                client.decide_approval(pending[0].id, approve=False)
            assert second.value.status == 409
        finally:
            with httpx.Client(base_url=live.base_url + "kaizen/api/", headers={
                    "Authorization": f"token {member_token('alice')}"}) as raw:
                raw.put("members/me/settings", json={"approval_mode": "ask_for_writes"})


def test_the_async_client_does_the_same(live: ServerProcess) -> None:
    async def main() -> None:
        async with AsyncClient(live.base_url, member_token("carol")) as client:
            assert (await client.me()).member == "carol"
            room = await client.create_conversation()
            pieces: list[str] = []
            answer = await client.ask(room.id, "hello client", on_text=pieces.append)
            assert answer.text == "Hello from the streamed model."
            assert "".join(pieces) == answer.text
            seqs = [e.seq async for e in client.iter_journal(room.id, page=3)]
            assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 5
            with pytest.raises(KaizenError):
                await client.run("no-such-run")
    asyncio.run(main())


def _wait(probe: Any, timeout: float = 60) -> Any:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("timed out")
