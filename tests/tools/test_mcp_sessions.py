"""A run's MCP sessions (``RunSessions``) against the real stdio test server: calls share one
session in order, a call given up while it waits is never sent, a call given up after it was
sent stops its session, and the next call gets a fresh one."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from kaizen_server_extension.tools.mcp_sources import (
    McpServer,
    McpSources,
    McpUnavailable,
    RunSessions,
)

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "mcp_server.py"


def _stdio(log: Path) -> tuple[McpServer, RunSessions]:
    server = McpServer(id="local", transport="stdio", command=sys.executable,
                       args=(str(SCRIPT), "stdio", "--log", str(log)), timeout_s=60)
    return server, RunSessions(McpSources([server], stdio_commands=[sys.executable]))


def _ran(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(120)
async def test_calls_share_one_session_in_order(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    server, sessions = _stdio(log)
    try:
        first, second = await asyncio.gather(
            sessions.call(server, "lookup", {"q": "a"}),
            sessions.call(server, "lookup", {"q": "b"}))
        assert "glossary: a" in first["content"][0]["text"]
        assert "glossary: b" in second["content"][0]["text"]
        ran = _ran(log)
        assert [r["arguments"]["q"] for r in ran] == ["a", "b"]
        assert len({r["pid"] for r in ran}) == 1
    finally:
        sessions.close()


@pytest.mark.timeout(120)
async def test_a_call_given_up_while_waiting_is_never_sent(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    server, sessions = _stdio(log)
    try:
        running = asyncio.create_task(sessions.call(server, "slow", {"seconds": 1.5}))
        waiting = asyncio.create_task(sessions.call(server, "record_note", {"text": "no"}))
        await asyncio.sleep(0.2)
        waiting.cancel()
        assert (await running)["content"][0]["text"] == "slow done"
        with pytest.raises(asyncio.CancelledError):
            await waiting
        after = await sessions.call(server, "lookup", {"q": "after"})
        assert "glossary: after" in after["content"][0]["text"]
        assert [r["tool"] for r in _ran(log)] == ["slow", "lookup"]
    finally:
        sessions.close()


@pytest.mark.timeout(120)
async def test_a_call_given_up_after_it_was_sent_stops_its_session(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    server, sessions = _stdio(log)
    try:
        await sessions.call(server, "lookup", {"q": "warm"})
        slow = asyncio.create_task(sessions.call(server, "slow", {"seconds": 5}))
        await asyncio.sleep(1.0)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        again = await sessions.call(server, "lookup", {"q": "again"})
        assert "glossary: again" in again["content"][0]["text"]
        ran = _ran(log)
        # The slow call never answered, and the next one was served by a new process.
        assert [r["tool"] for r in ran] == ["lookup", "lookup"]
        assert ran[0]["pid"] != ran[1]["pid"]
    finally:
        sessions.close()


async def test_a_server_that_cannot_be_reached_refuses_each_waiting_call(
        tmp_path: Path) -> None:
    server = McpServer(id="down", transport="http", url="http://127.0.0.1:9/mcp")
    sessions = RunSessions(McpSources([server]))
    results = await asyncio.gather(sessions.call(server, "lookup", {"q": "a"}),
                                   sessions.call(server, "record_note", {"text": "b"}),
                                   return_exceptions=True)
    assert all(isinstance(r, McpUnavailable) for r in results), results
    assert [str(r) for r in results] == [
        "The MCP server down is not reachable, so lookup was not run. Try again later or "
        "answer without it.",
        "The MCP server down is not reachable, so record_note was not run. Try again later "
        "or answer without it."]
    sessions.close()
