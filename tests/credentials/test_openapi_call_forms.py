"""A credential form issued for one exact External OpenAPI operation call (R-387, R-390), in
process against a real store on both databases and the local HTTPS service.

The signed plan binds, besides the member, the destination, its API base origin, a nonce and
the five-minute expiry: the source, the operation, the digest of the source's schema
document, the digest of the call's arguments and its effect class. The credential entered on
it serves that call only: another operation, other arguments, another effect or a changed
document is refused, and a source whose document changed refuses the form itself."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from kaizen_server_extension.credentials.broker import CredentialRefused
from kaizen_server_extension.credentials.call_binding import (
    BindingMalformed,
    CallBinding,
    CallIdentity,
    call_arguments_digest,
)
from kaizen_server_extension.credentials.crypto import new_key_text
from kaizen_server_extension.credentials.destinations import (
    Destination,
    Scheme,
    StaticDestinations,
)
from kaizen_server_extension.credentials.forms import FORM_TTL_S, FormRefused
from kaizen_server_extension.credentials.openapi_destinations import OpenApiDestinations
from kaizen_server_extension.credentials.service import CredentialService
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.openapi_sources import OpenApiSourceStore, SourceRecord
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.tools.egress import Egress, EgressPolicy
from kaizen_server_extension.tools.openapi_schema_cache import SchemaCache
from kaizen_server_extension.tools.openapi_sources import (
    OpenApiSources,
    credential_destination,
    tool_name,
)
from kaizen_server_extension.tools.types import ToolDescriptor
from tests.policy.fakes import BUNDLE
from tests.support.egress_policy import signed_ceiling
from tests.support.openapi_server import OpenApiService, items_document

SECRET = "call-bound-5e0a-credential-value"
STATIC = Destination("weather", "https://api.weather.example", Scheme("bearer"))


def _document(summary: str = "One keyed item") -> dict[str, Any]:
    item_id = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
    return items_document(**{
        "/api/whoami": {"get": {"operationId": "whoAmI", "security": [{"key": []}]}},
        "/api/keyed/{id}": {"get": {"operationId": "keyedItem", "summary": summary,
                                    "parameters": [item_id], "security": [{"key": []}]},
                            "put": {"operationId": "putKeyed", "parameters": [item_id],
                                    "security": [{"key": []}]}}})


@pytest.fixture
def service(tmp_path: Path) -> Iterator[OpenApiService]:
    with OpenApiService(tmp_path) as running:
        running.serve("/openapi.json", _document())
        yield running


#: Admin policy: the names denied to everyone (the test's stand-in for the policy table).
DENIED: set[str] = set()


async def _allowed(member: str, name: str) -> bool:
    return name not in DENIED


@dataclass
class World:
    store: Store
    service: OpenApiService
    source: SourceRecord
    sources: OpenApiSources
    credentials: CredentialService

    @property
    def destination(self) -> str:
        return credential_destination(self.source.id, "key")

    def tool(self, operation: str) -> str:
        return str(tool_name(self.source.id, operation))

    async def descriptor(self, operation: str) -> ToolDescriptor:
        found = await self.sources.discover("alice", ["openapi"])
        [descriptor] = [t.descriptor for t in found.tools if t.descriptor.name
                        == self.tool(operation)]
        return descriptor

    async def entered(self, operation: str, arguments: dict[str, Any]) -> str:
        form = await self.credentials.forms.issue("alice", self.destination,
                                                  call=(self.tool(operation), arguments))
        submitted = await self.credentials.forms.submit("alice", form.token,
                                                        {"value": SECRET}, remember=False)
        return submitted.credential_ref


@pytest.fixture
async def world(store: Store, service: OpenApiService) -> AsyncIterator[World]:
    egress = Egress(EgressPolicy.build(("127.0.0.1/32",), (service.port,),
                                       ca_file=str(service.ca_file), timeout_s=10),
                    signed_ceiling(service.ca_file.parent, [service.origin]))
    # Every read fetches the document again: a changed document is seen at once.
    cache = SchemaCache(egress, fresh_s=0, stale_s=0)
    sources = OpenApiSources(OpenApiSourceStore(store), egress, cache,
                             credentials_enabled=True)
    destinations = StaticDestinations([STATIC])
    destinations.attach(OpenApiDestinations(sources, _allowed))
    # Remember is enabled here, yet a form for one call never offers it.
    credentials = CredentialService(store, key_text=new_key_text(), remember_enabled=True,
                                    destinations=destinations, allowed=_allowed)
    source = await OpenApiSourceStore(store).create(
        "alice", schema_url=service.url("/openapi.json"), api_base=service.origin,
        cross_origin=False)
    try:
        yield World(store, service, source, sources, credentials)
    finally:
        await egress.aclose()


async def _form_receipts(store: Store) -> int:
    async with store.transaction() as tx:
        return int((await tx.session.execute(
            select(func.count()).select_from(m.CredentialReceipt)
            .where(m.CredentialReceipt.kind == "form"))).scalar_one())


@pytest.mark.rule("R-387")
async def test_the_signed_plan_binds_the_one_call(world: World) -> None:
    arguments = {"id": "item-d41f"}
    before = int(time.time())
    form = await world.credentials.forms.issue("alice", world.destination,
                                               call=(world.tool("keyedItem"), arguments))
    document = await world.sources.operations(world.source)
    plan = form.plan
    assert plan["member"] == "alice" and plan["destination"] == world.destination
    assert plan["origin"] == world.service.origin and len(plan["nonce"]) >= 16
    assert before + FORM_TTL_S <= plan["exp"] <= int(time.time()) + FORM_TTL_S
    assert plan["call"] == {
        "tool": world.tool("keyedItem"), "source": world.source.id, "operation": "keyedItem",
        "schema_digest": document.digest, "args_digest": call_arguments_digest(arguments),
        "effect": "read", "api_base": world.source.api_base}
    # The arguments themselves are not in the plan (the URL), only their digest.
    assert "item-d41f" not in json.dumps(plan)
    # A credential for one call is used once: Remember is not offered, and asking is refused.
    assert form.remember_offered is False
    with pytest.raises(FormRefused) as remember:
        await world.credentials.forms.submit("alice", form.token, {"value": SECRET},
                                             remember=True)
    assert remember.value.code == "remember_disabled"
    assert await _form_receipts(world.store) == 0


@pytest.mark.rule("R-387", "R-398")
async def test_a_bound_credential_serves_only_its_own_call(world: World) -> None:
    ref = await world.entered("keyedItem", {"id": "7"})
    # The form's receipt names the call (identity only, R-398).
    [receipt] = await world.credentials.records.receipts_of("alice")
    assert (receipt.kind, receipt.operation, receipt.effect, receipt.status) == (
        "form", world.tool("keyedItem"), "read", "stored")
    descriptor = await world.descriptor("keyedItem")
    digest = descriptor.extra["openapi_schema_digest"]
    exact = CallIdentity(world.tool("keyedItem"), call_arguments_digest({"id": "7"}), digest,
                         "read")
    for other in (
            CallIdentity(world.tool("whoAmI"), call_arguments_digest({}), digest, "read"),
            CallIdentity(exact.tool, call_arguments_digest({"id": "8"}), digest, "read"),
            CallIdentity(exact.tool, exact.args_digest, "0" * 64, "read"),
            CallIdentity(exact.tool, exact.args_digest, digest, "write"),
            None):
        with pytest.raises(CredentialRefused) as refused:
            await world.credentials.broker.handle("alice", ref, world.destination,
                                                  operation="x", effect="read", call=other)
        assert refused.value.code == "credential_bound_elsewhere"
    # Through the service, as the pipeline asks: other arguments are refused ...
    with pytest.raises(CredentialRefused):
        await world.credentials.open_for_call(BUNDLE, descriptor,
                                              {"id": "8", "credential_ref": ref})
    # ... and the exact call gets its handle: the refusals did not spend it.
    opened = await world.credentials.open_for_call(BUNDLE, descriptor,
                                                   {"id": "7", "credential_ref": ref})
    assert opened.handle.credential_ref == ref and "credential_ref" not in opened.arguments
    opened.close()


@pytest.mark.rule("R-387")
async def test_no_form_for_a_call_that_is_not_this_destinations(world: World) -> None:
    forms = world.credentials.forms
    for tool, arguments in (
            (world.tool("getItem"), {"id": "1"}),        # anonymous: no credential at all
            (world.tool("noSuchOperation"), {}),
            ("openapi__s0000000000__whoAmI", {}),          # another source
            ("weather_now", {})):
        with pytest.raises(FormRefused) as refused:
            await forms.issue("alice", world.destination, call=(tool, arguments))
        assert refused.value.code == "call_unknown", tool
    for arguments in ({}, {"id": 7}, {"id": "7", "extra": 1}, {"id": "Bearer abc.def.ghi"}):
        with pytest.raises(FormRefused) as invalid:
            await forms.issue("alice", world.destination,
                              call=(world.tool("keyedItem"), arguments))
        assert invalid.value.code == "call_arguments_invalid", arguments
    # Another member has no such source; a static destination has no operations.
    with pytest.raises(FormRefused) as foreign:
        await forms.issue("bob", world.destination, call=(world.tool("whoAmI"), {}))
    assert foreign.value.code == "destination_unknown"
    with pytest.raises(FormRefused) as static:
        await forms.issue("alice", STATIC.id, call=(world.tool("whoAmI"), {}))
    assert static.value.code == "call_unknown"
    # The per-destination form of a static destination still works as before.
    assert (await forms.issue("alice", STATIC.id)).remember_offered is True


@pytest.mark.rule("R-390", "R-389")
async def test_a_changed_document_invalidates_rendered_forms_and_bound_credentials(
        world: World) -> None:
    form = await world.credentials.forms.issue("alice", world.destination,
                                               call=(world.tool("keyedItem"), {"id": "7"}))
    ref = await world.entered("keyedItem", {"id": "7"})
    before = await world.descriptor("keyedItem")
    world.service.serve("/openapi.json", _document(summary="Changed by the source"))
    with pytest.raises(FormRefused) as opened:
        await world.credentials.forms.open("alice", form.token)
    assert opened.value.code == "operation_changed"
    with pytest.raises(FormRefused) as submitted:
        await world.credentials.forms.submit("alice", form.token, {"value": SECRET},
                                             remember=False)
    assert submitted.value.code == "operation_changed"
    assert await _form_receipts(world.store) == 1  # only the form entered before the change
    # A newly discovered tool has the new document's digest: the old credential is refused.
    after = await world.descriptor("keyedItem")
    assert after.extra["openapi_schema_digest"] != before.extra["openapi_schema_digest"]
    with pytest.raises(CredentialRefused) as used:
        await world.credentials.open_for_call(BUNDLE, after,
                                              {"id": "7", "credential_ref": ref})
    assert used.value.code == "credential_bound_elsewhere"
    # A new form for the same call, issued now, works.
    assert await world.entered("keyedItem", {"id": "7"})


@pytest.mark.rule("R-389")
async def test_disabling_the_endpoint_revokes_a_rendered_form_for_its_call(
        world: World) -> None:
    form = await world.credentials.forms.issue("alice", world.destination,
                                               call=(world.tool("keyedItem"), {"id": "7"}))
    DENIED.add(world.tool("keyedItem"))
    try:
        with pytest.raises(FormRefused) as submitted:
            await world.credentials.forms.submit("alice", form.token, {"value": SECRET},
                                                 remember=False)
        assert submitted.value.code == "operation_denied"
        assert await _form_receipts(world.store) == 0
        with pytest.raises(FormRefused) as issued:
            await world.credentials.forms.issue("alice", world.destination,
                                                call=(world.tool("keyedItem"), {"id": "7"}))
        assert issued.value.code == "operation_denied"
        # Another endpoint of the same source is unaffected.
        assert await world.entered("whoAmI", {})
    finally:
        DENIED.discard(world.tool("keyedItem"))
    # Allowed again, the nonce was never claimed: the same form works once.
    assert (await world.credentials.forms.submit("alice", form.token, {"value": SECRET},
                                                 remember=False)).credential_ref


@pytest.mark.rule("R-387")
async def test_a_paused_calls_credential_serves_that_call_under_its_approval_only(
        world: World) -> None:
    """A form issued for a paused call binds its request and the approval it consumed: the
    credential entered on it is refused for another request, another approval, other
    arguments, or a call the model makes with the reference; refusals do not spend it."""
    descriptor = await world.descriptor("keyedItem")
    destination = await world.credentials.destinations.lookup(world.destination, "alice")
    bound = await world.credentials.destinations.bind_call(
        "alice", destination, world.tool("keyedItem"), {"id": "7"})
    assert isinstance(bound, CallBinding)
    paused = replace(bound, conversation="room-1", request="req-1", approval="appr-1")
    # The plan carries the three, and reads back as the same binding.
    assert CallBinding.from_plan(paused.plan()) == paused
    assert paused.public()["approval_id"] == "appr-1"
    for malformed in ({**bound.plan(), "approval": "appr-1"},          # no request
                      {**bound.plan(), "request": ""},
                      {**bound.plan(), "other": "x"}):
        with pytest.raises(BindingMalformed):
            CallBinding.from_plan(malformed)
    ref = world.credentials.broker.hold_once("alice", destination, {"value": SECRET},
                                             binding=paused)
    digest = descriptor.extra["openapi_schema_digest"]
    args = call_arguments_digest({"id": "7"})
    exact = CallIdentity(world.tool("keyedItem"), args, digest, "read",
                         request="req-1", approval="appr-1")
    for other, differs in (
            (replace(exact, approval="appr-2"), "approval"),
            (replace(exact, approval=None), "approval"),
            (replace(exact, request="req-2"), "the call"),
            (replace(exact, args_digest=call_arguments_digest({"id": "8"})), "arguments"),
            # The model naming the reference in a call of its own: not the paused call.
            (replace(exact, request=None, approval=None), "the call")):
        assert paused.mismatch(other) == differs
        with pytest.raises(CredentialRefused) as refused:
            await world.credentials.broker.handle("alice", ref, world.destination,
                                                  operation="x", effect="read", call=other)
        assert refused.value.code == "credential_bound_elsewhere"
    with pytest.raises(CredentialRefused):
        await world.credentials.open_for_call(BUNDLE, descriptor,
                                              {"id": "7", "credential_ref": ref})
    # The paused call itself, resumed under its approval, gets it.
    handle = await world.credentials.broker.handle("alice", ref, world.destination,
                                                   operation="x", effect="read", call=exact)
    assert handle.credential_ref == ref
    handle.close()
