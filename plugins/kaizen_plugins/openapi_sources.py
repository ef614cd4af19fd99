"""manage_openapi_sources: the approval-gated way for an agent to change the member's external
OpenAPI sources (docs/openapi-sources.md, R-377).

It exists only while ``KAIZEN_OPENAPI_SOURCES_ENABLED`` is on (its surface is withheld
otherwise, R-378) and only for agents whose tool list names it. It is a write of the member's
own store, so it reaches the shared approval gate under the member's permission mode like any
external effect; the member's REST routes and this tool apply exactly the same rules
(``OpenApiSources.checked_urls``: uncredentialed HTTPS only, the egress ports and addresses,
same origin; at most 100 sources). No argument names a member: the sources are the caller's.

Every change's audit row (``openapi_source.created`` / ``.updated`` / ``.deleted``) records
what authorized it, as the pipeline decided it for this one call
(``tools/authorization.py``): a one-shot approval (with its id) or the member's Never ask
mode or conversation grant, kept distinct (R-377). A call the pipeline did not authorize
that way changes nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from kaizen_server_extension.protocol.errors import MemberError
from kaizen_server_extension.settings import (
    OPENAPI_SOURCE_URL_MAX_CHARS,
    OPENAPI_SOURCES_SERVICE,
    OPENAPI_SOURCES_SURFACE,
)
from kaizen_server_extension.tools import (
    Capability,
    MemberSafeError,
    RoomClass,
    ToolContext,
    WriteCategory,
    hookimpl,
    tool,
)
from kaizen_server_extension.tools.authorization import AuthorizedBy, current_authorization
from kaizen_server_extension.tools.hookspecs import ToolRegistrar

SourceId = Annotated[str, Field(pattern=r"^s[0-9a-f]{10}$")]
Url = Annotated[str, Field(min_length=1, max_length=OPENAPI_SOURCE_URL_MAX_CHARS)]


def _sources(ctx: ToolContext) -> Any:
    sources = ctx.services.get(OPENAPI_SOURCES_SERVICE)
    if sources is None:
        raise MemberSafeError("External API sources are not available on this server.",
                              code="openapi_sources_unavailable")
    return sources


# An external effect, not a member-store write: a source is network authority for the
# member's later turns, so the change itself goes through the approval gate.
@tool(name="manage_openapi_sources", capability=Capability.WRITE,
      room_class=RoomClass.ACTOR_BOUND_WRITE, write_category=WriteCategory.EXTERNAL_EFFECT,
      surface=OPENAPI_SOURCES_SURFACE, timeout_s=15, explicit_grant_only=True)
async def manage_openapi_sources(
    ctx: ToolContext,
    action: Literal["create", "update", "enable", "disable", "delete"],
    source_id: SourceId | None = None,
    schema_url: Url | None = None,
    api_base: Url | None = None,
    cross_origin: bool = False,
) -> dict[str, Any]:
    """Manage your external API sources: create (schema_url, the https:// address of an
    OpenAPI document, and optionally api_base), update (source_id, schema_url, optional
    api_base), enable / disable / delete (source_id). URLs must be https:// without user
    information, a query or a fragment; sources carry no credentials."""
    authorized = current_authorization()
    if authorized is None or authorized.by is AuthorizedBy.NOT_REQUIRED:
        # Only the approval gate lets a source change: outside it, nothing changes.
        raise MemberSafeError("Changing external API sources needs the member's approval "
                              "(or their Never ask mode); nothing was changed.",
                              code="approval_required")
    authorization = authorized.audit()
    sources = _sources(ctx)
    store = sources.store
    try:
        if action == "create":
            if schema_url is None or source_id is not None:
                raise MemberSafeError("create takes schema_url (and optionally api_base), "
                                      "not a source_id.", code="invalid_arguments",
                                      domain="caller")
            urls = sources.checked_urls(schema_url, api_base, cross_origin)
            record = await store.create(ctx.member, schema_url=urls.schema_url,
                                        api_base=urls.api_base, cross_origin=urls.cross_origin,
                                        authorization=authorization)
            return {"created": record.public()}
        if source_id is None:
            raise MemberSafeError(f"{action} needs the source_id.", code="invalid_arguments",
                                  domain="caller")
        if action == "delete":
            await store.delete(source_id, ctx.member, authorization=authorization)
            return {"deleted": source_id}
        current = await store.get_for(source_id, ctx.member)
        if action == "update":
            if schema_url is None:
                raise MemberSafeError("update needs the schema_url.",
                                      code="invalid_arguments", domain="caller")
            urls = sources.checked_urls(schema_url, api_base, cross_origin)
        else:
            urls = sources.checked_urls(current.schema_url, current.api_base,
                                        current.cross_origin)
        record = await store.update(
            source_id, ctx.member, schema_url=urls.schema_url, api_base=urls.api_base,
            cross_origin=urls.cross_origin,
            enabled=current.enabled if action == "update" else action == "enable",
            authorization=authorization)
        return {"updated": record.public()}
    except MemberError as exc:
        # A refusal the member would get over REST: nothing was changed.
        raise MemberSafeError(exc.message, code=exc.code, domain="caller") from None


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(manage_openapi_sources)
