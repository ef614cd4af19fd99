"""With KAIZEN_OPENAPI_SOURCES_ENABLED off (the default) external OpenAPI sources do not exist:
the routes are unknown paths, the OpenAPI document does not name them, admin policy refuses
their names, and a source row already in the database gives no tool and no request (R-378)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kaizen_server_extension.store.openapi_sources import OpenApiSourceStore
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by, with_server_store
from tests.lanes.test_turns import _send, _settled
from tests.support.openapi_agent_plugin import OPENAPI_AGENT
from tests.support.openapi_server import OpenApiService, items_document, reaching
from tests.support.server import ServerProcess


class Off:
    def __init__(self, server: ServerProcess, fake: FakeOpenAI,
                 service: OpenApiService) -> None:
        self.server, self.fake, self.service = server, fake, service


@pytest.fixture(scope="module", params=BACKENDS)
def off(request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Off]:
    root = tmp_path_factory.mktemp(f"openapi-off-{request.param}")
    with OpenApiService(root) as service, \
            FakeOpenAI([{"responses": [{"text": "Hi."}]}]) as fake:
        service.serve("/openapi.json", items_document())
        # Everything else as when the feature is on: only the switch is off.
        with served_by(str(request.param), root, fake, extra_env={
                "KAIZEN_PLUGINS": "tests.support.openapi_agent_plugin",
                **reaching(service, root)}) as proc:
            yield Off(proc, fake, service)


@pytest.mark.rule("R-378")
def test_the_routes_do_not_exist(off: Off) -> None:
    with off.server.client("alice") as alice:
        for response in (alice.get("openapi-sources"),
                         alice.post("openapi-sources", json={
                             "schema_url": off.service.url("/openapi.json")}),
                         alice.get("openapi-sources/s0123456789"),
                         alice.get("openapi-sources/s0123456789/operations")):
            assert response.status_code == 404, response.text
            assert response.json()["error"]["code"] == "not_found"
        paths = alice.get("openapi.json").json()["paths"]
        assert not [p for p in paths if "openapi-sources" in p]
    with off.server.client("dave") as dave:
        refused = dave.put("admin/tool-policies/openapi/*", json={"allowed": False})
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "unknown_tool"
    assert off.service.received() == []


@pytest.mark.rule("R-378")
def test_a_stored_source_gives_no_tool_and_no_request(off: Off) -> None:
    async def plant(store: Store) -> str:
        record = await OpenApiSourceStore(store).create(
            "alice", schema_url=off.service.url("/openapi.json"),
            api_base=off.service.origin, cross_origin=False)
        return record.id

    source_id = with_server_store(off.server, plant)
    with off.server.client("alice") as alice:
        room = alice.post("conversations", json={"agent_id": OPENAPI_AGENT}).json()["id"]
        run = _settled(alice, _send(alice, room, "hello there")["run_id"], timeout=120)
        assert run["status"] == "completed", run
    offered = off.fake.offered("hello there")
    assert "list_available_agents" in offered  # the agent's built-in is there
    assert not [n for n in offered if n.startswith("openapi__")]
    # The management tool does not exist either, though the agent names it.
    assert "manage_openapi_sources" not in offered
    assert source_id and off.service.received() == []
