"""The signed egress policy (R-379): enabling external sources is not network authority.

Every schema fetch and operation call goes through the egress door, which asks the signed
policy first. These tests try each way it can be missing or wrong against a real local HTTPS
service on loopback and see the request refused before anything reaches it; then the allowed
path, and the signing tool itself."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kaizen_server_extension.settings import KaizenSettings, SettingsError
from kaizen_server_extension.tools.egress import (
    Egress,
    EgressPolicy,
    EgressRefused,
    Origin,
    OutgoingRequest,
)
from kaizen_server_extension.tools.egress_policy import (
    EgressCeiling,
    PolicyRejected,
    open_policy,
    parse_public_key,
    policy_document,
    public_key_text,
    sign_policy,
)
from kaizen_server_extension.tools.egress_sign import main as egress_sign
from kaizen_server_extension.tools.openapi_schema_cache import SchemaCache
from tests.support.egress_policy import PolicySigner
from tests.support.openapi_server import OpenApiService, items_document


@pytest.fixture
def service(tmp_path: Path) -> Iterator[OpenApiService]:
    with OpenApiService(tmp_path) as running:
        running.serve("/openapi.json", items_document())
        yield running


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _egress(service: OpenApiService, ceiling: EgressCeiling) -> Egress:
    return Egress(EgressPolicy.build(("127.0.0.1/32",), (service.port,),
                                     ca_file=str(service.ca_file), timeout_s=10), ceiling)


async def _refused(service: OpenApiService, ceiling: EgressCeiling,
                   origin: Origin | None = None) -> EgressRefused:
    """Both kinds of request — an operation call and a schema fetch — are refused, and
    nothing reached the service."""
    egress = _egress(service, ceiling)
    try:
        with pytest.raises(EgressRefused) as call:
            await egress.send(origin or Origin.of(service.origin),
                              OutgoingRequest("GET", "/api/items/1"), max_bytes=4096)
        with pytest.raises(EgressRefused) as fetch:
            await SchemaCache(egress, fresh_s=60, stale_s=600).get(
                f"{origin or Origin.of(service.origin)}/openapi.json")
    finally:
        await egress.aclose()
    assert fetch.value.code == call.value.code
    assert service.received() == []
    return call.value


@pytest.mark.rule("R-379")
async def test_the_allowed_origin_is_reached_under_a_valid_signed_policy(
        service: OpenApiService, tmp_path: Path) -> None:
    signer = PolicySigner()
    egress = _egress(service, signer.ceiling(
        signer.write(tmp_path / "policy", [service.origin])))
    try:
        response = await egress.send(Origin.of(service.origin),
                                     OutgoingRequest("GET", "/api/items/3"), max_bytes=4096)
        document = await SchemaCache(egress, fresh_s=60, stale_s=0).get(
            service.url("/openapi.json"))
    finally:
        await egress.aclose()
    assert response.status == 200 and json.loads(response.body)["id"] == "3"
    assert document.operations


@pytest.mark.rule("R-379")
@pytest.mark.parametrize("configured", ["no file", "no key", "file absent"])
async def test_without_a_signed_policy_every_request_is_refused(
        service: OpenApiService, tmp_path: Path, configured: str) -> None:
    signer = PolicySigner()
    path = signer.write(tmp_path / "policy", [service.origin])
    ceiling = {"no file": EgressCeiling("", signer.key.public_key()),
               "no key": EgressCeiling(str(path), None),
               "file absent": signer.ceiling(tmp_path / "nowhere")}[configured]
    refused = await _refused(service, ceiling)
    assert refused.code == "egress_policy_missing"
    assert "signed egress policy" in str(refused)


@pytest.mark.rule("R-379")
@pytest.mark.parametrize("tamper", ["widened origins", "flipped signature",
                                    "another key", "not a token", "another purpose"])
async def test_a_tampered_or_foreign_policy_is_refused(
        service: OpenApiService, tmp_path: Path, tamper: str) -> None:
    import base64

    signer = PolicySigner()
    path = tmp_path / "policy"
    good = signer.token(["https://api.example.com"])
    body, _, signature = good.partition(".")
    if tamper == "widened origins":
        # The signed document with this service's origin added: the signature no longer fits.
        document = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        document["origins"].append(service.origin)
        raw = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
        text = f"{base64.urlsafe_b64encode(raw).decode().rstrip('=')}.{signature}"
    elif tamper == "flipped signature":
        text = f"{body}.{('A' if signature[0] != 'A' else 'B') + signature[1:]}"
    elif tamper == "another key":
        text = PolicySigner().token([service.origin])
    elif tamper == "not a token":
        text = json.dumps({"origins": [service.origin]})
    else:
        document = policy_document([service.origin], ["127.0.0.1/32"], issued_at=0,
                                   expires_at=3600)
        text = sign_policy({**document, "purpose": "something-else"}, signer.key)
    path.write_text(text)
    refused = await _refused(service, signer.ceiling(path))
    assert refused.code == "egress_policy_invalid"


@pytest.mark.rule("R-379")
async def test_an_expired_policy_is_refused(service: OpenApiService, tmp_path: Path) -> None:
    signer = PolicySigner()
    path = signer.write(tmp_path / "policy", [service.origin], lifetime_s=600)
    clock = Clock(os.stat(path).st_mtime)
    ceiling = signer.ceiling(path, clock)
    assert ceiling.current().allows_origin(Origin.of(service.origin))
    clock.now += 601  # loaded while valid, then it runs out: checked at every request
    assert (await _refused(service, ceiling)).code == "egress_policy_expired"
    # Already expired when it is read.
    assert (await _refused(service, signer.ceiling(path, clock))).code == \
        "egress_policy_expired"


@pytest.mark.rule("R-379")
async def test_an_origin_not_in_the_signed_policy_is_refused(
        service: OpenApiService, tmp_path: Path) -> None:
    signer = PolicySigner()
    # Only the host name is listed: the same service by address is another origin.
    ceiling = signer.ceiling(signer.write(tmp_path / "policy",
                                          [f"https://localhost:{service.port}"]))
    refused = await _refused(service, ceiling)
    assert refused.code == "egress_origin_not_in_policy"
    # Another port of a listed host is another origin too.
    other_port = Origin("localhost", service.port + 1 if service.port < 65535 else 1)
    assert (await _refused(service, ceiling, other_port)).code == "egress_origin_not_in_policy"


@pytest.mark.rule("R-379")
@pytest.mark.rule("R-381")
async def test_a_protected_network_needs_the_signed_policy_too(
        service: OpenApiService, tmp_path: Path) -> None:
    """The server's settings list loopback, the signed policy does not: refused."""
    signer = PolicySigner()
    ceiling = signer.ceiling(signer.write(tmp_path / "policy", [service.origin], networks=()))
    assert (await _refused(service, ceiling)).code == "egress_address_refused"


@pytest.mark.rule("R-379")
async def test_a_renewed_policy_takes_effect_without_a_restart(
        service: OpenApiService, tmp_path: Path) -> None:
    signer = PolicySigner()
    path = tmp_path / "policy"
    path.write_text("garbage")
    ceiling = signer.ceiling(path)
    assert (await _refused(service, ceiling)).code == "egress_policy_invalid"
    signer.write(path, [service.origin])
    egress = _egress(service, ceiling)
    try:
        response = await egress.send(Origin.of(service.origin),
                                     OutgoingRequest("GET", "/api/items/9"), max_bytes=4096)
    finally:
        await egress.aclose()
    assert response.status == 200


@pytest.mark.rule("R-379")
async def test_a_policy_issued_ahead_of_the_clock_is_refused_until_the_clock_catches_up(
        service: OpenApiService, tmp_path: Path) -> None:
    signer = PolicySigner()
    path = signer.write(tmp_path / "policy", [service.origin], issued_at=50_000)
    clock = Clock(40_000)
    ceiling = signer.ceiling(path, clock)
    assert (await _refused(service, ceiling)).code == "egress_policy_not_yet_valid"
    clock.now = 50_001  # the same file, read again once the clock has caught up
    assert ceiling.current().allows_origin(Origin.of(service.origin))


@pytest.mark.rule("R-379")
@pytest.mark.parametrize("origin", ["https://api.example.com/v1", "http://api.example.com",
                                    "https://user@api.example.com", "https://a.example?x=1"])
def test_a_policy_lists_bare_https_origins_only(origin: str) -> None:
    with pytest.raises(ValueError):
        policy_document([origin], [], issued_at=0, expires_at=60)


@pytest.mark.rule("R-379")
def test_a_policy_issued_in_the_future_or_for_too_long_is_refused() -> None:
    signer = PolicySigner()
    key = signer.key.public_key()
    future = signer.token(["https://api.example.com"], issued_at=10_000)
    with pytest.raises(PolicyRejected) as early:
        open_policy(future, key, now=1_000)
    assert early.value.code == "egress_policy_not_yet_valid"
    endless = sign_policy(policy_document(["https://api.example.com"], [], issued_at=0,
                                          expires_at=10 * 366 * 86400), signer.key)
    with pytest.raises(PolicyRejected):
        open_policy(endless, key, now=1)


@pytest.mark.rule("R-379")
@pytest.mark.parametrize("value", ["not base64!", "c2hvcnQ"])
def test_a_bad_policy_key_stops_start_up_naming_the_setting(value: str) -> None:
    with pytest.raises(SettingsError) as error:
        KaizenSettings.from_environ({"KAIZEN_OPENAPI_EGRESS_POLICY_KEY": value})
    assert "KAIZEN_OPENAPI_EGRESS_POLICY_KEY" in str(error.value)


@pytest.mark.rule("R-379")
def test_the_signing_tool_issues_a_policy_the_server_accepts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key_file = tmp_path / "egress.key"
    assert egress_sign(["keygen", "--private-key", str(key_file)]) == 0
    public = capsys.readouterr().out.strip().partition("=")[2]
    # The signing key is owner-only, and never overwritten.
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert egress_sign(["keygen", "--private-key", str(key_file)]) == 1
    policy = tmp_path / "policy.signed"
    assert egress_sign(["sign", "--private-key", str(key_file), "--origin",
                        "https://api.example.com:8443/", "--network", "10.1.0.0/16",
                        "--days", "7", "--output", str(policy)]) == 0
    opened = EgressCeiling(str(policy), parse_public_key(public)).current()
    assert opened.origins == {Origin("api.example.com", 8443)}
    assert opened.expires_at - opened.issued_at == 7 * 86400
    assert egress_sign(["show", f"--public-key={public}", str(policy)]) == 0
    assert "https://api.example.com:8443" in capsys.readouterr().out
    # An origin with a path is refused, and nothing is written.
    assert egress_sign(["sign", "--private-key", str(key_file), "--origin",
                        "https://api.example.com/v1", "--output",
                        str(tmp_path / "bad")]) == 1
    assert not (tmp_path / "bad").exists()


@pytest.mark.rule("R-379")
def test_show_takes_a_key_that_begins_with_a_dash_and_the_servers_setting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A URL-safe base64 key begins with "-" one time in 64; argparse would take it for an
    option after a space, so the tool takes it as --public-key=KEY or from the setting."""
    while True:  # a key that begins with "-" (about 64 tries)
        key = Ed25519PrivateKey.generate()
        if public_key_text(key.public_key()).startswith("-"):
            break
    public = public_key_text(key.public_key())
    policy = tmp_path / "policy.signed"
    now = int(time.time())
    policy.write_text(sign_policy(policy_document(["https://api.example.com"], (),
                                                  issued_at=now, expires_at=now + 60), key))
    assert egress_sign(["show", f"--public-key={public}", str(policy)]) == 0
    assert "https://api.example.com" in capsys.readouterr().out
    monkeypatch.setenv("KAIZEN_OPENAPI_EGRESS_POLICY_KEY", public)
    assert egress_sign(["show", str(policy)]) == 0
    monkeypatch.delenv("KAIZEN_OPENAPI_EGRESS_POLICY_KEY")
    assert egress_sign(["show", str(policy)]) == 2
    assert "KAIZEN_OPENAPI_EGRESS_POLICY_KEY" in capsys.readouterr().err
