"""REST for "Allow for this conversation": the caller's own tool grants in one conversation.

A grant is made by approving a request with ``{"decision": "approve", "scope":
"conversation"}`` (``POST approvals/{id}``); these routes list and revoke the caller's grants.
Only ever the calling member's: another member's grants in the same shared room are not
theirs and never mentioned, and a conversation the caller does not take part in is 404.
"""

from __future__ import annotations

from typing import Any

from tornado import web

from kaizen_server_extension.api import params
from kaizen_server_extension.api.base import KaizenHandler
from kaizen_server_extension.api.openapi_parts import error_answers, path_param, ref
from kaizen_server_extension.store.tool_grants import ToolGrants

TOOL = params.TOOL


class ToolGrantsHandler(KaizenHandler):
    @web.authenticated
    async def get(self, conversation_id: str) -> None:
        grants = await ToolGrants(self.kaizen.store).list_for(self.member, conversation_id)
        self.write_json([g.public() for g in grants])


class ToolGrantHandler(KaizenHandler):
    @web.authenticated
    async def delete(self, conversation_id: str, tool: str) -> None:
        revoked = await ToolGrants(self.kaizen.store).revoke(self.member, conversation_id,
                                                             tool)
        self.write_json({"revoked": revoked.public()})


def tool_grant_routes(prefix: str,
                      conversation_id: str) -> list[tuple[str, type[web.RequestHandler]]]:
    base = rf"{prefix}/conversations/({conversation_id})/tool-grants"
    return [(base, ToolGrantsHandler), (rf"{base}/({TOOL})", ToolGrantHandler)]


#: What each error status means on these routes, in the OpenAPI document.
_ERROR_TEXT = {401: "Not authenticated",
               404: "No such conversation for you, or no such grant of yours"}


def _errors(*codes: int) -> dict[str, Any]:
    return error_answers(_ERROR_TEXT, *codes)


def tool_grants_openapi() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) for ``api/openapi.py``."""
    grant = ref("ToolGrant")
    conv_id = path_param("conversation_id")
    tool = path_param("tool", {"type": "string", "pattern": f"^{TOOL}$"})

    paths = {
        "/kaizen/api/conversations/{conversation_id}/tool-grants": {"get": {
            "summary": "The tools the caller allowed for the rest of this conversation "
                       "(approved with scope 'conversation'). Each answers only the caller's "
                       "own approval gate for that tool here; guardrails, permissions, "
                       "ceilings and the write guard still apply",
            "operationId": "listToolGrants", "parameters": [conv_id],
            "responses": {"200": {"description": "The caller's grants", "content": {
                "application/json": {"schema": {"type": "array", "items": grant}}}},
                **_errors(404)}}},
        "/kaizen/api/conversations/{conversation_id}/tool-grants/{tool}": {"delete": {
            "summary": "Revoke the caller's grant of one tool here: its next call asks again",
            "operationId": "revokeToolGrant", "parameters": [conv_id, tool],
            "responses": {"200": {"description": "Revoked", "content": {"application/json": {
                "schema": {"type": "object", "required": ["revoked"],
                           "properties": {"revoked": grant}}}}},
                **_errors(404)}}},
    }
    string = {"type": "string"}
    components = {
        "ToolGrant": {"type": "object",
                      "required": ["tool", "capability", "conversation_id", "granted_at"],
                      "properties": {"tool": string, "capability": {"enum": ["write"]},
                                     "conversation_id": string,
                                     "approval_id": {"type": ["string", "null"]},
                                     "granted_at": {"type": "string", "format": "date-time"}}},
    }
    return paths, components
