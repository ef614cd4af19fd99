"""The egress door and the schema cache of external OpenAPI sources, in process, against a
real local HTTPS service on loopback (``tests/support/openapi_server.py``).

Egress: only the registered origin, on an allowed port and address, pinned, with fixed
headers, no redirects followed, no cookies kept, bounded bodies. Cache: ETag revalidation, a
freshness window, a bounded stale fallback and single-flight refresh, schemas only.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kaizen_server_extension.tools.egress import (
    Egress,
    EgressFailed,
    EgressPolicy,
    EgressRefused,
    Origin,
    OutgoingRequest,
)
from kaizen_server_extension.tools.egress_policy import EgressCeiling
from kaizen_server_extension.tools.openapi_schema_cache import SchemaCache, SchemaUnavailable
from tests.support.egress_policy import PolicySigner
from tests.support.openapi_server import OpenApiService, items_document, oversized_document


@pytest.fixture
def service(tmp_path: Path) -> Iterator[OpenApiService]:
    with OpenApiService(tmp_path) as running:
        running.serve("/openapi.json", items_document(), etag='"v1"')
        yield running


def _ceiling(*services: OpenApiService) -> EgressCeiling:
    """A signed egress policy (R-379) listing the services' origins, by address and name."""
    signer = PolicySigner()
    origins = [o for s in services for o in (s.origin, f"https://localhost:{s.port}")]
    return signer.ceiling(signer.write(services[0].ca_file.parent / "egress.signed", origins))


def _egress(service: OpenApiService, *, networks: tuple[str, ...] = ("127.0.0.1/32",),
            ports: tuple[int, ...] | None = None) -> Egress:
    return Egress(EgressPolicy.build(networks, ports or (service.port,),
                                     ca_file=str(service.ca_file), timeout_s=10),
                  _ceiling(service))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_request_reaches_the_origin_with_fixed_headers_only(
        service: OpenApiService) -> None:
    egress = _egress(service)
    try:
        response = await egress.send(Origin.of(service.origin),
                                     OutgoingRequest("GET", "/api/items/7"), max_bytes=4096)
    finally:
        await egress.aclose()
    assert response.status == 200 and json.loads(response.body)["id"] == "7"
    [received] = service.received("/api/items/7")
    # The registered host (not the pinned address) names the origin; nothing identifies a
    # member or the server.
    assert received.headers["host"] == f"127.0.0.1:{service.port}"
    assert set(received.headers) <= {"host", "accept", "user-agent", "accept-encoding",
                                     "connection"}
    assert received.headers["user-agent"].startswith("kaizen-openapi-sources/")


@pytest.mark.rule("R-381")
async def test_a_host_name_is_resolved_pinned_and_still_verified_by_name(
        service: OpenApiService) -> None:
    egress = _egress(service)
    try:
        response = await egress.send(Origin("localhost", service.port),
                                     OutgoingRequest("GET", "/api/items/8"), max_bytes=4096)
    finally:
        await egress.aclose()
    assert response.status == 200
    # Sent to the pinned address, yet named as registered (Host and the TLS name).
    [received] = service.received("/api/items/8")
    assert received.headers["host"] == f"localhost:{service.port}"


@pytest.mark.rule("R-381")
@pytest.mark.parametrize(("networks", "host"), [
    ((), "127.0.0.1"),             # loopback is protected unless a listed network holds it
    (("10.0.0.0/8",), "127.0.0.1"),
    (("127.0.0.2/32",), "localhost"),  # a name is resolved, and its address checked
])
async def test_a_protected_address_is_refused_before_anything_is_sent(
        service: OpenApiService, networks: tuple[str, ...], host: str) -> None:
    egress = _egress(service, networks=networks)
    try:
        origin = Origin(host, service.port)
        with pytest.raises((EgressRefused, EgressFailed)) as refused:
            await egress.send(origin, OutgoingRequest("GET", "/api/items/1"), max_bytes=1024)
        if isinstance(refused.value, EgressFailed):
            assert refused.value.sent is False
    finally:
        await egress.aclose()
    assert service.received() == []


@pytest.mark.rule("R-381")
async def test_a_port_outside_the_policy_is_refused(service: OpenApiService) -> None:
    egress = _egress(service, ports=(443,))
    try:
        with pytest.raises(EgressRefused) as refused:
            await egress.send(Origin.of(service.origin), OutgoingRequest("GET", "/"),
                              max_bytes=1024)
    finally:
        await egress.aclose()
    assert refused.value.code == "egress_port_refused"
    assert service.received() == []


@pytest.mark.rule("R-343")
@pytest.mark.parametrize("path", ["//127.0.0.2/x", "https://127.0.0.2/x", "/a\\b", "/a b",
                                  "relative", "/x?token=1", "/x#frag"])
async def test_a_path_that_could_leave_the_origin_is_refused(
        service: OpenApiService, path: str) -> None:
    egress = _egress(service)
    try:
        with pytest.raises(EgressRefused):
            await egress.send(Origin.of(service.origin), OutgoingRequest("GET", path),
                              max_bytes=1024)
    finally:
        await egress.aclose()
    assert service.received() == []


@pytest.mark.rule("R-380")
async def test_a_redirect_is_returned_never_followed(tmp_path: Path) -> None:
    with OpenApiService(tmp_path) as source, \
            OpenApiService(tmp_path, ca=source.ca) as elsewhere:
        source.state.redirect_to = elsewhere.url("/stolen")
        egress = Egress(EgressPolicy.build(("127.0.0.1/32",), (source.port, elsewhere.port),
                                           ca_file=str(source.ca_file)),
                        _ceiling(source, elsewhere))
        try:
            response = await egress.send(Origin.of(source.origin),
                                         OutgoingRequest("GET", "/api/redirect"),
                                         max_bytes=1024)
        finally:
            await egress.aclose()
        assert response.status == 302
        assert elsewhere.received() == []


async def test_a_cookie_the_source_sets_is_never_sent_back(service: OpenApiService) -> None:
    egress = _egress(service)
    try:
        for _ in range(2):
            await egress.send(Origin.of(service.origin), OutgoingRequest("GET", "/api/headers"),
                              max_bytes=4096)
    finally:
        await egress.aclose()
    assert all("cookie" not in r.headers for r in service.received())


async def test_a_body_is_read_to_its_bound(service: OpenApiService) -> None:
    egress = _egress(service)
    try:
        response = await egress.send(Origin.of(service.origin),
                                     OutgoingRequest("GET", "/api/huge"), max_bytes=1000)
    finally:
        await egress.aclose()
    assert response.truncated and len(response.body) == 1000


async def test_an_unknown_certificate_authority_fails_closed(service: OpenApiService) -> None:
    egress = Egress(EgressPolicy.build(("127.0.0.1/32",), (service.port,)), _ceiling(service))
    try:
        with pytest.raises(EgressFailed):
            await egress.send(Origin.of(service.origin), OutgoingRequest("GET", "/"),
                              max_bytes=1024)
    finally:
        await egress.aclose()


# --- the schema cache ----------------------------------------------------------------------


@pytest.mark.rule("R-327")
async def test_a_fresh_schema_is_served_then_revalidated_with_its_etag(
        service: OpenApiService) -> None:
    egress, clock = _egress(service), Clock()
    cache = SchemaCache(egress, fresh_s=60, stale_s=600, clock=clock)
    url = service.url("/openapi.json")
    try:
        first = await cache.get(url)
        assert await cache.get(url) is first  # fresh: no request
        assert len(service.received("/openapi.json")) == 1
        clock.now += 61
        assert await cache.get(url) is first  # revalidated: 304, the compiled copy kept
        revalidation = service.received("/openapi.json")[-1]
        assert revalidation.headers.get("if-none-match") == '"v1"'
        assert len(service.received("/openapi.json")) == 2
        # A changed document (new ETag) replaces the entry.
        service.serve("/openapi.json", items_document(), etag='"v2"')
        clock.now += 61
        assert await cache.get(url) is not first
    finally:
        await egress.aclose()


@pytest.mark.rule("R-327")
async def test_a_stale_schema_stands_in_only_within_its_bound(service: OpenApiService) -> None:
    egress, clock = _egress(service), Clock()
    cache = SchemaCache(egress, fresh_s=60, stale_s=100, clock=clock)
    url = service.url("/openapi.json")
    try:
        document = await cache.get(url)
        service.state.failing.add("/openapi.json")
        clock.now += 150  # past freshness, within fresh + stale
        assert await cache.get(url) is document
        clock.now += 20  # 170 s since the last good answer: past the bound
        with pytest.raises(SchemaUnavailable):
            await cache.get(url)
    finally:
        await egress.aclose()


@pytest.mark.rule("R-327")
async def test_concurrent_readers_share_one_refresh(service: OpenApiService) -> None:
    service.state.document_delay_s = 0.5
    egress = _egress(service)
    cache = SchemaCache(egress, fresh_s=60, stale_s=0)
    url = service.url("/openapi.json")
    try:
        documents = await asyncio.gather(*(cache.get(url) for _ in range(8)))
    finally:
        await egress.aclose()
    assert len({id(d) for d in documents}) == 1
    assert len(service.received("/openapi.json")) == 1


@pytest.mark.rule("R-401")
async def test_a_document_over_16_mib_is_refused(service: OpenApiService) -> None:
    service.serve("/big.json", oversized_document(16 * 1024 * 1024 + 1))
    egress = _egress(service)
    try:
        with pytest.raises(SchemaUnavailable) as refused:
            await SchemaCache(egress, fresh_s=60, stale_s=0).get(service.url("/big.json"))
    finally:
        await egress.aclose()
    assert refused.value.code == "schema_too_large"


@pytest.mark.rule("R-326")
async def test_the_cache_holds_schemas_only(service: OpenApiService) -> None:
    """What an entry keeps is the compiled document: no response bytes, no headers."""
    egress = _egress(service)
    cache = SchemaCache(egress, fresh_s=60, stale_s=0)
    try:
        document = await cache.get(service.url("/openapi.json"))
    finally:
        await egress.aclose()
    [entry] = cache._entries.values()
    assert set(type(entry).__slots__) == {"document", "etag", "checked_at"}
    assert entry.document is document
    assert {type(op).__name__ for op in document.operations} == {"CompiledOperation"}
