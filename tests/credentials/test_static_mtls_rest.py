"""An administrator's static mutual-TLS destination with an encrypted private key, end to end
on both databases: the form asks for the certificate, the key and the key's optional
passphrase; a wrong passphrase is refused at submit with nothing stored; with the right one
the model passes only the opaque reference and the broker's own connection presents the
certificate to a local HTTPS service on loopback that refuses connections without one. The
key is staged — still encrypted — in /dev/shm only while the TLS context loads it (R-392).
The passphrase never reaches the journal, the audit log, the tool result (even when the
service echoes it), the model or the server's log."""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    PrivateFormat,
    load_pem_private_key,
)
from sqlalchemy import select

from kaizen_server_extension.credentials.crypto import new_key_text
from kaizen_server_extension.policy.redaction import REDACTED
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from kaizen_server_extension.tools.mtls import STAGING_ROOT, _memory_backed
from tests.conftest import BACKENDS, served_by, with_server_store
from tests.support.mtls_agent_plugin import DESTINATION, MTLS_AGENT, PEER_TOOL
from tests.support.openapi_server import OpenApiService
from tests.support.server import ServerProcess, member_token
from tests.support.tool_turns import settled_calls_of_turn

pytestmark = pytest.mark.skipif(not _memory_backed(STAGING_ROOT),
                                reason="needs a memory-backed /dev/shm")

PASSPHRASE = "pp-Vq93-unique-passphrase-20261206"
WRONG = "wrong-Kx71-unique-passphrase-20261206"


class World:
    def __init__(self, server: ServerProcess, fake: FakeOpenAI, service: OpenApiService,
                 leaf: trustme.LeafCert) -> None:
        self.server, self.fake, self.service, self.leaf = server, fake, service, leaf

    # PEM on one line, as a browser's single-line field leaves it.
    @property
    def certificate(self) -> str:
        return self.leaf.cert_chain_pems[0].bytes().decode().replace("\n", "")

    def encrypted_key(self, *, one_line: bool = True) -> str:
        key = load_pem_private_key(self.leaf.private_key_pem.bytes(), password=None)
        pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8,
                                BestAvailableEncryption(PASSPHRASE.encode())).decode()
        return pem.replace("\n", "") if one_line else pem

    def form(self) -> str:
        with self.server.client("alice") as alice:
            issued = alice.post("credentials/forms", json={"destination": DESTINATION})
            assert issued.status_code == 201, issued.text
            return str(issued.json()["form_url"])

    def submit(self, form_url: str, **fields: str) -> httpx.Response:
        return httpx.post(self.server.base_url.rstrip("/") + form_url, data=fields,
                          headers={"Authorization": f"token {member_token('alice')}"},
                          timeout=30)

    def turn(self, ref: str) -> dict[str, Any]:
        [settled] = settled_calls_of_turn(
            self.server, self.fake, "alice", MTLS_AGENT,
            f"who am I now {len(self.fake.requests())}", PEER_TOOL, {"credential_ref": ref})
        return settled

    def stored(self) -> dict[str, str]:
        """Every credential row, audit row and journal event, as text."""
        async def read(store: Store) -> dict[str, str]:
            async with store.transaction() as tx:
                def rows(model: Any) -> Any:
                    return tx.session.execute(select(model))

                secrets = (await rows(m.CredentialSecret)).scalars().all()
                receipts = (await rows(m.CredentialReceipt)).scalars().all()
                audit = (await rows(m.AuditEvent)).scalars().all()
                journal = (await rows(m.JournalEvent)).scalars().all()
                return {
                    "secrets": repr([(s.ref, bytes(s.sealed)) for s in secrets]),
                    "receipts": json.dumps([{c.name: getattr(r, c.name)
                                             for c in m.CredentialReceipt.__table__.columns}
                                            for r in receipts], default=str),
                    "audit": json.dumps([[a.action, a.data] for a in audit], default=str),
                    "journal": json.dumps([[j.type, j.data] for j in journal], default=str)}
        return with_server_store(self.server, read)


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp(f"static-mtls-{request.param}")
    client_ca = trustme.CA()
    leaf = client_ca.issue_cert("alice-client", common_name="alice-client")
    with OpenApiService(root, client_ca=client_ca) as service, \
            FakeOpenAI([{"responses": [{"text": "Default."}]}]) as fake:
        destinations = [{"id": DESTINATION, "origin": service.origin,
                         "scheme": {"kind": "mtls"}, "label": "Peer service",
                         "ca_file": str(service.ca_file)}]
        with served_by(str(request.param), root, fake, extra_env={
                "KAIZEN_PLUGINS": "tests.support.mtls_agent_plugin",
                "KAIZEN_CREDENTIALS_ENABLED": "1",
                "KAIZEN_CREDENTIAL_KEY": new_key_text(),
                "KAIZEN_CREDENTIAL_REMEMBER_ENABLED": "1",
                "KAIZEN_CREDENTIAL_DESTINATIONS": json.dumps(destinations)}) as server:
            yield World(server, fake, service, leaf)


def _staged() -> list[Path]:
    return sorted(STAGING_ROOT.glob("kaizen-mtls-*"))


def _reference(answer: httpx.Response) -> str:
    assert answer.status_code == 200, answer.text
    found = re.search(r'id="kz-credential-ref">(cref_[A-Za-z0-9_-]+)<', answer.text)
    assert found, answer.text
    return found.group(1)


def test_the_service_really_requires_a_client_certificate(world: World) -> None:
    context = ssl.create_default_context(cafile=str(world.service.ca_file))
    with pytest.raises((httpx.HTTPError, ssl.SSLError, OSError)):
        httpx.get(world.service.url("/api/peer"), verify=context, timeout=10).json()
    assert all(r.peer for r in world.service.received())


def test_the_destination_lists_a_value_free_form_with_an_optional_passphrase(
        world: World) -> None:
    with world.server.client("alice") as alice:
        [listed] = [d for d in alice.get("credentials/destinations").json()
                    if d["id"] == DESTINATION]
        document = alice.get("openapi.json").json()
    assert listed["origin"] == world.service.origin
    assert listed["scheme"] == {"kind": "mtls", "name": None}
    assert listed["fields"] == [{"name": "certificate", "required": True},
                                {"name": "private_key", "required": True},
                                {"name": "passphrase", "required": False}]
    served = document["components"]["schemas"]["CredentialDestination"]["properties"]
    assert "mtls" in served["scheme"]["properties"]["kind"]["enum"]
    assert "passphrase" in served["fields"]["items"]["properties"]["name"]["enum"]
    page = httpx.get(world.server.base_url.rstrip("/") + world.form(), timeout=30,
                     headers={"Authorization": f"token {member_token('alice')}"})
    assert page.status_code == 200
    [passphrase] = re.findall(r'<input id="kz-passphrase"[^>]*>', page.text)
    assert 'type="password"' in passphrase and "required" not in passphrase
    assert "value=" not in passphrase
    [key] = re.findall(r'<input id="kz-private_key"[^>]*>', page.text)
    assert "required" in key


@pytest.mark.parametrize(("passphrase", "code"), [
    (WRONG, "mtls_passphrase_wrong"), ("", "mtls_passphrase_required")])
def test_a_wrong_or_missing_passphrase_is_refused_at_submit_and_nothing_is_stored(
        world: World, passphrase: str, code: str) -> None:
    before = world.stored()
    form_url = world.form()
    refused = world.submit(form_url, certificate=world.certificate,
                           private_key=world.encrypted_key(), passphrase=passphrase,
                           remember="yes")
    assert refused.status_code == 422, refused.text
    assert f'data-code="{code}"' in refused.text and "Nothing was stored." in refused.text
    assert "passphrase" in refused.text.lower()
    assert world.stored() == before  # no secret, no receipt, no audit row, no event
    assert WRONG not in refused.text and PASSPHRASE not in refused.text
    # The nonce was not claimed: the same form takes the right passphrase.
    assert _reference(world.submit(form_url, certificate=world.certificate,
                                   private_key=world.encrypted_key(),
                                   passphrase=PASSPHRASE)).startswith("cref_")


def test_a_passphrase_for_a_key_that_is_not_encrypted_is_refused(world: World) -> None:
    before = world.stored()
    refused = world.submit(world.form(), certificate=world.certificate,
                           private_key=world.leaf.private_key_pem.bytes().decode()
                           .replace("\n", ""),
                           passphrase=PASSPHRASE)
    assert refused.status_code == 422
    assert 'data-code="mtls_passphrase_unexpected"' in refused.text
    assert world.stored() == before


@pytest.mark.rule("R-392", "R-396", "R-386", "R-443")
@pytest.mark.parametrize("remember", [
    # Used once (the default): one request, then spent; nothing of it is stored.
    pytest.param(False, id="once", marks=pytest.mark.rule("R-391")),
    pytest.param(True, id="remembered")])
def test_an_encrypted_key_with_its_passphrase_reaches_the_service_over_mutual_tls(
        world: World, remember: bool) -> None:
    key = world.encrypted_key(one_line=False)
    fields = {"certificate": world.certificate,
              "private_key": key.replace("\n", ""), "passphrase": PASSPHRASE,
              **({"remember": "yes"} if remember else {})}
    ref = _reference(world.submit(world.form(), **fields))
    stored = world.stored()
    if remember:
        assert ref in stored["secrets"]  # sealed: kept, but not as text
    # The service echoes the passphrase back, as a careless service might.
    world.service.state.peer_note = f"your passphrase was {PASSPHRASE}"
    before, received = _staged(), len(world.service.received("/api/peer"))
    try:
        settled = world.turn(ref)
    finally:
        world.service.state.peer_note = ""
    assert settled["outcome"] == "ok", settled
    assert "alice-client" in settled["content"]
    # The echo came back, and the broker's echo guard took the passphrase out of it.
    assert f"your passphrase was {REDACTED}" in settled["content"], settled["content"]
    [*_, last] = world.service.received("/api/peer")
    assert len(world.service.received("/api/peer")) == received + 1
    assert last.peer == "alice-client"
    # Nothing of the certificate rode in a header; nothing is left in /dev/shm.
    assert not {"authorization", "cookie"} & {h.lower() for h in last.headers}
    assert _staged() == before
    # The passphrase is nowhere: result, journal, audit, stored rows, model, server log.
    key_lines = [line for line in key.splitlines() if not line.startswith("-----")]
    everywhere = {"result": settled["content"], **world.stored(),
                  "model": json.dumps(world.fake.requests()), "log": world.server.log()}
    for where, text in everywhere.items():
        assert PASSPHRASE not in text, where
        assert WRONG not in text, where
        assert not [line for line in key_lines if line in text], where
    if not remember:
        # Used once: the same reference again is refused and nothing is sent.
        again = world.turn(ref)
        assert again["outcome"] == "error"
        assert len(world.service.received("/api/peer")) == received + 1
