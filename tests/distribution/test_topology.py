"""docker/compose.yaml's topology, as processes: PostgreSQL, a Jupyter Kernel Gateway, two
Kaizen replicas and Caddy in front of them running docker/Caddyfile itself.

A conversation goes through the proxy (round robin, no sticky sessions); its run_code call
waits for an approval, which is decided through the replica that does *not* hold the run;
the kernel runs on the gateway and calls a read tool back at the holder's bridge; the room's
events websocket, opened through the proxy, sees the run settle; and a login cookie made by
one replica is honoured by the other (one cookie secret, as compose configures).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from kaizen_server_extension.store import create_engine
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import POSTGRES_URL, drop_schema, new_schema
from tests.events.support import connect, read_until
from tests.kernel.test_gateway import GATEWAY_TOKEN, KernelGateway, running_gateway
from tests.support.processes import stop_process
from tests.support.server import SERVER_TOKEN, ServerProcess, free_port, json_of, start_server

REPO = Path(__file__).resolve().parents[2]
CADDYFILE = REPO / "docker" / "Caddyfile"
IN_CI = os.environ.get("CI") == "true"
TERMINAL = ("completed", "failed", "answer_unavailable", "cancelled")

PROBE = """
import json, os
agents = tools.call("list_available_agents")
try:
    tools.call("list_available_agents", {"bogus": 1})  # invalid arguments: a failed result
except tools.ToolCallError:
    pass
print(json.dumps({"ppid": os.getppid(), "agents": sorted(a["name"] for a in agents["agents"])}))
"""
SCRIPTS = [
    {"match": "topology probe", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": PROBE, "language": "python", "persistent": False,
            "artifact_targets": []}}]},
        {"text": "Probed the gateway."}]},
    {"responses": [{"text": "Hello."}]},
]

pytestmark = pytest.mark.skipif(not POSTGRES_URL, reason="needs KAIZEN_TEST_DATABASE_URL "
                                "(replicas share PostgreSQL)")


@dataclass
class Topology:
    proxy: ServerProcess  # the replicas' API as the proxy serves it
    replicas: tuple[ServerProcess, ServerProcess]
    gateway: KernelGateway
    schema: str


def _caddy() -> str:
    caddy = shutil.which("caddy")
    if caddy is None:
        if IN_CI:
            pytest.fail("CI must install Caddy (apt-get install caddy)")
        pytest.skip("caddy is not installed (apt-get install caddy)")
    return caddy


@contextlib.contextmanager
def running_caddy(root: Path, upstreams: list[str]) -> Iterator[str]:
    """docker/Caddyfile, with the replicas' loopback addresses for compose's service names."""
    port = free_port()
    env = {**os.environ, "KAIZEN_PROXY_PORT": str(port), "KAIZEN_UPSTREAMS": " ".join(upstreams),
           "XDG_DATA_HOME": str(root / "caddy-data"), "XDG_CONFIG_HOME": str(root / "caddy")}
    log_path = root / "caddy.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen([_caddy(), "run", "--config", str(CADDYFILE), "--adapter",
                                    "caddyfile"], env=env, stdout=log_file,
                                   stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, log_path.read_text()[-3000:]
            try:
                if httpx.get(url + "kaizen/api/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        yield url
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    root = tmp_path_factory.mktemp("topology")
    schema = new_schema()
    gateway_port = free_port()
    gateway_env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("KAIZEN_", "KERNEL_")) and "DATABASE" not in k}
    gateway_env.update({"JUPYTER_RUNTIME_DIR": str(root / "gw" / "runtime"),
                        "JUPYTER_DATA_DIR": str(root / "gw" / "data"),
                        "JUPYTER_CONFIG_DIR": str(root / "gw" / "config"),
                        "KG_LIST_KERNELS": "True"})
    (root / "gw").mkdir()
    # One cookie secret for both replicas, as compose mounts it from the secrets volume.
    cookie_secret = root / "cookie_secret"
    cookie_secret.write_text(os.urandom(32).hex())
    with contextlib.ExitStack() as stack:
        gateway = stack.enter_context(running_gateway(
            [sys.executable, "-m", "kernel_gateway", "--KernelGatewayApp.ip=127.0.0.1",
             f"--KernelGatewayApp.port={gateway_port}",
             f"--KernelGatewayApp.auth_token={GATEWAY_TOKEN}"],
            gateway_env, root / "gw", gateway_port))
        fake = stack.enter_context(FakeOpenAI(SCRIPTS))
        replicas = []
        for name in ("kaizen-1", "kaizen-2"):
            server = start_server(root / name, POSTGRES_URL, schema, extra_env={
                "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model",
                # compose's settings: every kernel on the gateway, files through the protocol
                "KAIZEN_GATEWAY_WORKSPACE": "transfer", "KAIZEN_LOG_FORMAT": "json",
            }, extra_args=[f"--gateway-url={gateway.url}",
                           f"--GatewayClient.auth_token={GATEWAY_TOKEN}",
                           "--GatewayClient.request_timeout=30",
                           f"--ServerApp.cookie_secret_file={cookie_secret}"])
            stack.callback(server.stop)
            replicas.append(server)
        upstreams = [r.base_url.removeprefix("http://").rstrip("/") for r in replicas]
        proxy_url = stack.enter_context(running_caddy(root, upstreams))
        try:
            yield Topology(replace(replicas[0], base_url=proxy_url),
                           (replicas[0], replicas[1]), gateway, schema)
        finally:
            stack.close()
            asyncio.run(drop_schema(schema))


def _holder(topology: Topology, run_id: str) -> int:
    """Index of the replica holding the run's lease (its owner names host:pid:nonce)."""
    async def owner() -> str:
        engine = create_engine(POSTGRES_URL, schema=topology.schema)
        try:
            async with engine.connect() as conn:
                row = (await conn.execute(text("SELECT lease_owner FROM runs WHERE id = :id"),
                                          {"id": run_id})).one()
                return str(row[0])
        finally:
            await engine.dispose()
    pid = int(asyncio.run(owner()).split(":")[1])
    return [r.process.pid for r in topology.replicas].index(pid)


def _wait(predicate: Any, what: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_turn_crosses_replicas_gateway_and_proxy(topology: Topology) -> None:
    with topology.proxy.client("alice") as alice:
        assert alice.put("members/me/settings",
                         json={"approval_mode": "always_ask"}).status_code == 200
        room = json_of(alice.post("conversations", json={"agent_id": "general"}))["id"]
        accepted = json_of(alice.post(f"conversations/{room}/messages",
                                      json={"text": "topology probe"}))
        run_id = accepted["run_id"]

        def pending() -> dict[str, Any] | None:
            listed = json_of(alice.get("approvals", params={"status": "pending"}))
            return next((a for a in listed if a["run_id"] == run_id), None)

        approval = _wait(pending, "the run_code approval")
        assert approval["tool"] == "run_code"
        holder = _holder(topology, run_id)
        other = topology.replicas[1 - holder]
        # The decision reaches the holder through the database, not through the proxy.
        with other.client("alice") as alice_elsewhere:
            decided = alice_elsewhere.post(f"approvals/{approval['id']}",
                                           json={"decision": "approve"})
            assert decided.status_code == 200, decided.text

        def settled() -> dict[str, Any] | None:
            run = json_of(alice.get(f"runs/{run_id}"))
            return run if run["status"] in TERMINAL else None

        run = _wait(settled, "the run to settle")
        assert run["status"] == "completed", run
        events = json_of(alice.get(f"conversations/{room}/journal",
                                   params={"limit": 1000}))["events"]
    [call] = [e["data"] for e in events
              if e["type"] == "tool.settled" and e["data"]["name"] == "run_code"]
    assert call["outcome"] == "ok", call
    probe = json.loads(json.loads(call["content"])["stdout"])
    assert probe["ppid"] == topology.gateway.process.pid  # the kernel ran on the gateway
    assert probe["agents"] == ["General", "Search"]  # and called back through the bridge
    # The holder's log: the failed bridge call and the settlement carry the run's ids,
    # though the bridge call arrived as an HTTP request outside the run's task.
    lines = [json.loads(line) for line in topology.replicas[holder].log().splitlines()
             if line.startswith("{")]
    mine = [line for line in lines if line.get("run_id") == run_id]
    assert all(line["conversation_id"] == room for line in mine)
    assert any("call=bridge-" in line["message"] for line in mine), mine
    assert any(line["message"].startswith("run settled: status=completed") for line in mine)

    async def watch() -> list[dict[str, Any]]:
        ws = await connect(topology.proxy, "alice", room, after=0)
        try:
            return await read_until(ws, lambda frames: any(
                f.get("type") == "run.terminal" and f.get("run_id") == run_id
                for f in frames), within=30)
        finally:
            ws.close()

    frames = asyncio.run(watch())  # the events websocket, through the proxy
    assert [f["seq"] for f in frames if not f.get("live")] == sorted(
        f["seq"] for f in frames if not f.get("live"))


def test_a_login_cookie_of_one_replica_is_honoured_by_the_other(topology: Topology) -> None:
    """The browser logs in through the proxy; whichever replica answers next must accept the
    cookie. Sent to each replica directly, with the Host the proxy passes on (the cookie's
    name and origin checks follow it)."""
    proxy_host = topology.proxy.base_url.removeprefix("http://").rstrip("/")
    with httpx.Client(base_url=topology.proxy.base_url, timeout=30) as browser:
        assert browser.get("api/me", params={"token": SERVER_TOKEN}).status_code == 200
        cookies = browser.cookies
    assert cookies
    members = []
    for replica in topology.replicas:
        with httpx.Client(base_url=replica.base_url, cookies=cookies, timeout=30,
                          headers={"Host": proxy_host}) as browser:
            me = browser.get("kaizen/api/members/me")
            assert me.status_code == 200, me.text
            members.append(me.json()["member"])
    owner = httpx.get(topology.replicas[0].base_url + "kaizen/api/members/me", timeout=30,
                      headers={"Authorization": f"token {SERVER_TOKEN}"}).json()["member"]
    assert members == [owner, owner]


def test_both_replicas_are_ready_and_linked(topology: Topology) -> None:
    for replica in topology.replicas:
        ready = httpx.get(replica.base_url + "kaizen/api/health/ready", timeout=10).json()
        assert ready == {"status": "ready", "checks": {
            "store": "ok", "migrations": "ok", "events": "ok"}}
