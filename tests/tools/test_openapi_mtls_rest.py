"""A source whose document requires mutual TLS, end to end on both databases (R-392): the
``mutualTLS`` scheme becomes a credential destination, the member pastes a client certificate
and key into the signed form (on one line, as a browser's field leaves them), the model passes
only the opaque reference, and the one call's TLS connection presents the certificate to the
local HTTPS service — staged in /dev/shm while it loads and gone afterwards; nothing of the
key reaches the result, the journal, the model or the server's log."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from kaizen_server_extension.credentials.crypto import new_key_text
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from kaizen_server_extension.tools.mtls import STAGING_ROOT, _memory_backed
from tests.conftest import BACKENDS, served_by, with_server_store
from tests.support.openapi_agent_plugin import OPENAPI_AGENT
from tests.support.openapi_server import OpenApiService, items_document, reaching
from tests.support.server import ServerProcess, member_token
from tests.support.tool_turns import settled_calls_of_turn

pytestmark = pytest.mark.skipif(not _memory_backed(STAGING_ROOT),
                                reason="needs a memory-backed /dev/shm")


def _document() -> dict[str, Any]:
    document = items_document(**{"/api/peer": {"get": {"operationId": "whoIsPeer",
                                                       "security": [{"npe": []}]}}})
    document["components"]["securitySchemes"]["npe"] = {"type": "mutualTLS"}
    return document


class World:
    def __init__(self, server: ServerProcess, fake: FakeOpenAI, service: OpenApiService,
                 leaf: trustme.LeafCert) -> None:
        self.server, self.fake, self.service, self.leaf = server, fake, service, leaf

    def turn(self, name: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        return settled_calls_of_turn(self.server, self.fake, "alice", OPENAPI_AGENT,
                                     f"call {name} now {len(self.fake.requests())}",
                                     name, arguments)


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp(f"openapi-mtls-{request.param}")
    client_ca = trustme.CA()
    leaf = client_ca.issue_cert("alice-client", common_name="alice-client")
    with OpenApiService(root, client_ca=client_ca, client_cert_optional=True) as service, \
            FakeOpenAI([{"responses": [{"text": "Default."}]}]) as fake:
        service.serve("/openapi.json", _document())
        with served_by(str(request.param), root, fake, extra_env={
                "KAIZEN_PLUGINS": "tests.support.openapi_agent_plugin",
                "KAIZEN_OPENAPI_SOURCES_ENABLED": "1",
                **reaching(service, root),
                "KAIZEN_CREDENTIALS_ENABLED": "1",
                "KAIZEN_CREDENTIAL_KEY": new_key_text()}) as server:
            with server.client("alice") as alice:
                assert alice.put("members/me/settings",
                                 json={"approval_mode": "never_ask"}).status_code == 200
            yield World(server, fake, service, leaf)


def _staged() -> list[Path]:
    return sorted(STAGING_ROOT.glob("kaizen-mtls-*"))


@pytest.mark.rule("R-392", "R-386", "R-350")
def test_a_client_certificate_entered_in_the_form_reaches_the_source_over_mutual_tls(
        world: World) -> None:
    with world.server.client("alice") as alice:
        created = alice.post("openapi-sources",
                             json={"schema_url": world.service.url("/openapi.json")})
        assert created.status_code == 201, created.text
        source = created.json()["id"]
        # The document's API-key scheme is another destination; this is its mutualTLS one.
        [destination] = [d for d in alice.get("credentials/destinations").json()
                         if d["id"].startswith(f"oas-{source}-")
                         and d["scheme"] == {"kind": "mtls", "name": None}]
        issued = alice.post("credentials/forms", json={"destination": destination["id"]})
        assert issued.status_code == 201, issued.text
        form_url = issued.json()["form_url"]
    auth = {"Authorization": f"token {member_token('alice')}"}
    base = world.server.base_url.rstrip("/")
    page = httpx.get(base + form_url, headers=auth, timeout=30)
    assert page.status_code == 200 and "Client certificate (PEM)" in page.text
    certificate = world.leaf.cert_chain_pems[0].bytes().decode()
    key = world.leaf.private_key_pem.bytes().decode()
    answer = httpx.post(base + form_url, headers=auth, timeout=30, data={
        "certificate": certificate.replace("\n", ""), "private_key": key.replace("\n", "")})
    assert answer.status_code == 200, answer.text
    found = re.search(r'id="kz-credential-ref">(cref_[A-Za-z0-9_-]+)<', answer.text)
    assert found, answer.text
    ref = found.group(1)

    before = _staged()
    tool = f"openapi__{source}__whoIsPeer"
    [settled] = world.turn(tool, {"credential_ref": ref})
    assert settled["outcome"] == "ok", settled
    assert "alice-client" in settled["content"]
    [received] = world.service.received("/api/peer")
    assert received.peer == "alice-client"
    # Staged only while loading: nothing is left in /dev/shm.
    assert _staged() == before
    # No line of the key reaches the model, the journal or the server's log.
    key_lines = [line for line in key.splitlines() if not line.startswith("-----")]

    def leaked(text: str) -> list[str]:
        return [line for line in key_lines if line in text]

    assert leaked(json.dumps(world.fake.requests())) == []
    assert leaked(world.server.log()) == []

    async def journal(store: Any) -> str:
        from sqlalchemy import select

        from kaizen_server_extension.store import models as m

        async with store.transaction() as tx:
            rows = (await tx.session.execute(select(m.JournalEvent))).scalars()
            return json.dumps([r.data for r in rows], default=str)

    assert leaked(with_server_store(world.server, journal)) == []
    # Used once: a second call with the same reference is refused and sends nothing.
    [again] = world.turn(tool, {"credential_ref": ref})
    assert again["outcome"] == "error"
    assert len(world.service.received("/api/peer")) == 1
