"""A real JupyterHub running docs/examples/jupyterhub_config.py: configurable-http-proxy (npm),
the dummy authenticator, one single-user server per Hub user through the simple local
process spawner, and one shared PostgreSQL store.

Hub users are members by their Hub names (the Hub's identity provider stays authoritative:
Kaizen's does not take over inside a Hub-spawned server); a private conversation stays its
owner's across the servers; a shared room is reachable through each participant's own
server; another user's server refuses the caller at the Hub.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import POSTGRES_URL, drop_schema, new_schema
from tests.support.server import free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "jupyterhub_config.py"
IN_CI = os.environ.get("CI") == "true"
SERVICE_TOKEN = "hub-test-service-token-0123456789"
TERMINAL = ("completed", "failed", "answer_unavailable", "cancelled")

pytestmark = pytest.mark.skipif(not POSTGRES_URL, reason="needs KAIZEN_TEST_DATABASE_URL "
                                "(the users' servers share PostgreSQL)")


@dataclass
class Hub:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url + "hub/api/", timeout=60,
                            headers={"Authorization": f"token {SERVICE_TOKEN}"})

    def user(self, name: str, token: str) -> httpx.Client:
        """A client of ``name``'s own server, through the Hub's proxy."""
        return httpx.Client(base_url=f"{self.url}user/{name}/kaizen/api/", timeout=60,
                            headers={"Authorization": f"token {token}"})


def _chp() -> str:
    proxy = shutil.which("configurable-http-proxy")
    if proxy is None:
        if IN_CI:
            pytest.fail("CI must install configurable-http-proxy (npm install -g)")
        pytest.skip("configurable-http-proxy is not installed "
                    "(npm install -g configurable-http-proxy)")
    return proxy


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    proxy = _chp()
    root = tmp_path_factory.mktemp("hub")
    schema = new_schema()
    port, hub_port, api_port = free_port(), free_port(), free_port()
    config = root / "jupyterhub_config.py"
    # The documented file, then only what a test needs: loopback ports, files under root, an
    # admin service that creates users and tokens, the proxy found on PATH.
    config.write_text(f"""
c = get_config()
load_subconfig({str(EXAMPLE)!r})
c.JupyterHub.bind_url = "http://127.0.0.1:{port}/"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub_port}/"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.db_url = "sqlite:///{root / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = {str(root / 'cookie_secret')!r}
c.JupyterHub.pid_file = {str(root / 'hub.pid')!r}
c.Spawner.cmd = [{sys.executable!r}, "-m", "jupyterhub.singleuser"]
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180
c.Spawner.environment["KAIZEN_KERNEL_POOL_SIZE"] = "0"
c.Spawner.args = {["--allow-root"] if os.geteuid() == 0 else []!r}
c.JupyterHub.services = [{{"name": "kaizen-test", "api_token": {SERVICE_TOKEN!r}}}]
c.JupyterHub.load_roles = [{{"name": "kaizen-test", "services": ["kaizen-test"],
    "scopes": ["admin:users", "admin:servers", "tokens", "access:servers"]}}]
""")
    with FakeOpenAI([{"responses": [{"text": "Hello from the Hub."}]}]) as fake:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KAIZEN_", "JUPYTER"))}
        env.update({"KAIZEN_DATABASE_URL": POSTGRES_URL, "KAIZEN_DATABASE_SCHEMA": schema,
                     "KAIZEN_ADMIN_MEMBERS": "alice", "KAIZEN_HUB_HOMES": str(root / "homes"),
                     "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model",
                     "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"})
        log_path = root / "hub.log"
        with log_path.open("wb") as log_file:
            process = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config)],
                                       cwd=root, env=env, stdout=log_file,
                                       stderr=subprocess.STDOUT)
        hub = Hub(f"http://127.0.0.1:{port}/", process, log_path)
        try:
            _wait(lambda: _hub_up(hub), "the Hub", 90, hub)
            yield hub
        finally:
            process.terminate()  # the Hub stops its users' servers and its proxy
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
            asyncio.run(drop_schema(schema))


def _hub_up(hub: Hub) -> bool:
    try:
        return httpx.get(hub.url + "hub/api/", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(predicate: Any, what: str, timeout: float, hub: Hub) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert hub.process.poll() is None, hub.log_path.read_text()[-4000:]
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}:\n{hub.log_path.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def tokens(hub: Hub) -> dict[str, str]:
    """alice and bob, each with a running server and an API token of their own."""
    issued: dict[str, str] = {}
    with hub.admin() as admin:
        for name in ("alice", "bob"):
            assert admin.post(f"users/{name}").status_code in (201, 409)
            started = admin.post(f"users/{name}/server")
            assert started.status_code in (201, 202), started.text

            def ready(name: str = name) -> bool:
                server = admin.get(f"users/{name}").json()["servers"].get("", {})
                return bool(server.get("ready"))

            _wait(ready, f"{name}'s server", 180, hub)
            token = admin.post(f"users/{name}/tokens", json={"note": "kaizen test"})
            assert token.status_code == 201, token.text
            issued[name] = token.json()["token"]
    return issued


def test_hub_users_are_members_by_their_hub_names(hub: Hub, tokens: dict[str, str]) -> None:
    for name in ("alice", "bob"):
        with hub.user(name, tokens[name]) as api:
            me = api.get("members/me")
            assert me.status_code == 200, me.text
            assert me.json() == {"member": name, "admin": name == "alice"}


def test_another_users_server_refuses_the_caller(hub: Hub, tokens: dict[str, str]) -> None:
    with httpx.Client(base_url=f"{hub.url}user/alice/kaizen/api/", timeout=60,
                      headers={"Authorization": f"token {tokens['bob']}"}) as bob_at_alice:
        # The Hub grants bob no access to alice's server: no identity there at all.
        assert bob_at_alice.get("members/me").status_code in (401, 403)


def test_one_store_serves_every_users_server(hub: Hub, tokens: dict[str, str]) -> None:
    with hub.user("alice", tokens["alice"]) as alice, hub.user("bob", tokens["bob"]) as bob:
        private = alice.post("conversations", json={"agent_id": "general"}).json()
        room = alice.post("conversations", json={"agent_id": "general", "shared": True}).json()
        assert alice.post(f"conversations/{room['id']}/participants",
                          json={"member": "bob"}).status_code == 200
        # bob, through his own server: the shared room is there, alice's private one is not.
        assert bob.get(f"conversations/{private['id']}").status_code == 404
        assert bob.get(f"conversations/{room['id']}").json()["participants"] == ["alice", "bob"]
        accepted = bob.post(f"conversations/{room['id']}/messages", json={"text": "hi"})
        assert accepted.status_code == 202, accepted.text
        run_id = accepted.json()["run_id"]

        def settled() -> dict[str, Any] | None:
            run = alice.get(f"runs/{run_id}").json()  # read through alice's server
            return run if run.get("status") in TERMINAL else None

        run = _wait(settled, "the shared room's run", 60, hub)
        assert run["status"] == "completed" and run["member"] == "bob", run
