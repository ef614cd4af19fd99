"""A server with credentials enabled refuses to start without a usable key or with a
destination it could not honour, naming the setting and never printing the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kaizen_server_extension.credentials.crypto import new_key_text
from kaizen_server_extension.credentials.destinations import (
    DestinationInvalid,
    destination_from_settings,
    origin_of,
)
from kaizen_server_extension.settings import KaizenSettings
from tests.test_settings import _refused_start_up_log


def test_credentials_without_a_key_do_not_start(tmp_path: Path) -> None:
    log = _refused_start_up_log(tmp_path, {"KAIZEN_CREDENTIALS_ENABLED": "1"})
    assert "KAIZEN_CREDENTIAL_KEY is not set" in log


def test_a_short_key_does_not_start_and_is_not_printed(tmp_path: Path) -> None:
    key = "c2hvcnQta2V5LXZhbHVlLTEyMw"  # 19 bytes, not 32
    log = _refused_start_up_log(tmp_path, {"KAIZEN_CREDENTIALS_ENABLED": "1",
                                           "KAIZEN_CREDENTIAL_KEY": key})
    assert "KAIZEN_CREDENTIAL_KEY must decode to 32 bytes" in log
    assert key not in log


def test_a_destination_with_user_information_does_not_start(tmp_path: Path) -> None:
    log = _refused_start_up_log(tmp_path, {
        "KAIZEN_CREDENTIALS_ENABLED": "1", "KAIZEN_CREDENTIAL_KEY": new_key_text(),
        "KAIZEN_CREDENTIAL_DESTINATIONS": json.dumps([
            {"id": "bad", "origin": "https://u:p@api.example.com",
             "scheme": {"kind": "bearer"}}])})
    assert "KAIZEN_CREDENTIAL_DESTINATIONS" in log and "user information" in log


@pytest.mark.parametrize("url", [
    "https://u:p@api.example.com", "https://api.example.com/path", "https://a.example/?k=1",
    "https://a.example/#frag", "http://api.example.com", "ftp://a.example", "https://",
])
def test_a_destination_origin_is_a_bare_https_origin(url: str) -> None:
    with pytest.raises(DestinationInvalid):
        origin_of(url)


def test_origins_are_canonical() -> None:
    assert origin_of("HTTPS://API.Example.com:443/") == "https://api.example.com"
    assert origin_of("https://api.example.com:8443") == "https://api.example.com:8443"
    assert origin_of("http://127.0.0.1:8080") == "http://127.0.0.1:8080"


def test_a_static_mutual_tls_destination_is_https_with_a_readable_ca_file(
        tmp_path: Path) -> None:
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text("-----BEGIN CERTIFICATE-----\n")
    accepted = destination_from_settings({"id": "peer", "origin": "https://127.0.0.1:8443",
                                          "scheme": {"kind": "mtls"},
                                          "ca_file": str(ca_file)})
    assert accepted.scheme.kind == "mtls" and accepted.ca_file == str(ca_file)
    # Plain HTTP could never present a client certificate, even to a loopback host.
    with pytest.raises(DestinationInvalid, match="must be https"):
        destination_from_settings({"id": "peer", "origin": "http://127.0.0.1:8080",
                                   "scheme": {"kind": "mtls"}})
    with pytest.raises(DestinationInvalid, match="ca_file"):
        destination_from_settings({"id": "peer", "origin": "https://127.0.0.1:8443",
                                   "scheme": {"kind": "mtls"},
                                   "ca_file": str(tmp_path / "missing.pem")})
    with pytest.raises(DestinationInvalid, match="takes no name"):
        destination_from_settings({"id": "peer", "origin": "https://127.0.0.1:8443",
                                   "scheme": {"kind": "mtls", "name": "X-Cert"}})


def test_an_mcp_server_cannot_be_bound_to_a_mutual_tls_destination() -> None:
    """Its session would send the calls without the certificate: refused at start-up."""
    environ = {
        "KAIZEN_CREDENTIALS_ENABLED": "1", "KAIZEN_CREDENTIAL_KEY": new_key_text(),
        "KAIZEN_CREDENTIAL_DESTINATIONS": json.dumps([
            {"id": "peer", "origin": "https://mcp.example.com", "scheme": {"kind": "mtls"}}]),
        "KAIZEN_MCP_SERVERS": json.dumps([
            {"id": "tools", "transport": "http", "url": "https://mcp.example.com/mcp",
             "credential_destination": "peer"}])}
    with pytest.raises(ValueError, match="cannot use the mutual-TLS destination"):
        KaizenSettings.from_environ(environ)
