"""REST for the member's external OpenAPI sources (docs/openapi-sources.md).

Registered only while ``KAIZEN_OPENAPI_SOURCES_ENABLED`` is on: off, these paths do not exist
on the server (the usual JSON 404), exactly like a disabled Library (R-378). Every route acts
on the caller's own sources; another member's source is the same 404 as one that never
existed. A refused request writes nothing; every change is audited with the member as actor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool
from tornado import web

from kaizen_server_extension.api.base import KaizenHandler
from kaizen_server_extension.api.openapi_parts import (
    answer,
    error_answers,
    operation,
    path_param,
    ref,
)
from kaizen_server_extension.protocol.errors import MemberError
from kaizen_server_extension.store.openapi_sources import MAX_URL_CHARS

if TYPE_CHECKING:  # the sources' modules load only when the feature is on
    from kaizen_server_extension.tools.openapi_sources import OpenApiSources

Url = Annotated[str, Field(min_length=1, max_length=MAX_URL_CHARS)]


class SourceRegistration(BaseModel):
    """A source: its OpenAPI document and, when it differs from the document's origin, the
    HTTPS API base its operations are sent to (default: the schema URL's origin)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    schema_url: Url
    api_base: Url | None = None
    cross_origin: StrictBool = False
    enabled: StrictBool = True


class SourceUnreachable(MemberError):
    """The source's document could not be had right now (nothing was changed)."""

    status: ClassVar[int] = 502
    default_code: ClassVar[str] = "openapi_schema_unavailable"


class SourcesHandler(KaizenHandler):
    @property
    def sources(self) -> OpenApiSources:
        sources = self.kaizen.tools.openapi
        assert sources is not None  # the routes exist only with the feature on
        return sources


class SourceListHandler(SourcesHandler):
    @web.authenticated
    async def get(self) -> None:
        rows = await self.sources.store.list_for(self.member)
        self.write_json([r.public() for r in rows])

    @web.authenticated
    async def post(self) -> None:
        body = self.parse_body(SourceRegistration, limit=16 * 1024)
        urls = self.sources.checked_urls(body.schema_url, body.api_base, body.cross_origin)
        record = await self.sources.store.create(
            self.member, schema_url=urls.schema_url, api_base=urls.api_base,
            cross_origin=urls.cross_origin, enabled=body.enabled)
        self.write_json(record.public(), status=201)


class SourceHandler(SourcesHandler):
    @web.authenticated
    async def get(self, source_id: str) -> None:
        record = await self.sources.store.get_for(source_id, self.member)
        self.write_json(record.public())

    @web.authenticated
    async def put(self, source_id: str) -> None:
        body = self.parse_body(SourceRegistration, limit=16 * 1024)
        await self.sources.store.get_for(source_id, self.member)  # 404 before a 422
        urls = self.sources.checked_urls(body.schema_url, body.api_base, body.cross_origin)
        record = await self.sources.store.update(
            source_id, self.member, schema_url=urls.schema_url, api_base=urls.api_base,
            cross_origin=urls.cross_origin, enabled=body.enabled)
        self.write_json(record.public())

    @web.authenticated
    async def delete(self, source_id: str) -> None:
        await self.sources.store.delete(source_id, self.member)
        self.set_status(204)
        self.finish()


class SourceOperationsHandler(SourcesHandler):
    @web.authenticated
    async def get(self, source_id: str) -> None:
        """What the source's document compiles into now: its callable operations (with the
        tool name and effect class each gets) and the omitted ones with their reasons."""
        from kaizen_server_extension.tools.egress import EgressRefused
        from kaizen_server_extension.tools.openapi_schema_cache import SchemaUnavailable
        from kaizen_server_extension.tools.openapi_sources import tool_name

        record = await self.sources.store.get_for(source_id, self.member)
        try:
            document = await self.sources.operations(record)
        except (SchemaUnavailable, EgressRefused) as exc:
            raise SourceUnreachable(str(exc), code=exc.code) from None
        usable, unavailable = self.sources.offerable(document)
        self.write_json({
            "source": record.id, "title": document.title, "digest": document.digest,
            "operations": [{**op.public(), "tool": tool_name(record.id, op.operation_id)}
                           for op in usable],
            "omitted": [{"where": where, "reason": reason}
                        for where, reason in (*document.omitted, *unavailable)],
            "omitted_count": document.omitted_count + len(unavailable)})


def openapi_source_routes(prefix: str,
                          source_id: str) -> list[tuple[str, type[web.RequestHandler]]]:
    base = rf"{prefix}/openapi-sources"
    return [(base, SourceListHandler), (rf"{base}/({source_id})", SourceHandler),
            (rf"{base}/({source_id})/operations", SourceOperationsHandler)]


_ERROR_TEXT = {
    401: "Not authenticated",
    404: "No such source of yours",
    409: "source_limit_reached: the member has 100 sources",
    422: "Schema violation; https_required, credentialed_url (user information or a query), "
         "invalid_url, cross_origin_refused, egress_port_refused or egress_address_refused",
    502: "The document could not be fetched or is not a usable OpenAPI document "
         "(openapi_schema_unavailable, schema_too_large, not_openapi, schema_unreadable), or "
         "the signed egress policy refused the fetch (egress_policy_missing, "
         "egress_policy_invalid, egress_policy_not_yet_valid, egress_policy_expired, "
         "egress_origin_not_in_policy, egress_address_refused)",
}


def openapi_sources_openapi() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) for ``api/openapi.py``."""
    source = ref("OpenApiSource")
    source_id = path_param("source_id")
    base = "/kaizen/api/openapi-sources"
    paths = {
        base: {
            "get": operation("The caller's external OpenAPI sources", "listOpenApiSources",
                             answer("Sources", {"type": "array", "items": source})),
            "post": operation(
                "Register an uncredentialed HTTPS OpenAPI document as a source of tools (at "
                "most 100 per member)", "createOpenApiSource",
                {**answer("Registered", source, 201), **error_answers(_ERROR_TEXT, 409, 422)},
                body_schema="SourceRegistration"),
        },
        f"{base}/{{source_id}}": {
            "get": operation("One of the caller's sources", "getOpenApiSource",
                             {**answer("The source", source), **error_answers(_ERROR_TEXT, 404)},
                             params=[source_id]),
            "put": operation(
                "Change one of the caller's sources (the whole pointer); a turn already running "
                "refuses its calls of the old one", "updateOpenApiSource",
                {**answer("The source now", source), **error_answers(_ERROR_TEXT, 404, 422)},
                params=[source_id], body_schema="SourceRegistration"),
            "delete": operation("Delete one of the caller's sources", "deleteOpenApiSource",
                                {"204": {"description": "Deleted"},
                                 **error_answers(_ERROR_TEXT, 404)},
                                params=[source_id]),
        },
        f"{base}/{{source_id}}/operations": {"get": operation(
            "What the source's document compiles into now: callable operations with their "
            "tool names and effect classes, and what was omitted", "listOpenApiSourceOperations",
            {**answer("Operations", ref("OpenApiSourceOperations")),
             **error_answers(_ERROR_TEXT, 404, 502)},
            params=[source_id])},
    }
    string = {"type": "string"}
    components = {
        "SourceRegistration": SourceRegistration.model_json_schema(),
        "OpenApiSource": {
            "type": "object",
            "required": ["id", "owner", "schema_url", "api_base", "cross_origin", "enabled",
                         "created_at", "updated_at"],
            "properties": {"id": string, "owner": string, "schema_url": string,
                           "api_base": string, "cross_origin": {"type": "boolean"},
                           "enabled": {"type": "boolean"},
                           "created_at": {"type": "string", "format": "date-time"},
                           "updated_at": {"type": "string", "format": "date-time"}}},
        "OpenApiSourceOperations": {
            "type": "object",
            "required": ["source", "title", "digest", "operations", "omitted",
                         "omitted_count"],
            "properties": {
                "source": string, "title": string, "digest": string,
                "operations": {"type": "array", "items": {
                    "type": "object",
                    "required": ["operation_id", "tool", "method", "path", "effect"],
                    "properties": {"operation_id": string,
                                   "tool": {"type": ["string", "null"]},
                                   "method": string, "path": string,
                                   "effect": {"enum": ["read", "write", "sensitive"]}}}},
                "omitted": {"type": "array", "items": {
                    "type": "object", "required": ["where", "reason"],
                    "properties": {"where": string, "reason": string}}},
                "omitted_count": {"type": "integer", "minimum": 0}}},
    }
    return paths, components
