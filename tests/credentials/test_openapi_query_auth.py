"""The query-auth ceiling of External OpenAPI sources (R-384), in process against a real
store on both databases and the local HTTPS service: an API key that rides in the query
string is omitted from discovery (its operations are not offered, its destination is not
listed) unless ``KAIZEN_EXTERNAL_QUERY_AUTH_ENABLED`` is on; an operation with another
supported alternative falls back to it. A form rendered while the ceiling was on is refused
on submit, before its nonce is claimed, once it is off (R-389), and so is every request."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from kaizen_server_extension.credentials.broker import CredentialRefused, Injector
from kaizen_server_extension.credentials.crypto import new_key_text
from kaizen_server_extension.credentials.destinations import (
    Destination,
    Scheme,
    StaticDestinations,
)
from kaizen_server_extension.credentials.forms import FormRefused
from kaizen_server_extension.credentials.openapi_destinations import OpenApiDestinations
from kaizen_server_extension.credentials.service import CredentialService
from kaizen_server_extension.settings import KaizenSettings, SettingsError
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.openapi_sources import OpenApiSourceStore, SourceRecord
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.tools.egress import Egress, EgressPolicy, Origin, OutgoingRequest
from kaizen_server_extension.tools.openapi_compiler import CompiledAuth
from kaizen_server_extension.tools.openapi_schema_cache import SchemaCache
from kaizen_server_extension.tools.openapi_sources import (
    OpenApiSources,
    credential_destination,
    tool_name,
)
from tests.support.egress_policy import signed_ceiling
from tests.support.openapi_server import OpenApiService, items_document

SECRET = "qk-7a31-query-string-credential-value"
QUERY = CompiledAuth("qkey", "query", "api_key")
HEADER = CompiledAuth("key", "header", "X-Key")


def _document() -> dict[str, Any]:
    document = items_document(**{
        # A query-string key only.
        "/api/whoami": {"get": {"operationId": "whoAmI", "security": [{"qkey": []}]}},
        # A query-string key first, a header key as the other alternative.
        "/api/headers": {"get": {"operationId": "eitherKey",
                                 "security": [{"qkey": []}, {"key": []}]}}})
    document["components"]["securitySchemes"]["qkey"] = {
        "type": "apiKey", "in": "query", "name": "api_key"}
    return document


@pytest.fixture
def service(tmp_path: Path) -> Iterator[OpenApiService]:
    with OpenApiService(tmp_path) as running:
        running.serve("/openapi.json", _document())
        yield running


async def _allowed(member: str, name: str) -> bool:
    return True


@dataclass
class Deployment:
    """One server's view: the same database, key and service; its own query-auth ceiling."""

    sources: OpenApiSources
    credentials: CredentialService


@dataclass
class World:
    store: Store
    service: OpenApiService
    source: SourceRecord
    on: Deployment
    off: Deployment


@pytest.fixture
async def world(store: Store, service: OpenApiService) -> AsyncIterator[World]:
    egress = Egress(EgressPolicy.build(("127.0.0.1/32",), (service.port,),
                                       ca_file=str(service.ca_file), timeout_s=10),
                    signed_ceiling(service.ca_file.parent, [service.origin]))
    cache = SchemaCache(egress, fresh_s=60, stale_s=0)
    key = new_key_text()

    def deployment(query_auth: bool) -> Deployment:
        sources = OpenApiSources(OpenApiSourceStore(store), egress, cache,
                                 credentials_enabled=True, query_auth_enabled=query_auth)
        destinations = StaticDestinations()
        destinations.attach(OpenApiDestinations(sources, _allowed))
        return Deployment(sources, CredentialService(
            store, key_text=key, remember_enabled=False, destinations=destinations,
            allowed=_allowed))

    source = await OpenApiSourceStore(store).create(
        "alice", schema_url=service.url("/openapi.json"), api_base=service.origin,
        cross_origin=False)
    try:
        yield World(store, service, source, deployment(True), deployment(False))
    finally:
        await egress.aclose()


def _offered(found: Any) -> dict[str, Mapping[str, Any]]:
    return {t.descriptor.name: t.descriptor.extra for t in found.tools}


async def _form_receipts(store: Store) -> int:
    async with store.transaction() as tx:
        return int((await tx.session.execute(
            select(func.count()).select_from(m.CredentialReceipt)
            .where(m.CredentialReceipt.kind == "form"))).scalar_one())


@pytest.mark.rule("R-384")
async def test_a_query_string_key_is_omitted_from_discovery_while_the_ceiling_is_off(
        world: World) -> None:
    source = world.source.id
    query_destination = credential_destination(source, "qkey")
    header_destination = credential_destination(source, "key")
    off = _offered(await world.off.sources.discover("alice", ["openapi"]))
    assert tool_name(source, "whoAmI") not in off
    # The other alternative serves instead: a header key, never the query.
    either = off[str(tool_name(source, "eitherKey"))]
    assert either["credential_destination"] == header_destination
    # The owner's listing says why the query-only operation is not offered.
    document = await world.off.sources.operations(world.source)
    usable, unavailable = world.off.sources.offerable(document)
    assert "whoAmI" not in {op.operation_id for op in usable}
    assert any(where == "GET /api/whoami" and "query-string" in reason
               for where, reason in unavailable)
    assert all(op.auth is None or not op.auth.in_query for op in usable)
    # Its credential destination is not listed either.
    listed = {d.id for d in await world.off.credentials.destinations.listing("alice")}
    assert query_destination not in listed and header_destination in listed

    on = _offered(await world.on.sources.discover("alice", ["openapi"]))
    assert on[str(tool_name(source, "whoAmI"))]["credential_destination"] == \
        query_destination
    # With the ceiling on, the document's first alternative (the query key) is the plan.
    assert on[str(tool_name(source, "eitherKey"))]["credential_destination"] == \
        query_destination
    listed_on = {d.id: d for d in await world.on.credentials.destinations.listing("alice")}
    assert listed_on[query_destination].scheme.kind == "query"


@pytest.mark.rule("R-384", "R-389")
async def test_a_rendered_query_key_form_is_refused_on_submit_once_the_ceiling_is_off(
        world: World) -> None:
    destination = credential_destination(world.source.id, "qkey")
    # Off, no form is issued for it at all.
    with pytest.raises(FormRefused) as issued_off:
        await world.off.credentials.forms.issue("alice", destination)
    assert issued_off.value.code == "query_auth_disabled"
    # Rendered while the ceiling was on (another replica, or before a restart) ...
    form = await world.on.credentials.forms.issue("alice", destination)
    assert form.destination.scheme.kind == "query"
    # ... and submitted where it is off: refused, nothing stored, the nonce unclaimed.
    with pytest.raises(FormRefused) as refused:
        await world.off.credentials.forms.submit("alice", form.token, {"value": SECRET},
                                                 remember=False)
    assert refused.value.code == "query_auth_disabled"
    assert await _form_receipts(world.store) == 0
    assert world.off.credentials.broker.pending_once("alice") == []
    # Where it is on, the same form is still good once.
    submitted = await world.on.credentials.forms.submit("alice", form.token,
                                                        {"value": SECRET}, remember=False)
    assert submitted.credential_ref.startswith("cref_")
    assert await _form_receipts(world.store) == 1


@pytest.mark.rule("R-384", "R-389", "R-396")
async def test_a_query_key_rides_only_in_the_query_of_the_one_request(
        world: World) -> None:
    destination = credential_destination(world.source.id, "qkey")
    form = await world.on.credentials.forms.issue("alice", destination)
    ref = (await world.on.credentials.forms.submit("alice", form.token, {"value": SECRET},
                                                   remember=False)).credential_ref
    # The ceiling off refuses the request too, before anything is sent.
    with pytest.raises(CredentialRefused) as refused:
        await world.off.credentials.broker.handle("alice", ref, destination,
                                                  operation="whoAmI", effect="read")
    assert refused.value.code == "query_auth_disabled"
    assert world.service.received("/api/whoami") == []

    document = await world.on.sources.operations(world.source)
    [operation] = [op for op in world.on.sources.offerable(document)[0]
                   if op.operation_id == "whoAmI"]
    handle = await world.on.credentials.broker.handle("alice", ref, destination,
                                                      operation="whoAmI", effect="read")

    async def send(injector: Injector) -> dict[str, Any]:
        return await world.on.sources.call("alice", world.source, operation, {},
                                           credential=injector)

    result = await handle.attach(str(Origin.of(world.source.api_base)), send)
    [received] = world.service.received("/api/whoami")
    assert received.query == [("api_key", SECRET)]
    assert SECRET not in repr(received.headers)
    # The source echoed it; the echo guard takes it out of what the tool returns.
    assert SECRET in repr(result["json"]) and SECRET not in repr(handle.scrub(result))


@pytest.mark.rule("R-384")
def test_the_query_auth_ceiling_is_off_by_default_and_a_bad_value_stops_start_up() -> None:
    assert KaizenSettings.from_environ({}).KAIZEN_EXTERNAL_QUERY_AUTH_ENABLED is False
    assert KaizenSettings.from_environ(
        {"KAIZEN_EXTERNAL_QUERY_AUTH_ENABLED": "1"}).KAIZEN_EXTERNAL_QUERY_AUTH_ENABLED is True
    with pytest.raises(SettingsError, match="KAIZEN_EXTERNAL_QUERY_AUTH_ENABLED"):
        KaizenSettings.from_environ({"KAIZEN_EXTERNAL_QUERY_AUTH_ENABLED": "sometimes"})


@pytest.mark.rule("R-384")
async def test_the_egress_door_puts_the_key_in_the_query_replacing_a_same_named_value(
        service: OpenApiService) -> None:
    egress = Egress(EgressPolicy.build(("127.0.0.1/32",), (service.port,),
                                       ca_file=str(service.ca_file), timeout_s=10),
                    signed_ceiling(service.ca_file.parent, [service.origin]))
    destination = Destination("q", service.origin, Scheme("query", "api_key"))
    try:
        response = await egress.send(
            Origin.of(service.origin),
            OutgoingRequest("GET", "/api/whoami", query=[("api_key", "not-the-key"),
                                                         ("page", "2")]),
            max_bytes=4096, credential=Injector(destination, {"value": SECRET}))
    finally:
        await egress.aclose()
    assert response.status == 200
    [received] = service.received("/api/whoami")
    # Replaced, never joined: the one key parameter is the credential.
    assert received.query == [("page", "2"), ("api_key", SECRET)]
    assert SECRET not in repr(received.headers)


@pytest.mark.rule("R-384", "R-391")
async def test_a_query_key_never_reaches_a_log_line(service: OpenApiService,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    egress = Egress(EgressPolicy.build(("127.0.0.1/32",), (service.port,),
                                       ca_file=str(service.ca_file), timeout_s=10),
                    signed_ceiling(service.ca_file.parent, [service.origin]))
    destination = Destination("q", service.origin, Scheme("query", "api_key"))
    caplog.set_level(logging.DEBUG)
    try:
        await egress.send(Origin.of(service.origin), OutgoingRequest("GET", "/api/whoami"),
                          max_bytes=4096, credential=Injector(destination, {"value": SECRET}))
    finally:
        await egress.aclose()
    # httpx logged the request (an operator may turn that on), without its query.
    assert any("HTTP Request" in r.getMessage() for r in caplog.records)
    assert SECRET not in caplog.text
    assert [r.query for r in service.received("/api/whoami")] == [[("api_key", SECRET)]]
