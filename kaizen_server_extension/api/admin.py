"""Admin REST routes: the tool policies the pipeline re-reads on every call.

Only members with the admin role (``KAIZEN_ADMIN_MEMBERS``) reach these routes; to everyone
else they answer 404, as if they did not exist (API.md: never 403 for what a caller may not
see). A rejected request writes nothing. A change takes effect on the next tool call, mid-turn
included, because the pipeline reads the policy per call (R-005, R-204).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool
from tornado import web

from kaizen_server_extension.api import params
from kaizen_server_extension.api.base import KaizenHandler
from kaizen_server_extension.api.params import query_value, refuse_undeclared_method
from kaizen_server_extension.protocol.errors import BadRequest, NotFound, SchemaViolation
from kaizen_server_extension.store.tool_policies import EVERYONE, ToolPolicyAdmin
from kaizen_server_extension.tools.decorators import TOOL_NAME_RE

TOOL = params.TOOL
MEMBER = params.MEMBER
_MEMBER_MAX = 200


class ToolPolicyChange(BaseModel):
    """``allowed: false`` denies the tool to the member (or to everyone, member ``*``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    allowed: StrictBool


class AdminHandler(KaizenHandler):
    # Every method reaches prepare() (TRACE and CONNECT too): to a non-admin, whatever the
    # method, these routes are the 404 of a path that does not exist; an admin gets the 405.
    SUPPORTED_METHODS = (*KaizenHandler.SUPPORTED_METHODS, "TRACE", "CONNECT")
    refuse_methods_first = False

    def check_route(self) -> None:
        if not self.kaizen.is_admin(self.member):
            # Not 403: a non-admin cannot tell that admin routes exist (API.md), not even
            # from how a malformed request to one is refused.
            raise NotFound("Not found.", code="not_found")
        refuse_undeclared_method(self)

    @web.authenticated
    def trace(self, *args: Any) -> None:
        """Never reached: prepare() refuses it (404, or 405 to an admin)."""
        raise web.HTTPError(405)

    connect = trace

    @property
    def policies(self) -> ToolPolicyAdmin:
        return ToolPolicyAdmin(self.kaizen.store)

    async def checked_tool(self, tool: str) -> str:
        # A registered tool, or a source selector or tool (docs/tool-policies.md).
        if not TOOL_NAME_RE.fullmatch(tool) \
                or not await self.kaizen.tools.policy_name_known(tool):
            raise SchemaViolation(f"No tool named {tool[:64]!r} is registered on this server.",
                                  code="unknown_tool")
        return tool

    @staticmethod
    def checked_member(member: str) -> str:
        if member != EVERYONE and (
            not member.strip() or member != member.strip() or len(member) > _MEMBER_MAX
            or any(ch.isspace() or ord(ch) < 32 for ch in member)
        ):
            raise SchemaViolation("The member must be a member name, or * for everyone.",
                                  code="invalid_member")
        return member


class ToolPoliciesHandler(AdminHandler):
    @web.authenticated
    async def get(self) -> None:
        tool = query_value(self, "tool")
        member = query_value(self, "member")
        if tool is not None and not TOOL_NAME_RE.fullmatch(tool):
            raise BadRequest("Query parameter 'tool' is not a tool name.", code="invalid_query")
        if member is not None and not member:
            raise BadRequest("Query parameter 'member' is empty.", code="invalid_query")
        rows = await self.policies.list(tool=tool, member=member)
        self.write_json([r.public() for r in rows])


class ToolPolicyHandler(AdminHandler):
    @web.authenticated
    async def put(self, tool: str, member: str) -> None:
        body = self.parse_body(ToolPolicyChange, limit=4096)
        record = await self.policies.set(await self.checked_tool(tool),
                                         self.checked_member(member), body.allowed,
                                         admin=self.member)
        self.write_json(record.public())

    @web.authenticated
    async def delete(self, tool: str, member: str) -> None:
        await self.policies.delete(await self.checked_tool(tool),
                                   self.checked_member(member), admin=self.member)
        self.set_status(204)
        self.finish()


def admin_routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    base = rf"{prefix}/admin/tool-policies"
    return [
        (base, ToolPoliciesHandler),
        (rf"{base}/({TOOL})/({MEMBER})", ToolPolicyHandler),
    ]


def admin_openapi() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) for ``api/openapi.py``."""
    json = "application/json"
    error = {"content": {json: {"schema": {"$ref": "#/components/schemas/Error"}}}}
    policy = {"$ref": "#/components/schemas/ToolPolicy"}
    not_admin = {"description": "Not found: also the answer to a caller who is not an admin",
                 **error}
    unauthenticated = {"description": "Not authenticated", **error}
    tool = {"name": "tool", "in": "path", "required": True,
            "description": "A tool registered on this server; the sources root "
                    "(sources); an enabled MCP server (mcp__<id>) or one of its tools "
                    "(mcp__<id>__<tool>), or the MCP family (mcp); with OpenAPI sources on, "
                    "the family (openapi), a source (openapi__<id>) or one of its tools "
                    "(openapi__<id>__<operationId>). An ancestor only tightens",
            "schema": {"type": "string"}}
    member = {"name": "member", "in": "path", "required": True,
              "description": "A member name, or * for everyone (a member's own row "
                             "overrides the everyone row)",
              "schema": {"type": "string"}}
    paths = {
        "/kaizen/api/admin/tool-policies": {"get": {
            "summary": "Admin: the tool policies (no row means allowed)",
            "operationId": "listToolPolicies",
            "parameters": [
                {"name": "tool", "in": "query", "required": False,
                 "schema": {"type": "string", "pattern": TOOL_NAME_RE.pattern}},
                {"name": "member", "in": "query", "required": False,
                 "schema": {"type": "string", "minLength": 1}}],
            "responses": {
                "200": {"description": "Policies",
                        "content": {json: {"schema": {"type": "array", "items": policy}}}},
                "400": {"description": "Malformed query", **error},
                "401": unauthenticated, "404": not_admin}}},
        "/kaizen/api/admin/tool-policies/{tool}/{member}": {
            "put": {
                "summary": "Admin: allow or deny a tool for a member or everyone; takes effect "
                           "on the next tool call, mid-turn included",
                "operationId": "setToolPolicy",
                "parameters": [tool, member],
                "requestBody": {"required": True, "content": {json: {
                    "schema": {"$ref": "#/components/schemas/ToolPolicyChange"}}}},
                "responses": {
                    "200": {"description": "The policy now in force",
                            "content": {json: {"schema": policy}}},
                    "400": {"description": "Malformed JSON", **error},
                    "401": unauthenticated, "404": not_admin,
                    "422": {"description": "Schema violation, unknown tool or invalid member",
                            **error}}},
            "delete": {
                "summary": "Admin: remove a policy row (the default, allowed, applies again "
                           "unless an everyone row says otherwise)",
                "operationId": "deleteToolPolicy",
                "parameters": [tool, member],
                "responses": {
                    "204": {"description": "Removed"},
                    "401": unauthenticated,
                    "404": {"description": "No such policy, or not an admin", **error},
                    "422": {"description": "Unknown tool or invalid member", **error}}},
        },
    }
    components = {
        "ToolPolicyChange": ToolPolicyChange.model_json_schema(),
        "ToolPolicy": {"type": "object",
                       "required": ["tool", "member", "allowed", "updated_by", "updated_at"],
                       "properties": {"tool": {"type": "string"},
                                      "member": {"type": "string"},
                                      "allowed": {"type": "boolean"},
                                      "updated_by": {"type": "string"},
                                      "updated_at": {"type": "string",
                                                     "format": "date-time"}}},
    }
    return paths, components
