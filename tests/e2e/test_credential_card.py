"""The panel's "Credential required" card end to end in headless Chromium
(``credential_card_driver.mjs``): the model calls an External OpenAPI operation that needs a
credential without one, the call pauses, and the member's panel shows the card with the
destination origin; "Enter credential" opens the signed form in a new tab (origin first), the
member types the value, and the paused call goes out once with it while the card resolves and
the run completes. The value reaches the source only: not the model, the journal or the
result."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kaizen_server_extension.credentials.crypto import new_key_text
from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.credentials.test_broker_rest import _leaks
from tests.e2e.test_panel import REPO, node  # noqa: F401  (the fixture: Node.js, Chromium)
from tests.support.openapi_agent_plugin import OPENAPI_AGENT
from tests.support.openapi_server import OpenApiService, items_document, reaching
from tests.support.server import SERVER_TOKEN, ServerProcess, start_server

DRIVER = Path(__file__).with_name("credential_card_driver.mjs")
SECRET = "typed-for-a-paused-call-5b1e-credential"
OWNER = {"Authorization": f"token {SERVER_TOKEN}"}


@pytest.fixture
def world(node: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, FakeOpenAI,  # noqa: F811
                                                       OpenApiService]]:
    root = tmp_path / "server"
    settings = root / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    # This checkout's built panel, ahead of whatever the environment installed (JUPYTER_PATH
    # comes before every other data directory; the first extension of a name wins).
    extensions = tmp_path / "jupyter-path" / "labextensions"
    extensions.mkdir(parents=True)
    (extensions / "kaizen-jupyter").symlink_to(REPO / "kaizen_server_extension" / "labextension")
    with OpenApiService(tmp_path) as service, \
            FakeOpenAI([{"responses": [{"text": "Default."}]}]) as fake:
        service.serve("/openapi.json", items_document(**{"/api/whoami": {"get": {
            "operationId": "whoAmI", "security": [{"key": []}]}}}))
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), None, extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model",
            "JUPYTER_PATH": os.pathsep.join(filter(None, [
                str(tmp_path / "jupyter-path"), os.environ.get("JUPYTER_PATH", "")])),
            "KAIZEN_PLUGINS": "tests.support.openapi_agent_plugin",
            "KAIZEN_OPENAPI_SOURCES_ENABLED": "1",
            **reaching(service, tmp_path),
            "KAIZEN_CREDENTIALS_ENABLED": "1",
            "KAIZEN_CREDENTIAL_KEY": new_key_text()})
        try:
            yield server, fake, service
        finally:
            server.stop()


def _paused_conversation(server: ServerProcess, fake: FakeOpenAI,
                         service: OpenApiService) -> tuple[str, str]:
    with httpx.Client(base_url=server.base_url + "kaizen/api/", headers=OWNER,
                      timeout=30) as api:
        source = api.post("openapi-sources",
                          json={"schema_url": service.url("/openapi.json")})
        assert source.status_code == 201, source.text
        tool = f"openapi__{source.json()['id']}__whoAmI"
        fake.load([{"match": "who am i", "responses": [
            {"tool_calls": [{"name": tool, "arguments": {}}]}, {"text": "You are known."}]},
            {"responses": [{"text": "Default."}]}])
        room = api.post("conversations", json={"agent_id": OPENAPI_AGENT}).json()["id"]
        sent = api.post(f"conversations/{room}/messages", json={"text": "who am i there"})
        assert sent.status_code == 202, sent.text
        return room, sent.json()["run_id"]


def _journal(server: ServerProcess, room: str) -> list[dict[str, Any]]:
    with httpx.Client(base_url=server.base_url + "kaizen/api/", headers=OWNER,
                      timeout=30) as api:
        return list(api.get(f"conversations/{room}/journal",
                            params={"limit": 1000}).json()["events"])


@pytest.mark.timeout(300)
@pytest.mark.rule("R-388", "R-387", "R-386", "R-391")
def test_the_credential_card_opens_the_form_and_the_paused_call_completes(
        node: str, world: tuple[ServerProcess, FakeOpenAI, OpenApiService],  # noqa: F811
        tmp_path: Path) -> None:
    server, fake, service = world
    shots = Path(os.environ.get("KAIZEN_E2E_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    room, run_id = _paused_conversation(server, fake, service)
    env = {**os.environ, "KAIZEN_E2E_BASE_URL": server.base_url,
           "KAIZEN_E2E_TOKEN": SERVER_TOKEN, "KAIZEN_E2E_CONVERSATION": room,
           "KAIZEN_E2E_ORIGIN": service.origin, "KAIZEN_E2E_SECRET": SECRET,
           "KAIZEN_E2E_SCREENSHOTS": str(shots)}
    result = subprocess.run([node, str(DRIVER)], env=env, capture_output=True, text=True,
                            timeout=240, cwd=REPO)
    assert result.returncode == 0, (
        f"driver failed (screenshots in {shots}):\n{result.stdout[-3000:]}\n"
        f"{result.stderr[-2000:]}\n--- server log ---\n{server.log()[-3000:]}")
    steps = [json.loads(line)["step"] for line in result.stdout.splitlines()
             if line.startswith("{")]
    assert steps == ["card-seen", "form-opened", "form-submitted", "card-resolved", "done"]
    # The paused call went out once, with what was typed, to the source only.
    assert [r.headers.get("x-key") for r in service.received("/api/whoami")] == [SECRET]
    events = _journal(server, room)
    [settled] = [e["data"] for e in events if e["type"] == "tool.settled"
                 and e["run_id"] == run_id]
    assert settled["outcome"] == "ok" and _leaks(settled["content"], SECRET) == []
    assert _leaks(json.dumps(events), SECRET) == []
    assert _leaks(json.dumps(fake.requests()), SECRET) == []
    assert _leaks(server.log(), SECRET) == []
