"""A real Jupyter server with the Kaizen extension, in a subprocess, for integration tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

MEMBERS = ("alice", "bob", "carol", "dave")
SERVER_TOKEN = "server-owner-token-0000"


def member_token(member: str) -> str:
    return f"{member}-token-{'x' * 16}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(repr=False)

    def client(self, member: str | None) -> httpx.Client:
        headers = {"Authorization": f"token {member_token(member)}"} if member else {}
        return httpx.Client(base_url=self.base_url + "kaizen/api/", headers=headers,
                            timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def server_env(root: Path, database_url: str, schema: str | None,
               extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAIZEN_")}
    env.update({
        "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "KAIZEN_DATABASE_URL": database_url,
        "KAIZEN_MEMBER_TOKENS": json.dumps({member_token(m): m for m in MEMBERS}),
        "KAIZEN_ADMIN_MEMBERS": "dave",
        # No warm kernels unless a test asks: each costs a core for half a second.
        "KAIZEN_KERNEL_POOL_SIZE": "0",
    })
    if schema:
        env["KAIZEN_DATABASE_SCHEMA"] = schema
    env.update(extra or {})
    return env


def start_server(root: Path, database_url: str, schema: str | None = None, *,
                 extra_env: Mapping[str, str] | None = None,
                 wait: bool = True,
                 extra_args: Sequence[str] = (),
                 wrapper: Sequence[str] = ()) -> ServerProcess:
    """A real Jupyter server with Kaizen on ``database_url``, its log in ``root``.

    ``wrapper`` runs the server under another command, e.g. ``own_pid_namespace()``."""
    root.mkdir(parents=True, exist_ok=True)
    env = server_env(root, database_url, schema, extra_env)
    for attempt in range(PORT_ATTEMPTS):
        port = free_port()
        log_path = root / f"server-{port}.log"
        command = [
            *wrapper, sys.executable, "-m", "jupyter_server",
            "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
            # The port free_port saw may be taken by another test process before the server
            # binds it; moving to the next one silently would leave us polling the wrong
            # port, so the server stops instead and a new port is tried.
            "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={root}",
            f"--IdentityProvider.token={SERVER_TOKEN}",
            "--ServerApp.identity_provider_class="
            "kaizen_server_extension.identity.KaizenTokenIdentityProvider",
            "--ServerApp.jpserver_extensions={'kaizen_server_extension': True}",
            *extra_args,  # e.g. --gateway-url=... (tests/kernel/test_gateway.py)
        ]
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(command, env=env, stdout=log_file,
                                       stderr=subprocess.STDOUT, cwd=root)
        server = ServerProcess(f"http://127.0.0.1:{port}/", process, log_path, env)
        if not wait:
            return server
        try:
            wait_until_ready(server)
        except RuntimeError:
            if attempt + 1 < PORT_ATTEMPTS and port_was_taken(server.process, server.log()):
                continue
            raise
        return server
    raise AssertionError("unreachable")


#: How many ports start_server tries when the one it picked was taken meanwhile.
PORT_ATTEMPTS = 4


def port_was_taken(process: subprocess.Popen[bytes], log: str) -> bool:
    """The server stopped because its port was in use (``port_retries=0``)."""
    return process.poll() is not None and (
        "is already in use" in log or "no available port" in log)


def wait_until_ready(server: ServerProcess, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited early:\n{server.log()[-4000:]}")
        try:
            response = httpx.get(server.base_url + "kaizen/api/agents",
                                 headers={"Authorization": f"token {member_token('alice')}"},
                                 timeout=2)
            if response.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"server did not become ready:\n{server.log()[-4000:]}")


def json_of(response: httpx.Response) -> Any:
    assert response.headers.get("content-type", "").startswith("application/json"), (
        response.status_code, response.text[:200])
    return response.json()


def own_pid_namespace() -> tuple[str, ...] | None:
    """A wrapper that starts a server in a PID namespace of its own, as a replica in another
    container would be (so it is not "this host" to the others, store/runs.py), killed with
    its wrapper; None when the machine cannot (needs root and util-linux's unshare)."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        return None
    return (unshare, "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL")
