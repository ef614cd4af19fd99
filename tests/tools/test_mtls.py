"""Mutual-TLS client material (R-392): staged only in /dev/shm, owner-only, while the TLS
context loads it, then removed; and a source that requires a client certificate is reached
with the member's, through the egress door, against a real local HTTPS service on loopback
that refuses connections without one."""

from __future__ import annotations

import json
import os
import ssl
import stat
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

from kaizen_server_extension.credentials.broker import Injector, _Held
from kaizen_server_extension.credentials.destinations import Destination, make_scheme
from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.tools.egress import (
    Egress,
    EgressFailed,
    EgressPolicy,
    Origin,
    OutgoingRequest,
)
from kaizen_server_extension.tools.mtls import (
    STAGING_ROOT,
    ClientCertificate,
    MtlsUnavailable,
    _memory_backed,
    check_client_material,
    load_client_certificate,
)
from kaizen_server_extension.tools.openapi_compiler import CompiledAuth, compile_document
from tests.support.egress_policy import PolicySigner
from tests.support.openapi_server import OpenApiService

pytestmark = pytest.mark.skipif(not _memory_backed(STAGING_ROOT),
                                reason="needs a memory-backed /dev/shm")


@pytest.fixture(scope="module")
def client_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def alice_cert(client_ca: trustme.CA) -> trustme.LeafCert:
    return client_ca.issue_cert("alice-client", common_name="alice-client")


@pytest.fixture
def service(tmp_path: Path, client_ca: trustme.CA) -> Iterator[OpenApiService]:
    with OpenApiService(tmp_path, client_ca=client_ca) as running:
        yield running


def _material(leaf: trustme.LeafCert, *, one_line: bool = False) -> ClientCertificate:
    certificate = leaf.cert_chain_pems[0].bytes().decode()
    key = leaf.private_key_pem.bytes().decode()
    if one_line:  # as a browser's single-line field leaves it
        certificate, key = certificate.replace("\n", ""), key.replace("\n", "")
    return ClientCertificate.from_fields(certificate, key)


def _encrypted(leaf: trustme.LeafCert, passphrase: bytes) -> str:
    key = load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8,
                             BestAvailableEncryption(passphrase)).decode()


def _staged() -> list[str]:
    return sorted(p.name for p in STAGING_ROOT.glob("kaizen-mtls-*"))


class Watching(ssl.SSLContext):
    """A TLS context that records what the staged files look like at the moment it loads."""

    seen: list[dict[str, Any]]

    def load_cert_chain(self, certfile: Any, keyfile: Any = None,
                        password: Any = None) -> None:
        self.seen = []
        for name in (certfile, keyfile):
            path = Path(name)
            self.seen.append({
                "path": path, "mode": stat.S_IMODE(path.stat().st_mode),
                "dir_mode": stat.S_IMODE(path.parent.stat().st_mode),
                "owner": path.stat().st_uid, "text": path.read_text()})
        super().load_cert_chain(certfile, keyfile, password)


@pytest.mark.rule("R-392")
def test_material_is_staged_owner_only_in_dev_shm_while_loading_then_removed(
        alice_cert: trustme.LeafCert) -> None:
    before = _staged()
    context = Watching(ssl.PROTOCOL_TLS_CLIENT)
    material = _material(alice_cert)
    load_client_certificate(context, material)
    certificate, key = context.seen
    for seen in (certificate, key):
        assert seen["path"].parent.parent == STAGING_ROOT
        assert seen["mode"] == 0o600 and seen["dir_mode"] == 0o700
        assert seen["owner"] == os.getuid()
        assert not seen["path"].exists() and not seen["path"].parent.exists()
    assert certificate["text"] == material.certificate and key["text"] == material.private_key
    assert _staged() == before


@pytest.mark.rule("R-392")
def test_the_staging_is_removed_when_loading_fails(client_ca: trustme.CA,
                                                   alice_cert: trustme.LeafCert) -> None:
    before = _staged()
    other = client_ca.issue_cert("someone-else")
    mismatched = ClientCertificate(_material(alice_cert).certificate,
                                   _material(other).private_key)
    with pytest.raises(MtlsUnavailable) as refused:
        load_client_certificate(ssl.create_default_context(), mismatched)
    assert refused.value.code == "mtls_material_invalid"
    assert _staged() == before


@pytest.mark.rule("R-392")
def test_without_a_memory_file_system_nothing_is_staged_anywhere(
        tmp_path: Path, alice_cert: trustme.LeafCert) -> None:
    """A directory on disk is never used instead: refused before anything is written."""
    with pytest.raises(MtlsUnavailable) as refused:
        load_client_certificate(ssl.create_default_context(), _material(alice_cert),
                                root=tmp_path)
    assert refused.value.code == "mtls_unavailable"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.rule("R-392")
def test_a_key_with_a_passphrase_loads_and_a_wrong_one_is_refused(
        alice_cert: trustme.LeafCert) -> None:
    key = load_pem_private_key(alice_cert.private_key_pem.bytes(), password=None)
    encrypted = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8,
                                  BestAvailableEncryption(b"open sesame")).decode()
    certificate = _material(alice_cert).certificate
    load_client_certificate(ssl.create_default_context(),
                            ClientCertificate.from_fields(certificate, encrypted, "open sesame"))
    # A wrong passphrase, or none (never an OpenSSL prompt on the server's terminal).
    for wrong in ("wrong", ""):
        with pytest.raises(MtlsUnavailable):
            load_client_certificate(ssl.create_default_context(),
                                    ClientCertificate.from_fields(certificate, encrypted, wrong))


@pytest.mark.rule("R-392")
@pytest.mark.parametrize("key", ["not pem at all", "-----BEGIN CERTIFICATE-----AAAA"
                                 "-----END CERTIFICATE-----"])
def test_what_is_not_a_pem_key_is_refused_before_staging(key: str,
                                                         alice_cert: trustme.LeafCert) -> None:
    with pytest.raises(MtlsUnavailable) as refused:
        ClientCertificate.from_fields(_material(alice_cert).certificate, key)
    assert refused.value.code == "mtls_material_invalid"


def test_client_material_is_never_shown_or_serialized(alice_cert: trustme.LeafCert) -> None:
    import pickle

    material = _material(alice_cert)
    assert "BEGIN" not in repr(material)
    with pytest.raises(TypeError):
        pickle.dumps(material)


def _egress(service: OpenApiService, tmp_path: Path) -> Egress:
    signer = PolicySigner()
    return Egress(EgressPolicy.build(("127.0.0.1/32",), (service.port,),
                                     ca_file=str(service.ca_file), timeout_s=10),
                  signer.ceiling(signer.write(tmp_path / "policy", [service.origin])))


def _destination(service: OpenApiService) -> Destination:
    return Destination(id="oas-s0123456789-00000000", origin=service.origin,
                       scheme=make_scheme("mtls"), provider="openapi")


@pytest.mark.rule("R-392")
@pytest.mark.parametrize("encrypted", [False, True], ids=["plain-key", "encrypted-key"])
async def test_a_source_requiring_client_certificates_is_reached_with_the_members(
        service: OpenApiService, tmp_path: Path, alice_cert: trustme.LeafCert,
        encrypted: bool) -> None:
    """The broker's injector for a mutual-TLS destination, through the egress door: the
    material pasted on one line (an encrypted key with its passphrase), staged and removed,
    the connection carries it."""
    before = _staged()
    certificate = alice_cert.cert_chain_pems[0].bytes().decode().replace("\n", "")
    secret = {"certificate": certificate}
    if encrypted:
        secret["private_key"] = _encrypted(alice_cert, b"open sesame").replace("\n", "")
        secret["passphrase"] = "open sesame"
    else:
        secret["private_key"] = alice_cert.private_key_pem.bytes().decode().replace("\n", "")
    injector = Injector(_destination(service), secret)
    egress = _egress(service, tmp_path)
    try:
        response = await egress.send(Origin.of(service.origin),
                                     OutgoingRequest("GET", "/api/items/5"), max_bytes=4096,
                                     credential=injector)
        # Without the certificate the service refuses the connection: it really requires one.
        with pytest.raises(EgressFailed):
            await egress.send(Origin.of(service.origin), OutgoingRequest("GET", "/api/items/6"),
                              max_bytes=4096)
    finally:
        await egress.aclose()
    assert response.status == 200 and json.loads(response.body)["id"] == "5"
    [received] = service.received("/api/items/5")
    assert received.peer == "alice-client"
    # Nothing of the material rode in a header, and nothing is left in /dev/shm.
    assert not {"authorization", "cookie"} & set(received.headers)
    assert _staged() == before


@pytest.mark.rule("R-392")
async def test_a_spent_client_certificate_is_refused_and_nothing_is_sent(
        service: OpenApiService, tmp_path: Path, alice_cert: trustme.LeafCert) -> None:
    injector = Injector(_destination(service), {
        "certificate": alice_cert.cert_chain_pems[0].bytes().decode(),
        "private_key": alice_cert.private_key_pem.bytes().decode()})
    injector.clear()  # what the broker does after its one request
    egress = _egress(service, tmp_path)
    try:
        with pytest.raises(MemberSafeError) as refused:
            await egress.send(Origin.of(service.origin), OutgoingRequest("GET", "/api/items/7"),
                              max_bytes=4096, credential=injector)
    finally:
        await egress.aclose()
    assert refused.value.code == "credential_spent"
    assert service.received() == []


@pytest.mark.rule("R-396")
def test_a_key_echoed_line_by_line_is_scrubbed(alice_cert: trustme.LeafCert) -> None:
    from kaizen_server_extension.credentials.broker import scrub

    key = alice_cert.private_key_pem.bytes().decode()
    held = _Held("cref_x", "alice", "d", "https://x", "once",
                 {"certificate": alice_cert.cert_chain_pems[0].bytes().decode(),
                  "private_key": key.replace("\n", "")})
    line = key.splitlines()[2]
    echoed = scrub({"debug": f"your key had {line} in it"}, held.variants())
    assert line not in json.dumps(echoed)


@pytest.mark.rule("R-392")
def test_a_mutual_tls_scheme_compiles_into_a_client_certificate_plan() -> None:
    document = {"openapi": "3.1.0", "info": {"title": "t", "version": "1"},
                "paths": {"/x": {"get": {"operationId": "op", "security": [{"npe": []}]}}},
                "components": {"securitySchemes": {"npe": {"type": "mutualTLS"}}}}
    compiled = compile_document(json.dumps(document).encode())
    assert compiled.by_id["op"].auth == CompiledAuth("npe", "mtls")
    scheme = make_scheme("mtls")
    assert scheme.fields() == ("certificate", "private_key", "passphrase")
    assert [name for name in scheme.fields() if scheme.optional(name)] == ["passphrase"]


@pytest.mark.rule("R-392")
@pytest.mark.parametrize(("key", "passphrase", "code"), [
    ("encrypted", "open sesame", None),
    ("encrypted", "wrong", "mtls_passphrase_wrong"),
    ("encrypted", "", "mtls_passphrase_required"),
    ("plain", "open sesame", "mtls_passphrase_unexpected"),
    ("plain", "", None),
    ("other", "", "mtls_material_invalid"),
])
def test_client_material_is_checked_in_memory_before_it_is_kept(
        client_ca: trustme.CA, alice_cert: trustme.LeafCert, key: str, passphrase: str,
        code: str | None) -> None:
    """The form's submit-time check: nothing is staged for it, and its refusals say why
    without quoting the key or the passphrase."""
    keys = {"encrypted": _encrypted(alice_cert, b"open sesame"),
            "plain": alice_cert.private_key_pem.bytes().decode(),
            "other": client_ca.issue_cert("someone-else").private_key_pem.bytes().decode()}
    material = ClientCertificate.from_fields(_material(alice_cert).certificate, keys[key],
                                             passphrase)
    before = _staged()
    if code is None:
        check_client_material(material)
    else:
        with pytest.raises(MtlsUnavailable) as refused:
            check_client_material(material)
        assert refused.value.code == code
        assert not passphrase or passphrase not in str(refused.value)
        assert "BEGIN" not in str(refused.value)
    assert _staged() == before


async def _broker_with(store: Store, destination: Destination) -> Any:
    from kaizen_server_extension.credentials.broker import CredentialBroker
    from kaizen_server_extension.credentials.crypto import (
        CredentialKeys,
        Vault,
        new_key_text,
        parse_key,
    )
    from kaizen_server_extension.credentials.destinations import StaticDestinations
    from kaizen_server_extension.store.credentials import CredentialRecords

    async def allow(member: str, destination: Destination) -> str | None:
        return None

    await store.members.ensure("alice", "Alice")
    vault = Vault(CredentialKeys.from_master(parse_key(new_key_text())).vault)
    return CredentialBroker(CredentialRecords(store), vault,
                            StaticDestinations([destination]), allow)


@pytest.mark.rule("R-392")
async def test_a_static_destination_presents_an_encrypted_key_on_the_brokers_own_connection(
        store: Store, service: OpenApiService, alice_cert: trustme.LeafCert) -> None:
    """``BrokerHandle.send`` for a mutual-TLS destination: the key, encrypted as entered,
    staged in /dev/shm while the request's own TLS context loads it with the passphrase,
    removed before anything is sent; the service sees the member's certificate."""
    destination = Destination("peer", service.origin, make_scheme("mtls"),
                              ca_file=str(service.ca_file))
    broker = await _broker_with(store, destination)
    secret = {"certificate": _material(alice_cert).certificate,
              "private_key": _encrypted(alice_cert, b"open sesame"),
              "passphrase": "open sesame"}
    watched: list[list[dict[str, Any]]] = []
    original = ssl.SSLContext.load_cert_chain

    def watching(context: ssl.SSLContext, certfile: Any, keyfile: Any = None,
                 password: Any = None) -> None:
        watched.append([{"path": Path(name), "text": Path(name).read_text()}
                        for name in (certfile, keyfile)])
        original(context, certfile, keyfile, password)

    before = _staged()
    ref = broker.hold_once("alice", destination, secret)
    handle = await broker.handle("alice", ref, "peer", operation="op", effect="read")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ssl.SSLContext, "load_cert_chain", watching)
        response = await handle.send("GET", f"{service.origin}/api/peer")
    assert response.json() == {"peer": "alice-client"}
    [[certificate, key]] = watched
    assert certificate["path"].parent.parent == STAGING_ROOT
    # What was staged is the key as entered, still encrypted: never the decrypted key.
    assert key["text"].startswith("-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert "open sesame" not in key["text"] + certificate["text"]
    assert _staged() == before

    # A client the tool brought is never given the key: refused, nothing staged or sent.
    ref = broker.hold_once("alice", destination, secret)
    handle = await broker.handle("alice", ref, "peer", operation="op", effect="read")
    sent = len(service.received())
    trusted = ssl.create_default_context(cafile=str(service.ca_file))
    async with httpx.AsyncClient(verify=trusted) as own:
        with pytest.raises(MemberSafeError) as refused:
            await handle.send("GET", f"{service.origin}/api/peer", client=own)
    assert refused.value.code == "mtls_own_connection"
    assert len(service.received()) == sent and _staged() == before
