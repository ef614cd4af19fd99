"""Kaizen as an MCP server (opt-in): a real server with ``KAIZEN_MCP_SERVE_ENABLED``, reached by
the official SDK's client over streamable HTTP with a member's Jupyter token. The member's
read tools are listed and called through the guarded pipeline; writes are not served, admin
policy bites per call, one member cannot read another's artifact, and with the setting off
the path does not exist."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import select

from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.store import Store
from tests.conftest import scripted_server, with_server_store
from tests.lanes.test_turns import _send, _settled
from tests.support.server import ServerProcess, member_token

SERVED = {"inspect_library", "inspect_tasks", "list_available_agents", "read_artifact",
          "read_notebook",
          # Retrieval (docs/retrieval.md); request_document needs a run's search and run_code.
          "search", "query_document", "conversation_history_search", "search_about"}
SCRIPTS: list[dict[str, Any]] = [
    {"match": "save my note", "responses": [
        {"tool_calls": [{"name": "create_artifact", "arguments": {
            "title": "Served note", "kind": "markdown", "content": "# Served\nsecret line\n"}}]},
        {"text": "Saved."}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("mcp-serving")
    with scripted_server("sqlite", root, SCRIPTS,
                         extra_env={"KAIZEN_MCP_SERVE_ENABLED": "1"}) as proc:
        yield proc


async def _session(server: ServerProcess, member: str, work: Any) -> Any:
    http = httpx2.AsyncClient(headers={"Authorization": f"token {member_token(member)}"},
                              timeout=30)
    async with http, Client(streamable_http_client(server.base_url + "kaizen/mcp",
                                                   http_client=http), cache=None) as client:
        return await work(client)


def _with_client(server: ServerProcess, member: str, work: Any) -> Any:
    return asyncio.run(_session(server, member, work))


def _alice_artifact(server: ServerProcess) -> str:
    with server.client("alice") as alice:
        room = alice.post("conversations", json={"agent_id": "general"}).json()["id"]
        run = _settled(alice, _send(alice, room, "save my note")["run_id"])
        assert run["status"] == "completed", run
        [artifact] = [a for a in alice.get("artifacts").json()
                      if a["title"] == "Served note"]
        return str(artifact["id"])


def test_the_members_read_tools_are_listed_and_nothing_else(serving: ServerProcess) -> None:
    async def work(client: Any) -> Any:
        return await client.list_tools()

    listed = _with_client(serving, "alice", work)
    names = {t.name for t in listed.tools}
    assert names == SERVED
    assert all(t.annotations.read_only_hint is True for t in listed.tools)


def test_a_read_tool_runs_through_the_pipeline_as_the_member(serving: ServerProcess) -> None:
    artifact = _alice_artifact(serving)

    async def read(client: Any) -> Any:
        return await client.call_tool("read_artifact", {"artifact_id": artifact})

    result = _with_client(serving, "alice", read)
    assert result.is_error is False
    assert "secret line" in result.content[0].text
    # Another member's identity cannot read it: the tool's own access check answers.
    other = _with_client(serving, "bob", read)
    assert other.is_error is True and "secret line" not in other.content[0].text

    async def audit(store: Store) -> list[dict[str, Any]]:
        async with store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.AuditEvent.actor, m.AuditEvent.data)
                .where(m.AuditEvent.action == "tool.call"))).all()
        return [{"actor": actor, **data} for actor, data in rows
                if data.get("via") == "mcp_server"]

    served = with_server_store(serving, audit)
    assert {(r["actor"], r["tool"], r["outcome"]) for r in served} >= {
        ("alice", "read_artifact", "ok"), ("bob", "read_artifact", "error")}


def test_a_write_tool_is_not_served(serving: ServerProcess) -> None:
    async def write(client: Any) -> Any:
        return await client.call_tool("create_artifact", {
            "title": "Via MCP", "kind": "markdown", "content": "# no\n"})

    result = _with_client(serving, "carol", write)
    assert result.is_error is True
    assert "not available" in result.content[0].text
    with serving.client("carol") as carol:
        assert not [a for a in carol.get("artifacts").json()
                    if a["title"] == "Via MCP"]


@pytest.mark.rule("R-005")
def test_admin_policy_is_read_on_every_served_call(serving: ServerProcess) -> None:
    async def agents(client: Any) -> Any:
        return await client.call_tool("list_available_agents", {})

    assert _with_client(serving, "dave", agents).is_error is False
    with serving.client("dave") as dave:
        assert dave.put("admin/tool-policies/list_available_agents/dave",
                        json={"allowed": False}).status_code == 200
    try:
        async def both(client: Any) -> Any:
            return await client.list_tools(), await client.call_tool(
                "list_available_agents", {})

        listed, refused = _with_client(serving, "dave", both)
        assert "list_available_agents" not in {t.name for t in listed.tools}
        assert refused.is_error is True and "permission" in refused.content[0].text
    finally:
        with serving.client("dave") as dave:
            dave.delete("admin/tool-policies/list_available_agents/dave")


def test_the_endpoint_needs_a_member(serving: ServerProcess) -> None:
    response = httpx.post(serving.base_url + "kaizen/mcp", json={
        "jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert response.status_code in (401, 403)


def test_with_the_setting_off_the_endpoint_does_not_exist(server: ServerProcess) -> None:
    response = httpx.post(server.base_url + "kaizen/mcp", json={
        "jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Authorization": f"token {member_token('alice')}"})
    assert response.status_code == 404
