"""manage_openapi_sources changes a source only as the approval gate authorized that one call,
and its audit row keeps a one-shot approval apart from the member's Never ask mode or
conversation grant (R-377). In process, on both databases; end to end through the real
pipeline in test_openapi_sources_rest.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kaizen_plugins.openapi_sources import manage_openapi_sources
from sqlalchemy import select

from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.settings import OPENAPI_SOURCES_SERVICE
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.openapi_sources import OpenApiSourceStore
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.tools.authorization import (
    AuthorizedBy,
    CallAuthorization,
    GrantRef,
    authorized_as,
    current_authorization,
)
from kaizen_server_extension.tools.egress import Egress, EgressPolicy
from kaizen_server_extension.tools.openapi_schema_cache import SchemaCache
from kaizen_server_extension.tools.openapi_sources import OpenApiSources
from tests.support.egress_policy import signed_ceiling

SCHEMA_URL = "https://api.example.com/openapi.json"


@dataclass
class Context:
    member: str
    services: dict[str, Any] = field(default_factory=dict)
    bundle: Any = None


@pytest.fixture
async def sources(store: Store, tmp_path: Path) -> AsyncIterator[OpenApiSources]:
    # No source is ever fetched here; the door still needs its signed ceiling.
    egress = Egress(EgressPolicy.build((), (443,), ca_file="", timeout_s=5),
                    signed_ceiling(tmp_path, []))
    try:
        yield OpenApiSources(OpenApiSourceStore(store), egress,
                             SchemaCache(egress, fresh_s=0, stale_s=0))
    finally:
        await egress.aclose()


async def _manage(sources: OpenApiSources, **arguments: Any) -> dict[str, Any]:
    ctx = Context("alice", {OPENAPI_SOURCES_SERVICE: sources})
    result: dict[str, Any] = await manage_openapi_sources.impl(ctx, **arguments)
    return result


async def _audit(store: Store) -> list[tuple[str, dict[str, Any]]]:
    async with store.transaction() as tx:
        rows = (await tx.session.execute(
            select(m.AuditEvent.action, m.AuditEvent.data)
            .where(m.AuditEvent.action.like("openapi_source.%"))
            .order_by(m.AuditEvent.id))).all()
        return [(action, dict(data)) for action, data in rows]


@pytest.mark.rule("R-377")
@pytest.mark.parametrize("authorization", [
    None, CallAuthorization(AuthorizedBy.NOT_REQUIRED, "ask_for_writes", run_id="r1")])
async def test_without_the_gates_authorization_nothing_changes(
        store: Store, sources: OpenApiSources,
        authorization: CallAuthorization | None) -> None:
    with pytest.raises(MemberSafeError) as refused:
        if authorization is None:
            await _manage(sources, action="create", schema_url=SCHEMA_URL)
        else:
            with authorized_as(authorization):
                await _manage(sources, action="create", schema_url=SCHEMA_URL)
    assert refused.value.code == "approval_required"
    assert await sources.store.list_for("alice") == []
    assert await _audit(store) == []


@pytest.mark.rule("R-377")
async def test_each_change_audits_which_authorization_allowed_it(
        store: Store, sources: OpenApiSources) -> None:
    one_shot = CallAuthorization(AuthorizedBy.ONE_SHOT_APPROVAL, "ask_for_writes",
                                 approval_id="ap_1", run_id="run_1")
    never_ask = CallAuthorization(AuthorizedBy.NEVER_ASK, "never_ask", run_id="run_2")
    granted = CallAuthorization(AuthorizedBy.CONVERSATION_GRANT, "ask_for_writes",
                                run_id="run_3",
                                grant=GrantRef("conv_1", "manage_openapi_sources", "ap_0"))
    with authorized_as(one_shot):
        created = (await _manage(sources, action="create", schema_url=SCHEMA_URL))["created"]
    with authorized_as(never_ask):
        await _manage(sources, action="disable", source_id=created["id"])
    with authorized_as(granted):
        await _manage(sources, action="delete", source_id=created["id"])
    assert current_authorization() is None  # the fact never outlives its call
    audit = await _audit(store)
    assert [(action, data["authorization"]) for action, data in audit] == [
        ("openapi_source.created", {"by": "one_shot_approval", "mode": "ask_for_writes",
                                    "approval_id": "ap_1", "run_id": "run_1"}),
        ("openapi_source.updated", {"by": "never_ask", "mode": "never_ask",
                                    "run_id": "run_2"}),
        ("openapi_source.deleted", {"by": "conversation_grant", "mode": "ask_for_writes",
                                    "run_id": "run_3",
                                    "grant": {"conversation_id": "conv_1",
                                              "tool": "manage_openapi_sources",
                                              "approval_id": "ap_0"}}),
    ]
    # The member's own REST change says so, distinct from all three.
    await sources.store.create("alice", schema_url=SCHEMA_URL,
                               api_base="https://api.example.com", cross_origin=False)
    assert (await _audit(store))[-1][1]["authorization"] == {"by": "member_request"}


@pytest.mark.rule("R-377")
def test_an_approval_id_goes_with_a_one_shot_approval_only() -> None:
    with pytest.raises(ValueError):
        CallAuthorization(AuthorizedBy.ONE_SHOT_APPROVAL, "ask_for_writes")
    with pytest.raises(ValueError):
        CallAuthorization(AuthorizedBy.NEVER_ASK, "never_ask", approval_id="ap_1")


@pytest.mark.rule("R-377")
def test_a_grant_goes_with_a_conversation_grant_only() -> None:
    grant = GrantRef("conv_1", "create_artifact", None)
    with pytest.raises(ValueError):
        CallAuthorization(AuthorizedBy.CONVERSATION_GRANT, "always_ask")
    with pytest.raises(ValueError):
        CallAuthorization(AuthorizedBy.NEVER_ASK, "never_ask", grant=grant)
