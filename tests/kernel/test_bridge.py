"""The tools.call bridge: kernel → loopback HTTP → BridgeHandler → dispatch."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from kaizen_kernel.leases import ActiveCall
from kaizen_server_extension.protocol.tools import Capability
from tests.kernel.conftest import Sandbox

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOOLS = {"lookup": Capability.READ, "search_docs": Capability.READ,
         "mutate": Capability.WRITE, "browse": Capability.SENSITIVE,
         "run_code": Capability.WRITE}


def _post(url: str, body: bytes, token: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


async def post(url: str, payload: Any, token: str | None) -> tuple[int, dict[str, Any]]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return await asyncio.to_thread(_post, url, body, token)


@pytest.mark.rule("R-171")
async def test_tools_call_from_the_kernel_reaches_dispatch(sandbox: Sandbox) -> None:
    before = len(sandbox.dispatch.calls)
    code = ("print(tools.available)\n"
            "print(tools.call('lookup', {'q': 'kaizen'}))\n"
            "print(tools.call('search_docs', query='kernels', limit=2))\n")
    r = await sandbox.service.run("alice", "conv-bridge", code, "python", False, [],
                                  callable_tools=TOOLS, call_context={"run": "r-1"})
    assert r.status == "ok", r
    lines = r.stdout.splitlines()
    # Only advertised READ tools are offered; writes, sensitive tools and run_code are not.
    assert lines[0] == "['lookup', 'search_docs']"
    calls = sandbox.dispatch.calls[before:]
    assert [(c[1], c[2]) for c in calls] == [("lookup", {"q": "kaizen"}),
                                             ("search_docs", {"query": "kernels", "limit": 2})]
    lease = calls[0][0]
    assert (lease.actor, lease.conversation_id) == ("alice", "conv-bridge")
    assert "'echo': {'q': 'kaizen'}" in lines[1] and "'actor': 'alice'" in lines[1]


@pytest.mark.rule("R-174", "R-171")
async def test_kernel_callbacks_to_writes_and_run_code_are_refused(sandbox: Sandbox) -> None:
    before = len(sandbox.dispatch.calls)
    code = ("for name in ('mutate', 'browse', 'run_code', 'not_advertised'):\n"
            "    try:\n"
            "        tools.call(name, {})\n"
            "        print(name, 'ALLOWED')\n"
            "    except tools.ToolCallError as e:\n"
            "        print(name, e.code)\n")
    r = await sandbox.service.run("alice", "conv-bridge", code, "python", False, [],
                                  callable_tools=TOOLS)
    assert r.status == "ok", r
    assert r.stdout.splitlines() == ["mutate write_refused", "browse write_refused",
                                     "run_code recursive_run_code",
                                     "not_advertised unknown_tool"]
    assert len(sandbox.dispatch.calls) == before  # nothing reached dispatch


async def test_bad_expired_and_idle_tokens_are_refused(sandbox: Sandbox) -> None:
    svc = sandbox.service
    lease = svc.leases.acquire("carol", "conv-tok")
    body = {"tool": "lookup", "arguments": {}}
    assert (await post(sandbox.bridge, body, None))[0] == 401
    status, err = await post(sandbox.bridge, body, "not-a-lease-token")
    assert status == 401 and err["error"]["code"] == "unknown_token"
    # A real token outside an execution grants nothing.
    status, err = await post(sandbox.bridge, body, lease.token)
    assert status == 401 and err["error"]["code"] == "expired"
    lease.active = ActiveCall(call_id="c", callable_tools=TOOLS)
    try:
        status, ok = await post(sandbox.bridge, body, lease.token)
        assert status == 200 and ok["ok"] and ok["result"]["tool"] == "lookup"
        status, err = await post(sandbox.bridge, {"tool": "mutate"}, lease.token)
        assert status == 403 and err["error"]["code"] == "write_refused"
        status, err = await post(sandbox.bridge, b"x" * (300 * 1024), lease.token)
        assert status == 413 and err["error"]["code"] == "body_too_large"
        status, err = await post(sandbox.bridge, b"not json", lease.token)
        assert status == 400
    finally:
        lease.active = None
    # A released lease's token is dead.
    lease.active = ActiveCall(call_id="c", callable_tools=TOOLS)
    await svc.release("carol", "conv-tok")
    status, err = await post(sandbox.bridge, body, lease.token)
    assert status == 401 and err["error"]["code"] == "unknown_token"


async def test_bridge_round_trip_figure(sandbox: Sandbox) -> None:
    """Not a timing assertion: prints the figure for the report."""
    code = ("import time\n"
            "t = time.perf_counter()\n"
            "for _ in range(20):\n"
            "    tools.call('lookup', {'q': 1})\n"
            "print(round((time.perf_counter() - t) / 20 * 1000, 2))\n")
    r = await sandbox.service.run("alice", "conv-bridge", code, "python", False, [],
                                  callable_tools=TOOLS)
    assert r.status == "ok", r
    print(f"bridge round trip ms: {r.stdout.strip()}")
