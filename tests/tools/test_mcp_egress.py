"""Streamable-HTTP MCP servers under the deployment's signed egress policy (docs/mcp.md,
"Egress"): with a policy configured, a server's origin must be in it, or its listing and its
calls are refused before anything reaches it (R-379), and the connection is pinned to the
address the policy checked (R-381).

Real MCP servers over https on loopback (the SDK's own server side, ``tests/support/
mcp_server.py``, with a throwaway CA's certificate), a real signed policy, the MCP client as
the server wires it (``McpSources`` with its :class:`McpEgressGate`)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from kaizen_server_extension.tools.egress import Egress, EgressPolicy
from kaizen_server_extension.tools.egress_policy import EgressCeiling
from kaizen_server_extension.tools.mcp_http import McpEgressGate
from kaizen_server_extension.tools.mcp_sources import McpServer, McpSources, McpUnavailable
from tests.support.egress_policy import PolicySigner
from tests.support.mcp_http_server import HttpMcp, start_http_mcp


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def servers(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[tuple[HttpMcp, HttpMcp]]:
    root = tmp_path_factory.mktemp("mcp-egress")
    tls = start_http_mcp(root / "tls.jsonl", ca=ca)
    plain = start_http_mcp(root / "plain.jsonl")
    try:
        yield tls, plain
    finally:
        tls.stop()
        plain.stop()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _sources(server: HttpMcp, ceiling: EgressCeiling | None, ca: trustme.CA,
             tmp_path: Path) -> tuple[McpSources, McpServer]:
    mcp = McpServer(id="remote", transport="http", url=server.url, timeout_s=20)
    if ceiling is None:
        return McpSources([mcp]), mcp
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    egress = Egress(EgressPolicy.build(("127.0.0.1/32",), (server.port,),
                                       ca_file=str(ca_file), timeout_s=20), ceiling)
    return McpSources([mcp], egress=McpEgressGate(egress)), mcp


async def _refused_both_ways(sources: McpSources, mcp: McpServer, server: HttpMcp) -> str:
    """The listing gives nothing and says why; the call is refused with the same code; and
    nothing reached the server. The code."""
    before = len(server.lines())
    found = await sources.discover([mcp])
    assert found.tools == () and found.unavailable == ("remote",)
    [(_, reason)] = found.reasons
    with pytest.raises(McpUnavailable) as refused:
        await sources.call(mcp, "lookup", {"q": "egress"})
    assert refused.value.code == reason
    assert str(server.port) not in str(refused.value)  # the member sees no address
    assert len(server.lines()) == before
    return reason


@pytest.mark.rule("R-379", "R-381")
async def test_an_origin_in_the_signed_policy_is_listed_and_called(
        servers: tuple[HttpMcp, HttpMcp], ca: trustme.CA, tmp_path: Path) -> None:
    tls, _ = servers
    signer = PolicySigner()
    ceiling = signer.ceiling(signer.write(tmp_path / "policy", [tls.origin]))
    sources, mcp = _sources(tls, ceiling, ca, tmp_path)
    found = await sources.discover([mcp])
    assert "mcp__remote__lookup" in {t.descriptor.name for t in found.tools}
    assert found.unavailable == ()
    before = len(tls.ran())
    body = await sources.call(mcp, "lookup", {"q": "pinned"})
    assert body["content"][0]["text"] == "glossary: pinned means testing"
    assert [r["arguments"] for r in tls.ran()[before:]] == [{"q": "pinned"}]


@pytest.mark.rule("R-379")
async def test_an_origin_absent_from_the_policy_is_refused_for_listing_and_calls(
        servers: tuple[HttpMcp, HttpMcp], ca: trustme.CA, tmp_path: Path) -> None:
    tls, _ = servers
    signer = PolicySigner()
    # The same service by name is another origin; so is another port of the same address.
    ceiling = signer.ceiling(signer.write(tmp_path / "policy", [
        f"https://localhost:{tls.port}", f"https://127.0.0.1:{tls.port + 1}"]))
    sources, mcp = _sources(tls, ceiling, ca, tmp_path)
    assert await _refused_both_ways(sources, mcp, tls) == "egress_origin_not_in_policy"


@pytest.mark.rule("R-379")
async def test_a_plain_http_server_cannot_be_allowed_by_a_policy(
        servers: tuple[HttpMcp, HttpMcp], ca: trustme.CA, tmp_path: Path) -> None:
    tls, plain = servers
    signer = PolicySigner()
    # The policy lists https origins only: the plain server's address and port are there.
    ceiling = signer.ceiling(signer.write(tmp_path / "policy", [
        f"https://127.0.0.1:{plain.port}", tls.origin]))
    sources, mcp = _sources(plain, ceiling, ca, tmp_path)
    assert await _refused_both_ways(sources, mcp, plain) == "egress_origin_not_in_policy"


@pytest.mark.rule("R-379")
@pytest.mark.parametrize("tamper", ["byte", "other key", "missing", "no key"])
async def test_a_tampered_or_missing_policy_refuses_every_mcp_http_server(
        servers: tuple[HttpMcp, HttpMcp], ca: trustme.CA, tmp_path: Path, tamper: str) -> None:
    tls, _ = servers
    signer = PolicySigner()
    path = signer.write(tmp_path / "policy", [tls.origin])
    ceiling = signer.ceiling(path)
    if tamper == "byte":
        text = path.read_text()
        middle = len(text) // 3
        path.write_text(text[:middle] + ("A" if text[middle] != "A" else "B")
                        + text[middle + 1:])
    elif tamper == "other key":
        ceiling = PolicySigner().ceiling(path)
    elif tamper == "missing":
        path.unlink()
    else:
        ceiling = EgressCeiling(str(path), None)
    sources, mcp = _sources(tls, ceiling, ca, tmp_path)
    expected = {"byte": "egress_policy_invalid", "other key": "egress_policy_invalid",
                "missing": "egress_policy_missing", "no key": "egress_policy_missing"}[tamper]
    assert await _refused_both_ways(sources, mcp, tls) == expected


@pytest.mark.rule("R-379")
async def test_an_expired_policy_refuses_listing_and_calls(
        servers: tuple[HttpMcp, HttpMcp], ca: trustme.CA, tmp_path: Path) -> None:
    tls, _ = servers
    signer = PolicySigner()
    path = signer.write(tmp_path / "policy", [tls.origin], lifetime_s=600)
    clock = Clock(os.stat(path).st_mtime)
    sources, mcp = _sources(tls, signer.ceiling(path, clock), ca, tmp_path)
    assert "mcp__remote__lookup" in {t.descriptor.name
                                     for t in (await sources.discover([mcp])).tools}
    clock.now += 601  # valid when read, then it runs out: checked at every session
    assert await _refused_both_ways(sources, mcp, tls) == "egress_policy_expired"
    # Issued in the future (beyond clock skew): not valid yet.
    future = signer.write(tmp_path / "future", [tls.origin], issued_at=int(time.time()) + 3600)
    sources, mcp = _sources(tls, signer.ceiling(future), ca, tmp_path)
    assert await _refused_both_ways(sources, mcp, tls) == "egress_policy_not_yet_valid"


async def test_without_a_policy_an_http_server_is_reached_as_configured(
        servers: tuple[HttpMcp, HttpMcp], ca: trustme.CA, tmp_path: Path) -> None:
    """No policy configured: KAIZEN_MCP_SERVERS alone decides (docs/mcp.md, "Egress")."""
    _, plain = servers
    sources, mcp = _sources(plain, None, ca, tmp_path)
    body = await sources.call(mcp, "lookup", {"q": "plain"})
    assert body["content"][0]["text"] == "glossary: plain means testing"


@pytest.mark.rule("R-381")
async def test_the_pinned_client_refuses_a_request_to_any_other_origin(
        servers: tuple[HttpMcp, HttpMcp], ca: trustme.CA, tmp_path: Path) -> None:
    """The SDK follows same-origin redirects itself; whatever it would send elsewhere (another
    host, port or scheme) the pinned transport refuses before connecting."""
    import ipaddress

    import httpx2

    from kaizen_server_extension.tools.egress import Origin
    from kaizen_server_extension.tools.mcp_http import McpEgressRefused, _pinned_transport

    tls, plain = servers
    transport = _pinned_transport(Origin("127.0.0.1", tls.port),
                                  ipaddress.ip_address("127.0.0.1"), ca_context(ca))
    async with httpx2.AsyncClient(transport=transport) as client:
        for url in (f"https://localhost:{tls.port}/mcp", f"https://127.0.0.1:{plain.port}/mcp",
                    f"http://127.0.0.1:{tls.port}/mcp"):
            before = len(plain.lines()) + len(tls.lines())
            with pytest.raises(McpEgressRefused):
                await client.get(url)
            assert len(plain.lines()) + len(tls.lines()) == before
        # The origin itself is reached, at the pinned address, its name verified by TLS.
        answer = await client.get(tls.url)
        assert answer.status_code in (400, 405, 406)  # a bare GET is no MCP message


def ca_context(ca: trustme.CA) -> Any:
    import ssl

    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context
