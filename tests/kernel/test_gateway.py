"""run_code kernels through a real Jupyter gateway (``jupyter kernelgateway`` on loopback).

The Kaizen server runs with ``--gateway-url``; its run_code kernels are started, interrupted,
restarted and deleted on the gateway and spoken to over the gateway's websocket. A kernel's
parent process is the gateway's, which proves where it runs. The gateway is configured to
*accept* the server's secret variable names from a start request, so a leak through our
start request would reach the kernel and fail the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from kaizen_kernel.limits import ExecutionBudget
from kaizen_kernel.remote.client import GatewaySettings, start_env
from kaizen_kernel.service import RunCodeConfig, RunCodeService
from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.processes import stop_process
from tests.support.server import ServerProcess, free_port, start_server

GATEWAY_TOKEN = "gateway-token-for-tests"
MODEL_KEY = "sk-must-not-leak-through-the-gateway"
# Names the gateway would pass from a start request into a kernel (see the module doc).
GATEWAY_ACCEPTS = "KAIZEN_MODEL_API_KEY,KAIZEN_DATABASE_URL,DATABASE_URL,TZ"
OUTPUT_CAP = 2048  # small enough that the whole result fits the model-facing bound
WALL_SECONDS = 3

PROBE = """
import json, os
agents = tools.call("list_available_agents")
refused = {}
for name in ("edit_workspace", "run_code"):
    try:
        tools.call(name, {"edits": "x", "code": "1"})
        refused[name] = "allowed"
    except tools.ToolCallError as exc:
        refused[name] = exc.code
print(json.dumps({
    "value": 6 * 7, "ppid": os.getppid(), "cwd": os.getcwd(),
    "agents": sorted(a["name"] for a in agents["agents"]), "refused": refused,
    "leaked": sorted(k for k in os.environ
                     if k.startswith(("KAIZEN_MODEL", "KAIZEN_DATABASE", "DATABASE",
                                      "KERNEL_KAIZEN"))),
    "tz": os.environ.get("TZ")}))
with open("report.txt", "w") as f:
    f.write("written on the gateway")
"""


def _call(code: str, *, persistent: bool = False,
          targets: list[str] | None = None) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_code", "arguments": {
        "code": code, "language": "python", "persistent": persistent,
        "artifact_targets": targets or []}}]}


SCRIPTS = [
    {"match": "gw probe", "responses": [_call(PROBE, targets=["report.txt"]),
                                        {"text": "probed"}]},
    {"match": "gw flood", "responses": [_call("print('x' * (5 * 1024 * 1024))"),
                                        {"text": "flooded"}]},
    {"match": "gw remember", "responses": [_call("x = 41", persistent=True),
                                           {"text": "remembered"}]},
    {"match": "gw sleep", "responses": [_call("import time\ntime.sleep(60)", persistent=True),
                                        {"text": "slept"}]},
    {"match": "gw recall", "responses": [_call("print(x + 1)", persistent=True),
                                         {"text": "recalled"}]},
    {"match": "gw spin", "responses": [_call("sum(range(10**12))", persistent=True),
                                       {"text": "spun"}]},
    {"match": "gw down", "responses": [_call("print('never runs')"), {"text": "no kernel"}]},
]


@dataclass
class KernelGateway:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    token: str = GATEWAY_TOKEN

    def kernels(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/kernels",
                             headers={"Authorization": f"token {self.token}"}, timeout=5)
        response.raise_for_status()
        return list(response.json())


@contextlib.contextmanager
def running_gateway(command: list[str], env: dict[str, str], root: Path, port: int,
                    token: str = GATEWAY_TOKEN) -> Iterator[KernelGateway]:
    """Start ``jupyter kernelgateway`` (``command``) in ``root``, wait until it lists
    kernels, and stop it afterwards."""
    log_path = root / "gateway.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(command, env=env, cwd=root, stdout=log_file,
                                   stderr=subprocess.STDOUT)
    gateway = KernelGateway(f"http://127.0.0.1:{port}", process, log_path, token)
    deadline = time.monotonic() + 60
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"kernel gateway exited:\n{log_path.read_text()[-3000:]}")
            try:
                gateway.kernels()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield gateway
    finally:
        stop_process(process, grace_s=15)


@pytest.fixture(scope="module")
def kernel_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelGateway]:
    root = tmp_path_factory.mktemp("kernel-gateway")
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KAIZEN_", "KERNEL_")) and "DATABASE" not in k}
    env.update({
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"), "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "KG_LIST_KERNELS": "True", "KG_ENV_WHITELIST": GATEWAY_ACCEPTS,
    })
    command = [sys.executable, "-m", "kernel_gateway", "--KernelGatewayApp.ip=127.0.0.1",
               f"--KernelGatewayApp.port={port}",
               f"--KernelGatewayApp.auth_token={GATEWAY_TOKEN}"]
    with running_gateway(command, env, root, port) as gateway:
        yield gateway


def _gateway_args(url: str) -> list[str]:
    return [f"--gateway-url={url}", f"--GatewayClient.auth_token={GATEWAY_TOKEN}",
            "--GatewayClient.request_timeout=20", "--GatewayClient.gateway_retry_max=1"]


@pytest.fixture(scope="module")
def gateway_server(kernel_gateway: KernelGateway,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("gateway-server")
    with FakeOpenAI(SCRIPTS) as fake:
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake",
            "KAIZEN_MODEL_API_KEY": MODEL_KEY, "KAIZEN_KERNEL_POOL_SIZE": "1",
            "KERNEL_KAIZEN_SERVER_ONLY": "server-side-kernel-variable", "TZ": "Etc/UTC",
            "SANDBOX_MAX_OUTPUT_BYTES": str(OUTPUT_CAP),
            "SANDBOX_MAX_WALL_SECONDS": str(WALL_SECONDS),
        }, extra_args=_gateway_args(kernel_gateway.url))
        try:
            yield server
        finally:
            server.stop()


def _run_code_call(client: httpx.Client, room: str, text: str) -> dict[str, Any]:
    accepted = _send(client, room, text)
    run = _settled(client, accepted["run_id"], timeout=90)
    settled = [e for e in _events(client, room, accepted["run_id"])
               if e["type"] == "tool.settled" and e["data"]["name"] == "run_code"]
    assert len(settled) == 1, run
    data = dict(settled[0]["data"])
    return {"run": run, **data, "body": _body(data)}


def _body(data: dict[str, Any]) -> dict[str, Any]:
    try:
        return dict(json.loads(str(data["content"])))
    except ValueError:
        return {"text": data.get("content")}


def test_the_warm_pool_starts_its_kernel_on_the_gateway(
    kernel_gateway: KernelGateway, gateway_server: ServerProcess,
) -> None:
    deadline = time.monotonic() + 60
    while not kernel_gateway.kernels():
        assert time.monotonic() < deadline, "no warm kernel appeared on the gateway"
        time.sleep(0.1)


@pytest.mark.rule("R-171", "R-174")
def test_run_code_runs_on_the_gateway_and_calls_read_tools_back(
    kernel_gateway: KernelGateway, gateway_server: ServerProcess,
) -> None:
    with gateway_server.client("alice") as alice:
        call = _run_code_call(alice, _room(alice), "gw probe please")
    assert call["outcome"] == "ok", call
    probe = json.loads(call["body"]["stdout"])
    assert probe["value"] == 42
    assert probe["ppid"] == kernel_gateway.process.pid  # started by the gateway, not by us
    assert probe["agents"] == ["General", "Search"]  # tools.call came back over the bridge
    # A write tool is never offered to the kernel (the host passes only read tools), so the
    # bridge refuses it as unknown; run_code itself is refused by name.
    assert probe["refused"] == {"edit_workspace": "unknown_tool",
                                "run_code": "recursive_run_code"}
    # Only allowlisted names went into the start request, though the gateway accepts more.
    assert probe["leaked"] == [] and probe["tz"] == "Etc/UTC"
    assert MODEL_KEY not in json.dumps(call)
    # Same host: the kernel worked in the lease workspace and the file was captured.
    assert [f["name"] for f in call["body"]["files"]] == ["report.txt"]
    assert "/kaizen/sandbox/workspaces/" in probe["cwd"]


def test_the_output_cap_holds_inside_a_gateway_kernel(gateway_server: ServerProcess) -> None:
    with gateway_server.client("bob") as bob:
        call = _run_code_call(bob, _room(bob), "gw flood it")
    body = call["body"]
    assert call["outcome"] == "ok" and body.get("truncated") is True, str(call)[:1500]
    assert 0 < len(body["stdout"].encode()) <= OUTPUT_CAP


def test_a_persistent_gateway_kernel_keeps_state_across_calls_and_interrupts(
    kernel_gateway: KernelGateway, gateway_server: ServerProcess,
) -> None:
    with gateway_server.client("carol") as carol:
        room = _room(carol)
        assert _run_code_call(carol, room, "gw remember x")["outcome"] == "ok"
        slept = _run_code_call(carol, room, "gw sleep now")
        assert slept["body"]["status"] == "timeout", slept  # interrupted through the gateway
        assert slept["body"]["code"] == "wall_time_exceeded"
        assert slept["failure_domain"] == "caller"
        assert slept["body"]["duration_ms"] < (WALL_SECONDS + 10) * 1000
        recalled = _run_code_call(carol, room, "gw recall x")
        assert recalled["outcome"] == "ok" and recalled["body"]["stdout"] == "42\n", recalled
        # Interrupted by a control message over the kernel's websocket, not the gateway's
        # signal-sending REST interrupt.
        assert "/interrupt" not in kernel_gateway.log_path.read_text()
        spun = _run_code_call(carol, room, "gw spin the cpu")  # ignores SIGINT
        assert spun["body"]["status"] == "restarted", spun
        assert spun["body"]["state_lost"] is True and spun["body"]["kernel_restarted"] is True
        lost = _run_code_call(carol, room, "gw recall x again")
        assert lost["body"]["error"]["name"] == "NameError", lost  # the restart lost x


def test_a_gateway_that_is_down_is_the_tools_failure(
    tmp_path: Path,
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    with FakeOpenAI(SCRIPTS) as fake:
        server = start_server(tmp_path, sqlite_url_for(tmp_path / "kaizen.db"), extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake",
            "KAIZEN_KERNEL_POOL_SIZE": "1",
        }, extra_args=_gateway_args(closed))
        try:
            with server.client("alice") as alice:
                call = _run_code_call(alice, _room(alice), "gw down here")
        finally:
            server.stop()
    assert call["outcome"] == "error" and call["failure_domain"] == "tool", call
    assert call["body"].get("code") == "kernel_unavailable", call
    assert "gateway" in call["body"]["message"]
    assert "127.0.0.1" not in call["body"]["message"]  # no address in a model-facing text
    assert call["run"]["status"] == "completed"  # the turn went on and answered


# --- the transfer workspace: a kernel that does not share the server's filesystem ------------


def test_the_start_request_env_is_allowlisted() -> None:
    source = {"LANG": "C.UTF-8", "TZ": "UTC", "PATH": "/server/bin",
              "KAIZEN_MODEL_API_KEY": "k", "DATABASE_URL": "postgres://", "KERNEL_SECRET": "s",
              "OPENAI_API_KEY": "o"}
    env = start_env(source, ("LANG", "TZ", "OPENAI_API_KEY", "KERNEL_SECRET"))
    assert env["LANG"] == "C.UTF-8" and env["TZ"] == "UTC"
    assert not {"PATH", "KAIZEN_MODEL_API_KEY", "DATABASE_URL", "OPENAI_API_KEY"} & set(env)
    assert "KERNEL_SECRET" not in env  # secret-looking even when listed


def test_an_unknown_workspace_mode_is_refused() -> None:
    from kaizen_server_extension.settings import KaizenSettings, SettingsError

    assert KaizenSettings.from_environ(
        {"KAIZEN_GATEWAY_WORKSPACE": "Transfer"}).KAIZEN_GATEWAY_WORKSPACE == "transfer"
    with pytest.raises(SettingsError, match="KAIZEN_GATEWAY_WORKSPACE"):
        KaizenSettings.from_environ({"KAIZEN_GATEWAY_WORKSPACE": "nfs"})
    with pytest.raises(SettingsError, match="KAIZEN_GATEWAY_TRANSFER_MAX_FILES"):
        KaizenSettings.from_environ({"KAIZEN_GATEWAY_TRANSFER_MAX_FILES": "0"})


@pytest_asyncio.fixture
async def transfer_service(kernel_gateway: KernelGateway,
                           tmp_path: Path) -> AsyncIterator[RunCodeService]:
    from jupyter_server.gateway.gateway_client import GatewayClient

    GatewayClient.clear_instance()
    GatewayClient.instance(url=kernel_gateway.url, auth_token=GATEWAY_TOKEN)
    service = RunCodeService(RunCodeConfig(
        state_root=tmp_path, budget=ExecutionBudget(wall_seconds=20, output_bytes=OUTPUT_CAP),
        pool_sizes={"python": 0}, max_file_bytes=2 * 1024 * 1024,
        gateway=GatewaySettings(workspace_mode="transfer")))
    await service.start()
    try:
        yield service
    finally:
        await service.close()
        GatewayClient.clear_instance()


PRODUCE = """
import os
os.makedirs("out", exist_ok=True)
with open("out/data.bin", "wb") as f:
    f.write(bytes(range(256)) * 6144)            # 1.5 MiB: two transfer chunks
with open("big.bin", "wb") as f:
    f.write(b"0" * (3 * 1024 * 1024))            # over the 2 MiB file cap
os.symlink("/etc/passwd", "link.txt")
# The workspace's file was sent before the call; the program removes it.
assert open("stale.txt").read() == "from an earlier call"
os.remove("stale.txt")
print(os.getcwd())
"""


async def test_transfer_mode_copies_declared_files_back_through_the_kernel(
    transfer_service: RunCodeService,
) -> None:
    service = transfer_service
    workspace = service.workspace("erin", "transfer-room")
    (workspace / "stale.txt").write_text("from an earlier call")
    result = await service.run("erin", "transfer-room", PRODUCE, "python", False,
                               ["out/data.bin", "big.bin", "link.txt", "stale.txt"])
    assert result.status == "ok", (result.stderr, result.error_value)
    assert not result.stdout.startswith(str(workspace))  # its own private directory
    files = {f.name: f for f in result.files}
    assert files["out/data.bin"].content == bytes(range(256)) * 6144
    refused = {r.name: r.reason for r in result.refused_files}
    assert refused == {"big.bin": "too_large", "link.txt": "symlink", "stale.txt": "missing"}
    # Removed by the program on the kernel's host: the local copy goes too, never captured
    # as if produced now.
    assert not (workspace / "stale.txt").exists()


async def test_a_kernel_lost_on_the_gateway_mid_call_is_the_tools_failure(
    transfer_service: RunCodeService, kernel_gateway: KernelGateway,
) -> None:
    import asyncio

    from kaizen_kernel.remote.kernel import GatewaySandboxKernel

    service = transfer_service
    call = asyncio.create_task(service.run("frank", "lost-room", "import time\ntime.sleep(30)",
                                           "python", True, []))
    kernel = None
    for _ in range(300):
        lease = service.leases.get("frank", "lost-room")
        kernel = lease.current if lease is not None else None
        if isinstance(kernel, GatewaySandboxKernel) and kernel.binding is not None:
            break
        await asyncio.sleep(0.05)
    assert isinstance(kernel, GatewaySandboxKernel) and kernel.gateway_kernel_id
    await asyncio.sleep(0.5)  # the program is running now
    async with httpx.AsyncClient() as client:  # the gateway loses it (operator, crash, ...)
        response = await client.delete(
            f"{kernel_gateway.url}/api/kernels/{kernel.gateway_kernel_id}",
            headers={"Authorization": f"token {GATEWAY_TOKEN}"})
        assert response.status_code == 204
    result = await asyncio.wait_for(call, 20)
    assert result.code == "kernel_died" and result.failure_domain.value == "tool", result
    assert result.duration_ms < 15_000  # noticed well before the 20 s wall limit
