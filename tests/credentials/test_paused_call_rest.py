"""A call that needs a credential pauses for the member's form and completes with it, end to
end through a real server on both databases, the fake model and the local HTTPS OpenAPI
service (docs/credentials.md, "A call that needs a credential").

The model calls an External OpenAPI write without a ``credential_ref``: the member approves
it, the approval is consumed, the call pauses with a ``credential.requested`` event carrying
its form (never a value); the member opens the form (the destination origin first), submits,
and the paused call goes out once with that value; the result never carries it. A replayed
submission, a cancelled or expired form and an approval reused for a second call are
refused, and the run goes on."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.credentials.crypto import new_key_text
from kaizen_server_extension.credentials.paused_calls import PausedCalls
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.credential_requests import CredentialRequests
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from kaizen_server_extension.tools.ports import PausedCallFacts
from tests.conftest import BACKENDS, all_rows, served_by, with_server_store
from tests.credentials.test_broker_rest import _leaks
from tests.lanes.test_turns import _events, _pending_approval, _send, _settled
from tests.support.openapi_agent_plugin import OPENAPI_AGENT
from tests.support.openapi_server import OpenApiService, items_document, reaching
from tests.support.server import ServerProcess, member_token

SECRET = "paused-call-7c3b-credential-value"
SOURCES = "openapi-sources"
#: The forms' lifetime on this server: short, so a form can be seen to expire.
FORM_SECONDS = 15
DEFAULT = {"responses": [{"text": "Default."}]}


def _document() -> dict[str, Any]:
    # The service echoes the X-Key it got on /api/whoami, whatever the method.
    return items_document(**{"/api/whoami": {
        "get": {"operationId": "whoAmI", "security": [{"key": []}]},
        "post": {"operationId": "keyedWrite", "security": [{"key": []}],
                 "requestBody": {"required": True, "content": {"application/json": {
                     "schema": {"type": "object", "required": ["name"],
                                "properties": {"name": {"type": "string"}}}}}}}}})


class World:
    def __init__(self, server: ServerProcess, fake: FakeOpenAI,
                 service: OpenApiService) -> None:
        self.server, self.fake, self.service = server, fake, service

    def url(self, path: str) -> str:
        return self.server.base_url.rstrip("/") + "/" + path.lstrip("/")

    def form(self, path: str, member: str = "alice", **fields: str) -> httpx.Response:
        headers = {"Authorization": f"token {member_token(member)}"}
        if fields:
            return httpx.post(self.url(path), data=fields, headers=headers, timeout=30)
        return httpx.get(self.url(path), headers=headers, timeout=30)


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp(f"paused-call-{request.param}")
    with OpenApiService(root) as service, FakeOpenAI([DEFAULT]) as fake:
        service.serve("/openapi.json", _document())
        with served_by(str(request.param), root, fake, extra_env={
                "KAIZEN_PLUGINS": "tests.support.openapi_agent_plugin",
                "KAIZEN_OPENAPI_SOURCES_ENABLED": "1",
                **reaching(service, root),
                "KAIZEN_OPENAPI_SCHEMA_FRESH_SECONDS": "0",
                "KAIZEN_CREDENTIALS_ENABLED": "1",
                "KAIZEN_CREDENTIAL_FORM_SECONDS": str(FORM_SECONDS),
                "KAIZEN_CREDENTIAL_KEY": new_key_text()}) as server:
            yield World(server, fake, service)


@pytest.fixture
def alice(world: World) -> Iterator[httpx.Client]:
    with world.server.client("alice") as client:
        yield client


@pytest.fixture
def source(alice: httpx.Client, world: World) -> Iterator[dict[str, Any]]:
    created = alice.post(SOURCES, json={"schema_url": world.service.url("/openapi.json")})
    assert created.status_code == 201, created.text
    yield dict(created.json())
    alice.delete(f"{SOURCES}/{created.json()['id']}")


def _start(world: World, client: httpx.Client, text: str,
           calls: list[tuple[str, dict[str, Any]]]) -> tuple[str, str]:
    """A new room where the model makes ``calls``, one per step, then answers."""
    world.fake.load([{"match": text, "responses": [
        *({"tool_calls": [{"name": name, "arguments": arguments}]}
          for name, arguments in calls), {"text": "Done."}]}, DEFAULT])
    room = client.post("conversations", json={"agent_id": OPENAPI_AGENT}).json()["id"]
    return room, _send(client, room, text)["run_id"]


def _event(client: httpx.Client, room: str, run_id: str, kind: str, count: int = 1,
           timeout: float = 60) -> dict[str, Any]:
    """The ``count``-th event of ``kind`` of the run, once it is journaled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in _events(client, room, run_id) if e["type"] == kind]
        if len(found) >= count:
            return dict(found[count - 1])
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} journaled no {kind}: {_debug(client, room, run_id)}")


def _settled_calls(client: httpx.Client, room: str, run_id: str) -> list[dict[str, Any]]:
    return [dict(e["data"]) for e in _events(client, room, run_id)
            if e["type"] == "tool.settled"]


def _form_receipts(client: httpx.Client) -> int:
    return len([r for r in client.get("credentials/receipts").json() if r["kind"] == "form"])


def _plan(form_path: str) -> dict[str, Any]:
    """The signed plan a form's token carries (its payload is readable; its MAC is not
    forgeable)."""
    payload = form_path.rsplit("/", 1)[1].split(".")[0]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


@pytest.mark.rule("R-387", "R-388", "R-386", "R-391", "R-397", "R-342")
def test_an_approved_write_pauses_for_its_form_and_runs_once_with_the_credential(
        world: World, alice: httpx.Client, source: dict[str, Any]) -> None:
    tool = f"openapi__{source['id']}__keyedWrite"
    room, run_id = _start(world, alice, "write it with my key", [(tool, {"body":
                                                                         {"name": "n1"}})])
    approval = _pending_approval(alice, run_id)
    assert approval["tool"] == tool and approval["capability"] == "write"
    assert "credential_ref" not in json.dumps(approval["arguments"])
    assert alice.post(f"approvals/{approval['id']}",
                      json={"decision": "approve"}).status_code == 200

    requested = _event(alice, room, run_id, "credential.requested")["data"]
    assert requested["tool"] == tool and requested["origin"] == world.service.origin
    assert requested["approval_id"] == approval["id"] and requested["effect"] == "write"
    assert alice.get(f"runs/{run_id}").json()["status"] == "awaiting_approval"
    # Nothing went out yet; the approval was consumed by this call before it paused.
    assert world.service.received("/api/whoami") == []
    [consumed] = [a for a in alice.get("approvals").json() if a["id"] == approval["id"]]
    assert consumed["status"] == "consumed"
    # The signed plan binds the actor, the workroom, the call, the consumed approval, the
    # paused request, the nonce, the API base and the expiry.
    plan = _plan(requested["form_path"])
    assert plan["member"] == "alice" and plan["origin"] == world.service.origin
    assert len(plan["nonce"]) >= 16 and plan["exp"] <= time.time() + FORM_SECONDS + 1
    call = plan["call"]
    assert (call["tool"], call["operation"], call["effect"]) == (tool, "keyedWrite", "write")
    assert (call["approval"], call["request"], call["conversation"]) == (
        approval["id"], requested["request_id"], room)
    assert call["source"] == source["id"] and call["api_base"] == source["api_base"]
    assert len(call["schema_digest"]) == len(call["args_digest"]) == 64
    assert "n1" not in json.dumps(plan)
    [listed] = [p for p in alice.get("credentials/requests").json()
                if p["id"] == requested["request_id"]]
    assert listed["status"] == "pending" and listed["approval_id"] == approval["id"]

    # The form shows the destination origin before any field; bob cannot open it.
    page = world.form(requested["form_path"])
    assert page.status_code == 200
    text = page.text
    assert text.index('id="destination-origin"') < text.index("<input id=\"kz-value\"")
    assert f'id="destination-origin">{world.service.origin}<' in text
    assert world.form(requested["form_path"], "bob").status_code == 404
    submitted = world.form(requested["form_path"], value=SECRET)
    assert submitted.status_code == 200 and 'data-resumed="yes"' in submitted.text
    assert "cref_" not in submitted.text

    assert _settled(alice, run_id, timeout=120)["status"] == "completed"
    [settled] = _settled_calls(alice, room, run_id)
    assert settled["outcome"] == "ok", settled
    # Exactly once, with the value, to the source.
    [sent] = world.service.received("/api/whoami")
    assert sent.method == "POST" and sent.headers.get("x-key") == SECRET
    assert json.loads(sent.body) == {"name": "n1"}
    # The source echoed the key: neither the result, the journal, the model nor the log has
    # it, and the model never saw the form or its plan.
    assert _leaks(settled["content"], SECRET) == [] and "[REDACTED]" in settled["content"]
    journal = json.dumps(_events(alice, room))
    assert _leaks(journal, SECRET) == []
    model_saw = json.dumps(world.fake.requests())
    assert _leaks(model_saw, SECRET) == []
    assert requested["form_path"].rsplit("/", 1)[1] not in model_saw
    assert _leaks(world.server.log(), SECRET) == []
    # A use-once value is never written to the database, in any table or encoding.
    assert _leaks(repr(with_server_store(world.server, all_rows)), SECRET) == []
    ended = _event(alice, room, run_id, "credential.settled")["data"]
    assert ended["status"] == "submitted" and "credential_ref" not in ended

    # A replayed submission is refused by the spent nonce; nothing more is sent.
    replay = world.form(requested["form_path"], value=SECRET)
    assert replay.status_code == 409 and 'data-code="form_used"' in replay.text
    assert len(world.service.received("/api/whoami")) == 1
    receipts = alice.get("credentials/receipts").json()
    assert [r["status"] for r in receipts if r["kind"] == "request"
            and r["run_id"] == run_id] == ["succeeded"]


@pytest.mark.rule("R-387")
def test_the_approval_a_paused_call_consumed_serves_no_other_call(
        world: World, alice: httpx.Client, source: dict[str, Any]) -> None:
    tool = f"openapi__{source['id']}__keyedWrite"
    before = len(world.service.received("/api/whoami"))
    arguments = {"body": {"name": "twice"}}
    room, run_id = _start(world, alice, "write it twice", [(tool, arguments),
                                                            (tool, arguments)])
    first = _pending_approval(alice, run_id)
    assert alice.post(f"approvals/{first['id']}",
                      json={"decision": "approve"}).status_code == 200
    requested = _event(alice, room, run_id, "credential.requested")["data"]
    assert world.form(requested["form_path"], value=SECRET).status_code == 200
    assert _settled(alice, run_id, timeout=120)["status"] == "completed"
    # The same call again (same arguments, the fake's same call id) did not run with it.
    assert len(world.service.received("/api/whoami")) == before + 1
    assert [e["data"]["approval_id"] for e in _events(alice, room, run_id)
            if e["type"] == "credential.requested"] == [first["id"]]
    call_id = requested["call_id"]

    async def reuse(store: Store) -> None:
        requests = CredentialRequests(store)
        # The paused call took its outcome once; nothing can take it again ...
        assert await requests.resume(requested["request_id"]) is None
        # ... so its consumed approval authorizes no re-issued call, this one included ...
        paused = PausedCalls(store, None, None)  # type: ignore[arg-type]
        facts = PausedCallFacts(call_id, first["args_digest"])
        assert not await paused.approval_resumes(
            SimpleNamespace(run_id=run_id, member="alice"), facts,  # type: ignore[arg-type]
            first["id"])
        # ... and the database binds one consumed approval to one paused call.
        with pytest.raises(IntegrityError):
            async with store.transaction() as tx:
                tx.session.add(m.CredentialRequest(
                    id=uuid.uuid4().hex, run_id=run_id, conversation_id=room,
                    call_id="call_other", member="alice", tool=tool,
                    destination=requested["destination"], origin=requested["origin"],
                    effect="write", args_digest=first["args_digest"],
                    approval_id=first["id"], authorized_by="one_shot_approval",
                    nonce=uuid.uuid4().hex, status="pending",
                    expires_at=datetime.now(UTC), created_at=datetime.now(UTC)))
                await tx.session.flush()

    with_server_store(world.server, reuse)


@pytest.mark.timeout(300)
@pytest.mark.rule("R-387")
def test_a_write_the_conversation_grant_answers_pauses_and_resumes_unasked(
        world: World, alice: httpx.Client, source: dict[str, Any]) -> None:
    tool = f"openapi__{source['id']}__keyedWrite"
    before = len(world.service.received("/api/whoami"))
    room, run_id = _start(world, alice, "write with a grant", [(tool, {"body":
                                                                       {"name": "g1"}})])
    approval = _pending_approval(alice, run_id)
    assert alice.post(f"approvals/{approval['id']}", json={
        "decision": "approve", "scope": "conversation"}).status_code == 200
    requested = _event(alice, room, run_id, "credential.requested")["data"]
    assert world.form(requested["form_path"], value=SECRET).status_code == 200
    assert _settled(alice, run_id, timeout=120)["status"] == "completed"
    # The next write in this room: the grant answers it, it pauses with no approval bound,
    # and after the form it runs without anything being asked.
    text = "write again with a grant"
    world.fake.load([{"match": text, "responses": [
        {"tool_calls": [{"name": tool, "arguments": {"body": {"name": "g2"}}}]},
        {"text": "Done."}]}, DEFAULT])
    run_id = _send(alice, room, text)["run_id"]
    requested = _event(alice, room, run_id, "credential.requested")["data"]
    assert requested["approval_id"] is None and "approval" not in _plan(
        requested["form_path"])["call"]
    assert world.form(requested["form_path"], value=SECRET).status_code == 200
    assert _event(alice, room, run_id, "run.terminal")["data"]["status"] == "completed"
    assert [e for e in _events(alice, room, run_id) if e["type"] == "approval.requested"] == []
    assert [c["outcome"] for c in _settled_calls(alice, room, run_id)] == ["ok"]
    sent = world.service.received("/api/whoami")[before:]
    assert [json.loads(r.body)["name"] for r in sent] == ["g1", "g2"]
    assert {r.headers.get("x-key") for r in sent} == {SECRET}
    alice.delete(f"conversations/{room}/tool-grants/{tool}")


@pytest.mark.rule("R-389", "R-387")
def test_a_cancelled_form_settles_the_call_refused_and_the_turn_goes_on(
        world: World, alice: httpx.Client, source: dict[str, Any]) -> None:
    tool = f"openapi__{source['id']}__whoAmI"
    before = len(world.service.received("/api/whoami"))
    room, run_id = _start(world, alice, "who am i there", [(tool, {})])
    # A read asks no approval: the form binds none.
    requested = _event(alice, room, run_id, "credential.requested")["data"]
    assert requested["approval_id"] is None and "approval" not in _plan(
        requested["form_path"])["call"]
    # The admin disables the endpoint: the rendered form is refused, nothing is claimed.
    forms_before = _form_receipts(alice)
    with world.server.client("dave") as dave:
        assert dave.put(f"admin/tool-policies/{tool}/alice",
                        json={"allowed": False}).status_code == 200
        try:
            denied = world.form(requested["form_path"], value=SECRET)
            assert denied.status_code == 403 and 'data-code="operation_denied"' in denied.text
        finally:
            dave.delete(f"admin/tool-policies/{tool}/alice")
    assert _form_receipts(alice) == forms_before
    cancelled = alice.post(f"credentials/requests/{requested['request_id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = alice.post(f"credentials/requests/{requested['request_id']}/cancel")
    assert again.status_code == 409
    with world.server.client("bob") as bob:
        assert bob.post(f"credentials/requests/{requested['request_id']}/cancel"
                        ).status_code == 404
    run = _settled(alice, run_id, timeout=120)
    assert run["status"] == "completed" and run["outcome"] == "answered"
    [settled] = _settled_calls(alice, room, run_id)
    assert settled["outcome"] == "error" and "cancelled" in settled["content"]
    assert world.service.received("/api/whoami")[before:] == []
    # The form of a call no longer waiting is refused.
    late = world.form(requested["form_path"], value=SECRET)
    assert late.status_code == 409 and 'data-code="request_closed"' in late.text


@pytest.mark.rule("R-387")
def test_an_expired_form_settles_the_call_refused(world: World, alice: httpx.Client,
                                                  source: dict[str, Any]) -> None:
    tool = f"openapi__{source['id']}__whoAmI"
    before = len(world.service.received("/api/whoami"))
    room, run_id = _start(world, alice, "who am i later", [(tool, {})])
    requested = _event(alice, room, run_id, "credential.requested")["data"]
    ended = _event(alice, room, run_id, "credential.settled",
                   timeout=FORM_SECONDS + 60)["data"]
    assert ended["status"] == "expired"
    run = _settled(alice, run_id, timeout=120)
    assert run["status"] == "completed"
    [settled] = _settled_calls(alice, room, run_id)
    assert settled["outcome"] == "error" and "expired" in settled["content"]
    late = world.form(requested["form_path"], value=SECRET)
    assert late.status_code == 410 and 'data-code="form_expired"' in late.text
    assert world.service.received("/api/whoami")[before:] == []


def _debug(client: httpx.Client, room: str, run_id: str) -> str:
    return json.dumps([(e["type"], e["data"]) for e in _events(client, room, run_id)
                       if e["type"] not in ("answer.delta",)], indent=0)[:6000]
