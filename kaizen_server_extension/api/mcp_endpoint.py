"""Kaizen's own MCP endpoint (opt-in: ``KAIZEN_MCP_SERVE_ENABLED``; docs/mcp.md).

``POST /kaizen/mcp`` speaks MCP's streamable-HTTP transport in its stateless JSON form: each
POST carries one JSON-RPC message and, for a request, gets one ``application/json`` answer;
there is no session id, no server-initiated stream (GET) and nothing to terminate (DELETE).
The handshake-era protocol revisions are spoken (``initialize``); a client probing the
modern ``server/discover`` is told the method does not exist, and falls back.

The caller is whoever Jupyter's identity provider says: the same authentication as the REST
API (a token, or a cookie with its XSRF check). The tools listed and called are that member's
read tools, and every call runs through the guarded pipeline (``host/mcp_serving.py``).
This endpoint is not part of the REST API's OpenAPI document: its body is MCP's JSON-RPC.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from tornado import web

from kaizen_server_extension.api.base import KaizenHandler
from kaizen_server_extension.host.mcp_serving import McpServedTools
from kaizen_server_extension.tools.catalog import project

log = logging.getLogger("kaizen.api.mcp")

PATH = r"/kaizen/mcp"
#: The protocol revisions reached by the ``initialize`` handshake, oldest first.
PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MAX_BODY_BYTES = 1024 * 1024
SERVER_INFO = {"name": "kaizen", "title": "Kaizen for Jupyter", "version": "1"}
INSTRUCTIONS = ("The tools of this server read the authenticated Jupyter member's own Kaizen "
                "data (artifacts, Library, documents, conversations, tasks, "
                "agents). They only read.")

# JSON-RPC error codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602


class RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class McpEndpointHandler(KaizenHandler):
    @web.authenticated
    async def post(self) -> None:
        raw = self.body_bytes(MAX_BODY_BYTES)
        try:
            message = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._answer(None, error=RpcError(PARSE_ERROR, "The body is not valid JSON."),
                         status=400)
            return
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            self._answer(None, error=RpcError(INVALID_REQUEST, "Expected one JSON-RPC 2.0 "
                                              "message (batches are not supported)."),
                         status=400)
            return
        if "id" not in message or "method" not in message:
            # A notification, or the client's answer to a request this server never sends.
            self.set_status(202)
            self.finish()
            return
        request_id = message["id"]
        if not isinstance(request_id, str | int) or isinstance(request_id, bool):
            self._answer(None, error=RpcError(INVALID_REQUEST, "The id must be a string or "
                                              "an integer."), status=400)
            return
        params = message.get("params") or {}
        try:
            if not isinstance(params, dict):
                raise RpcError(INVALID_PARAMS, "params must be an object.")
            result = await self._dispatch(str(message.get("method")), params)
        except RpcError as exc:
            self._answer(request_id, error=exc)
            return
        self._answer(request_id, result=result)

    async def _dispatch(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "initialize":
            asked = params.get("protocolVersion")
            version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[-1]
            return {"protocolVersion": version,
                    "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": SERVER_INFO, "instructions": INSTRUCTIONS}
        if method == "ping":
            return {}
        served = McpServedTools(self.kaizen.tools)
        if method == "tools/list":
            tools = []
            for descriptor in await served.listed(self.member):
                advertised = project(descriptor)
                tools.append({
                    "name": advertised.name, "description": advertised.description,
                    "inputSchema": _plain(advertised.parameters),
                    "annotations": {"readOnlyHint": True, "destructiveHint": False,
                                    "idempotentHint": True, "openWorldHint": False}})
            return {"tools": tools}
        if method == "tools/call":
            name = params.get("name")
            arguments = params.get("arguments", {})
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise RpcError(INVALID_PARAMS, "tools/call needs a name and an arguments "
                                               "object.")
            result = await served.call(self.member, name, json.dumps(arguments))
            return {"content": [{"type": "text", "text": result.content}],
                    "isError": result.failed}
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method[:80]}")

    def _answer(self, request_id: Any, *, result: dict[str, Any] | None = None,
                error: RpcError | None = None, status: int = 200) -> None:
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        if error is not None:
            body["error"] = {"code": error.code, "message": error.message}
        else:
            body["result"] = result
        self.write_json(body, status=status)


def _plain(value: Any) -> Any:
    """A deep-frozen schema as plain JSON values."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def mcp_endpoint_routes() -> list[tuple[str, type[web.RequestHandler]]]:
    return [(PATH, McpEndpointHandler)]
