"""The OpenAPI 3.1 document of the REST API, served at ``kaizen/api/openapi.json``.

Request schemas come from the pydantic models that validate them, so the document and the
server cannot disagree about a body.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel

from kaizen_server_extension._version import __version__
from kaizen_server_extension.api import schemas
from kaizen_server_extension.api.params import MAX_INT64, PATH_PARAMETERS, integer_schema

JSON = "application/json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _body(name: str) -> dict[str, Any]:
    return {"required": True, "content": {JSON: {"schema": _ref(name)}}}


def _ok(description: str, schema: dict[str, Any] | None = None,
        status: str = "200") -> dict[str, Any]:
    response: dict[str, Any] = {"description": description}
    if schema is not None:
        response["content"] = {JSON: {"schema": schema}}
    return {status: response}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "Malformed request", 401: "Not authenticated",
            403: "Visible but not yours to change", 404: "Not found or not visible to you",
            409: "Conflict with the current state", 413: "Too large",
            422: "Schema violation; unstorable_text when a field, path segment or query "
                 "value holds U+0000 or an unpaired surrogate (the message names it; nothing "
                 "is written)"}
    return {str(c): {"description": text[c], "content": {JSON: {"schema": _ref("Error")}}}
            for c in (401, *codes)}


def _op(summary: str, responses: dict[str, Any], *, body: str | None = None,
        params: list[dict[str, Any]] | None = None, op_id: str) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "operationId": op_id, "responses": responses}
    if body:
        op["requestBody"] = _body(body)
    if params:
        op["parameters"] = params
    return op


#: The flag of event data journaled with the stated escaping (store/storable.py).
_TEXT_ESCAPED = {
    "type": "boolean", "const": True,
    "description": "Present when the call's arguments or output held U+0000 or an unpaired "
                   "surrogate, which no database stores as text: every string of this data "
                   "(keys too) then has a backslash written as two and each such code point "
                   "written \\uXXXX (lowercase hex). Undo those two substitutions (the "
                   "Python client: Event.original_data()) to get the data exactly."}


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _query_int(name: str, description: str, minimum: int = 0,
               maximum: int = MAX_INT64) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": integer_schema(minimum, maximum)}


_ERROR = {"content": {JSON: {"schema": _ref("Error")}}}
#: What any operation may answer besides its own outcomes, by what it takes (API.md).
_COMMON = {
    "400": "Malformed request: a parameter or body that cannot be read (invalid UTF-8, "
           "malformed JSON, JSON nested deeper than 64 levels, an integer out of range)",
    "401": "Not authenticated",
    "404": "Not found or not visible to you; also any path whose ids do not match their "
           "pattern",
    "413": "Too large",
    "422": "Schema violation",
}


def _complete(paths: dict[str, Any]) -> None:
    """Give every path parameter its schema (``params.PATH_PARAMETERS``, as the routes take
    them) and every authenticated operation the error answers it can give: 400 and 401
    always, 404 with path parameters, 413 and 422 with a body. Existing answers are kept."""
    for path, item in paths.items():
        for operation in item.values():
            for parameter in operation.get("parameters", ()):
                if parameter["in"] == "path" and parameter["name"] in PATH_PARAMETERS:
                    parameter["schema"] = dict(PATH_PARAMETERS[parameter["name"]])
            if operation.get("security") == []:
                continue  # the probes: no parameters, no body, no authentication
            codes = ["400", "401"]
            if "{" in path:
                codes.append("404")
            if "requestBody" in operation:
                codes += ["413", "422"]
            responses = operation["responses"]
            for code in codes:
                responses.setdefault(code, {"description": _COMMON[code], **_ERROR})


def _model_schemas(*models: type[BaseModel]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


@cache
def openapi_document(*, library: bool = True, openapi_sources: bool = False,
                     credentials: bool = False) -> dict[str, Any]:
    """The document of the routes this server serves: the Library's paths only when
    ``library`` (KAIZEN_LIBRARY_ENABLED) is on, as ``handlers.routes`` registers them (R-140),
    and the member's OpenAPI sources only with ``openapi_sources`` (R-378)."""
    conv_id, run_id = _path_param("conversation_id"), _path_param("run_id")
    components = _model_schemas(schemas.CreateConversation, schemas.AddParticipant,
                                schemas.PostMessage, schemas.MemberSettings,
                                schemas.ApprovalDecision, schemas.OpenDestination)
    components.update({
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}},
        "Agent": {"type": "object", "required": ["id", "name", "mode", "version", "tools"],
                  "properties": {"id": {"type": "string"}, "name": {"type": "string"},
                                 "mode": {"enum": ["search", "chat"]},
                                 "version": {"type": "integer"},
                                 "tools": {"type": "array", "items": {"type": "string"}}}},
        "Conversation": {"type": "object",
                         "required": ["id", "agent_id", "title", "shared", "owner",
                                      "audience_version"],
                         "properties": {"id": {"type": "string"},
                                        "agent_id": {"type": "string"},
                                        "title": {"type": "string"},
                                        "shared": {"type": "boolean"},
                                        "owner": {"type": "string"},
                                        "audience_version": {"type": "integer"},
                                        "participants": {"type": "array",
                                                         "items": {"type": "string"}},
                                        "last_seq": {"type": "integer"},
                                        "active_run": {
                                            "type": ["object", "null"],
                                            "properties": {"id": {"type": "string"},
                                                           "status": {"type": "string"}}}}},
        "Accepted": {"type": "object", "required": ["input_id", "position", "run_id"],
                     "properties": {"input_id": {"type": "string"},
                                    "position": {"type": "integer"},
                                    "run_id": {"type": "string"}}},
        "Event": {"type": "object",
                  "required": ["seq", "conversation_id", "type", "actor", "at", "data"],
                  "properties": {"seq": {"type": "integer"},
                                 "conversation_id": {"type": "string"},
                                 "run_id": {"type": ["string", "null"]},
                                 "type": {"type": "string"}, "actor": {"type": "string"},
                                 "at": {"type": "string", "format": "date-time"},
                                 "data": {"type": "object", "description": (
                                     "Depends on type: ToolRequestedData for "
                                     "tool.requested, ToolSettledData for tool.settled, "
                                     "AnswerCommittedData for answer.committed, "
                                     "ProtocolFailedData for protocol.failed, "
                                     "CredentialRequestedData for credential.requested and "
                                     "CredentialSettledData for credential.settled (with "
                                     "credentials enabled); any event of a "
                                     "delegated turn carries a DelegationMarker. Text the "
                                     "databases cannot store (U+0000, unpaired surrogates) "
                                     "in a tool's output or arguments or in a model's "
                                     "answer is journaled escaped: then every string of "
                                     "data (object keys too) has \\ written \\\\ and "
                                     "each such code point written \\uXXXX (lowercase "
                                     "hex), and data holds text_escaped: true. Reversing "
                                     "those two substitutions gives the original exactly "
                                     "(docs/architecture.md: Text the databases cannot "
                                     "store).")}}},
        # The data of two event types, documented for clients that read them.
        "ToolRequestedData": {
            "type": "object", "required": ["step", "call_id", "name"],
            "description": "data of a tool.requested event: a dispatched call, journaled "
                           "before the tool runs.",
            "properties": {
                "step": {"type": "integer"}, "call_id": {"type": "string"},
                "name": {"type": "string"},
                "arguments": {"description": "The call's arguments, parsed when JSON, "
                                             "credentials redacted, bounded ({truncated, "
                                             "preview} when long)."},
                "text_escaped": _TEXT_ESCAPED,
                "delegation": _ref("DelegationMarker"),
                "placeholders": {
                    "type": "array", "items": _ref("GenerationPlaceholder"),
                    "description": "run_code only, and only when its arguments pass the "
                                   "tool's schema and target rules: one non-downloadable "
                                   "placeholder per declared artifact_targets name, in order "
                                   "([] for compute-only work). The call's tool.settled "
                                   "(same run_id and call_id) settles each one."}}},
        "GenerationPlaceholder": {
            "type": "object", "required": ["target"],
            "properties": {"target": {"type": "string", "description": (
                "The declared output file's normalised relative name.")}}},
        "ToolSettledData": {
            "type": "object", "required": ["step", "call_id", "name", "outcome"],
            "description": "data of a tool.settled event: the call's one outcome, journaled "
                           "by the backend only.",
            "properties": {
                "step": {"type": "integer"}, "call_id": {"type": "string"},
                "name": {"type": "string"},
                "outcome": {"enum": ["ok", "error", "raised", "timeout", "abandoned",
                                     "suppressed"]},
                "capability": {"type": "string"},
                "failure_domain": {"enum": ["none", "tool", "caller"]},
                "content": {"type": "string",
                            "description": "The bounded, redacted projection the model got."},
                "closes_turn": {"type": "boolean"},
                "text_escaped": _TEXT_ESCAPED,
                "delegation": _ref("DelegationMarker"),
                "delegated": {"type": "boolean", "const": True, "description": (
                    "Present when the call handed work to another agent (invoke_agent); "
                    "what that agent did is in the events carrying its DelegationMarker.")},
                "denied": {
                    "enum": ["staged_protocol_unavailable"],
                    "description": "Present when the call was refused before anything ran "
                                   "because its protocol was not callable on that step: "
                                   "staged_protocol_unavailable is a staged artifact "
                                   "operation (begin/append/finalize/discard_artifact) the "
                                   "step was not offered (R-252). The outcome is error and "
                                   "closes_turn is true; the run's protocol.failed and "
                                   "run.terminal carry the same reason."},
                "files": {
                    "type": "array", "items": _ref("StoredFile"),
                    "description": "run_code (and any call that stored files): the durable "
                                   "file stored for each declared target that was produced, "
                                   "so its placeholder becomes that file. A placeholder whose "
                                   "target has no entry was not produced and is removed. A "
                                   "call that never settles is settled by its run's "
                                   "run.terminal: its placeholders are removed."},
                "canvas": {
                    "type": "array", "items": _ref("CanvasItem"), "maxItems": 8,
                    "description": "Rich output the call shows on the chat canvas instead of "
                                   "handing it to the model (show_chat_canvas's Markdown, the "
                                   "PNG images a run_code program displayed); content holds "
                                   "one on-screen marker per item. Validated and bounded by "
                                   "the backend: at most 8 items, 20,000 characters of "
                                   "Markdown each, 512 KiB and 8192 pixels a side per PNG, "
                                   "1 MiB of journaled characters in all (R-277). Absent when "
                                   "the call shows nothing."},
                "canvas_dropped": {
                    "type": "boolean", "const": True,
                    "description": "Present when the call had a canvas that could not be shown "
                                   "(over a bound, not a complete PNG, or an error building or "
                                   "journaling it). The outcome is unchanged, and every "
                                   "on-screen marker in content was replaced with 'nothing "
                                   "was rendered; do not describe rows or images you were "
                                   "not given' (R-277, R-278)."}}},
        "DelegationMarker": {
            "type": "object", "required": ["id", "agent_id", "depth"],
            "description": "Present on the events of a turn that invoke_agent delegated to "
                           "another agent inside this run (model.step.started, "
                           "tool.requested, tool.settled, ...): the child's activity, "
                           "journaled in the parent run under the parent's member and "
                           "authority. Its call ids are prefixed with the delegation id. The "
                           "child's answer is not an answer.committed: it is the content of "
                           "the parent's invoke_agent tool.settled, whose delegation_id is "
                           "this id (docs/delegation.md).",
            "properties": {"id": {"type": "string"}, "agent_id": {"type": "string"},
                           "agent_version": {"type": "integer"},
                           "depth": {"type": "integer", "minimum": 1}}},
        "AnswerCommittedData": {
            "type": "object", "required": ["step", "text"],
            "description": "data of an answer.committed event: the answer as published, "
                           "after the backend's guards.",
            "properties": {
                "step": {"type": "integer"}, "text": {"type": "string"},
                "model": {"type": ["string", "null"]}, "usage": {"type": "object"},
                "citations_removed": {
                    "type": "integer", "description": "How many citations the answer made "
                    "that this turn's evidence does not hold were removed (R-071)."},
                "grounding": {
                    "enum": ["no_support"], "description": "The turn was grounded (a Search "
                    "agent's, or it called a retrieval tool) and found no support, so text "
                    "is the policy's statement that nothing supports an answer instead of "
                    "what the model wrote (R-103; docs/retrieval.md)."},
                "replaced_chars": {"type": "integer", "description": "With grounding: the "
                                   "length of the model's text that was not published."},
                "sources_listed": {
                    "type": "integer", "description": "A Search agent's supported answer "
                    "cited none of its retrieved passages, so the backend listed this many of "
                    "them under it as 'Sources:' (R-071; docs/retrieval.md)."},
                "text_escaped": _TEXT_ESCAPED}},
        "ProtocolFailedData": {
            "type": "object",
            "required": ["step", "protocol", "reason", "call_id", "name", "calls_not_run"],
            "description": "data of a protocol.failed event: journaled at most once per run, "
                           "when a model step asked for a staged artifact operation it was "
                           "not offered. The offending call is settled denied, none of the "
                           "step's other calls runs, and the run ends failed with the same "
                           "reason (R-252). An open draft is left as it was.",
            "properties": {
                "step": {"type": "integer"},
                "protocol": {"const": "staged_artifact"},
                "reason": {"enum": ["staged_protocol_unavailable"]},
                "call_id": {"type": "string",
                            "description": "The denied call (its tool.settled has denied)."},
                "name": {"type": "string"},
                "calls_not_run": {"type": "integer", "minimum": 0,
                                  "description": "The step's other calls, none of which was "
                                                 "requested."}}},
        "CanvasItem": {
            "type": "object", "required": ["kind"],
            "description": "One item of a tool call's chat canvas: Markdown (rendered as "
                           "untrusted Markdown: model-authored HTML is never executed) or a "
                           "PNG image.",
            "properties": {
                "kind": {"enum": ["markdown", "image"]},
                "title": {"type": ["string", "null"],
                          "description": "markdown: an optional heading."},
                "markdown": {"type": "string", "description": "markdown: the source."},
                "media_type": {"const": "image/png", "description": "image only."},
                "data": {"type": "string", "contentEncoding": "base64",
                         "contentMediaType": "image/png",
                         "description": "image: the checked PNG bytes in canonical base64, "
                                        "to be shown only as a data:image/png;base64 URI."},
                "alt": {"type": "string", "description": "image: alternative text."},
                "width": {"type": "integer", "minimum": 1, "maximum": 8192},
                "height": {"type": "integer", "minimum": 1, "maximum": 8192}}},
        "StoredFile": {
            "type": "object",
            "required": ["target", "artifact_id", "version", "filename", "media_type"],
            "properties": {
                "target": {"type": "string",
                           "description": "The placeholder's target this file fills."},
                "artifact_id": {"type": "string"},
                "version": {"type": "integer", "minimum": 1,
                            "description": "The exact stored version; download it with "
                                           "GET artifacts/{id}/versions/{n}/download."},
                "filename": {"type": "string"}, "media_type": {"type": "string"}}},
        "JournalPage": {"type": "object", "required": ["events", "next"],
                        "properties": {"events": {"type": "array", "items": _ref("Event")},
                                       "next": {"type": "integer"}}},
        "Run": {"type": "object",
                "required": ["id", "conversation_id", "status", "input_position", "member"],
                "properties": {"id": {"type": "string"},
                               "conversation_id": {"type": "string"},
                               "status": {"enum": ["queued", "running", "awaiting_approval",
                                                   "completed", "failed",
                                                   "answer_unavailable", "cancelled"]},
                               "outcome": {"type": ["string", "null"]},
                               "input_position": {"type": "integer"},
                               "member": {"type": "string"},
                               "agent_version": {"type": ["string", "null"]},
                               "steps": {"type": "integer"},
                               "tool_calls": {"type": "integer"}}},
        "SettingsView": {"type": "object", "required": ["approval_mode"],
                         "properties": {"approval_mode": {"enum": ["always_ask",
                                                                   "ask_for_writes",
                                                                   "never_ask"]},
                                        "model": {"type": ["string", "null"]},
                                        "default_model": {"type": ["string", "null"]},
                                        "tool_result_compression": {"type": "boolean"}}},
        "ApprovalView": {"type": "object",
                         "required": ["id", "run_id", "tool", "status", "arguments"],
                         "properties": {"id": {"type": "string"},
                                        "run_id": {"type": "string"},
                                        "conversation_id": {"type": "string"},
                                        "tool": {"type": "string"},
                                        "capability": {"type": "string"},
                                        "arguments": {"type": "object"},
                                        "args_digest": {"type": "string"},
                                        "status": {"type": "string"},
                                        "created_at": {"type": "string"}}},
        "Catalog": {"type": "object", "required": ["digest", "tools"],
                    "properties": {"digest": {"type": "string"},
                                   "tools": {"type": "array", "items": {"type": "object"}},
                                   "deferred": {"type": "array",
                                                "items": {"type": "string"}},
                                   "unavailable": {
                                       "type": "array",
                                       "description": "Sources that gave no tools now, and "
                                                      "why (e.g. credential_required: an MCP "
                                                      "server that lists its tools only with "
                                                      "a credential the member has not "
                                                      "remembered; egress_origin_not_in_policy;"
                                                      " mcp_unavailable).",
                                       "items": {"type": "object",
                                                 "required": ["source", "reason"],
                                                 "properties": {
                                                     "source": {"type": "string"},
                                                     "reason": {"type": "string"}}}}}},
        "EventFrame": {"allOf": [_ref("Event"), {
            "type": "object", "required": ["live"], "properties": {"live": {"const": False}}}]},
        "LiveFrame": {"type": "object",
                      "required": ["type", "live", "conversation_id", "run_id", "data"],
                      "properties": {"type": {"type": "string"}, "live": {"const": True},
                                     "conversation_id": {"type": "string"},
                                     "run_id": {"type": ["string", "null"]},
                                     "data": {"type": "object"}}},
        "Me": {"type": "object", "required": ["member", "admin"],
               "properties": {"member": {"type": "string"}, "admin": {"type": "boolean"}}},
        # A typed destination of exact resource ids; never a navigation URL.
        "NotificationDestination": {"oneOf": [
            {"type": "object", "required": ["kind", "conversation_id", "run_id"],
             "additionalProperties": False,
             "properties": {"kind": {"const": "chat"}, "conversation_id": {"type": "string"},
                            "run_id": {"type": "string"}}},
            {"type": "object", "required": ["kind", "prompt_id"],
             "additionalProperties": False,
             "properties": {"kind": {"const": "prompt"}, "prompt_id": {"type": "string"},
                            "run_id": {"type": ["string", "null"]}}},
            {"type": "object", "required": ["kind", "task_id", "run_id"],
             "additionalProperties": False,
             "properties": {"kind": {"const": "task_run"}, "task_id": {"type": "string"},
                            "run_id": {"type": "string"}}},
        ]},
        "Notification": {"type": "object",
                         "required": ["id", "destination", "status", "title", "attendance",
                                      "created_at", "acked_at", "unread"],
                         "properties": {"id": {"type": "string"},
                                        "destination": _ref("NotificationDestination"),
                                        "status": {"type": "string"},
                                        "title": {"type": "string"},
                                        "attendance": {"enum": ["attended", "unattended",
                                                                "unknown"]},
                                        "created_at": {"type": "string",
                                                       "format": "date-time"},
                                        "acked_at": {"type": ["string", "null"],
                                                     "format": "date-time"},
                                        "unread": {"type": "boolean"}}},
    })
    conversation = _ref("Conversation")
    paths: dict[str, Any] = {
        "/kaizen/api/openapi.json": {"get": _op(
            "This document", _ok("OpenAPI 3.1 document", {"type": "object"}),
            op_id="getOpenAPI")},
        "/kaizen/api/agents": {"get": _op(
            "Agents visible to the member",
            {**_ok("Agents", {"type": "array", "items": _ref("Agent")}), **_errors()},
            op_id="listAgents")},
        "/kaizen/api/agents/{agent_id}": {"get": _op(
            "One agent", {**_ok("Agent", _ref("Agent")), **_errors(404)},
            params=[_path_param("agent_id")], op_id="getAgent")},
        "/kaizen/api/conversations": {
            "get": _op("The member's conversations",
                       {**_ok("Conversations", {"type": "array", "items": conversation}),
                        **_errors()}, op_id="listConversations"),
            "post": _op("Create a conversation",
                        {**_ok("Created", conversation, "201"), **_errors(400, 404, 422)},
                        body="CreateConversation", op_id="createConversation"),
        },
        "/kaizen/api/conversations/{conversation_id}": {"get": _op(
            "One conversation", {**_ok("Conversation", conversation), **_errors(404)},
            params=[conv_id], op_id="getConversation")},
        "/kaizen/api/conversations/{conversation_id}/participants": {"post": _op(
            "Add a participant (owner only); the audience version increments",
            {**_ok("Conversation", conversation), **_errors(400, 403, 404, 409, 422)},
            body="AddParticipant", params=[conv_id], op_id="addParticipant")},
        "/kaizen/api/conversations/{conversation_id}/participants/{member}": {"delete": _op(
            "Remove a participant (owner only); they lose access at once",
            {**_ok("Conversation", conversation), **_errors(403, 404, 409)},
            params=[conv_id, _path_param("member")], op_id="removeParticipant")},
        "/kaizen/api/conversations/{conversation_id}/messages": {"post": _op(
            "Accept a message into the room's queue; the same idempotency key answers the "
            "same acceptance and writes nothing. Optional attachments (artifact ids the "
            "sender may read) are pinned to exact versions; an unreadable one is 404 and "
            "nothing is stored",
            {**_ok("Accepted", _ref("Accepted"), "202"), **_errors(400, 404, 409, 413, 422)},
            body="PostMessage", params=[conv_id], op_id="postMessage")},
        "/kaizen/api/conversations/{conversation_id}/journal": {"get": _op(
            "Journal events after a sequence number",
            {**_ok("Page", _ref("JournalPage")), **_errors(400, 404)},
            params=[conv_id, _query_int("after", "Return events with seq greater than this"),
                    _query_int("limit", "At most this many events (1-1000, default 100)",
                               1, 1000)],
            op_id="readJournal")},
        # A websocket: OpenAPI cannot describe frames, so the handshake is documented and the
        # frame shapes are the EventFrame and LiveFrame components.
        "/kaizen/api/conversations/{conversation_id}/events": {"get": _op(
            "Websocket of the conversation's journal: EventFrame (live=false) in seq order "
            "from after+1 with no gap or duplicate, then as appended; LiveFrame (live=true) "
            "for live-only events. Closes with 4404 when the member stops being a "
            "participant. Closing it cancels nothing; reconnect with after=<last seq>.",
            {"101": {"description": "Switching Protocols (websocket)"},
             "426": {"description": "Upgrade Required: a plain HTTP GET (no Upgrade: "
                                    "websocket), once the caller and room are checked",
                     "content": {JSON: {"schema": _ref("Error")}}},
             **_errors(400, 404)},
            params=[conv_id, _query_int("after", "Send events with seq greater than this "
                                                 "(default 0)")],
            op_id="streamEvents")},
        "/kaizen/api/runs/{run_id}": {"get": _op(
            "One run", {**_ok("Run", _ref("Run")), **_errors(404)}, params=[run_id],
            op_id="getRun")},
        "/kaizen/api/runs/{run_id}/cancel": {"post": _op(
            "Cancel a run; it settles cancelled exactly once",
            {**_ok("Cancelled", _ref("Run"), "202"), **_errors(404, 409)}, params=[run_id],
            op_id="cancelRun")},
        "/kaizen/api/approvals": {"get": _op(
            "The member's approval requests",
            {**_ok("Approvals", {"type": "array", "items": _ref("ApprovalView")}),
             **_errors(400)},
            params=[{"name": "status", "in": "query", "required": False,
                     "schema": {"enum": ["pending", "approved", "denied", "consumed"]}}],
            op_id="listApprovals")},
        "/kaizen/api/approvals/{approval_id}": {"post": _op(
            "Decide an approval request once; a second decision is a conflict. Approving "
            "with scope 'conversation' also allows the tool for the rest of the "
            "conversation, for the caller (422 grant_not_allowed for a tool that asks "
            "every time)",
            {**_ok("Decided", {"type": "object"}), **_errors(404, 409, 422)},
            body="ApprovalDecision", params=[_path_param("approval_id")],
            op_id="decideApproval")},
        "/kaizen/api/notifications": {"get": _op(
            "The member's completion inbox, newest first (at most 200). A run's initiating "
            "member gets one notice when it settles, unless they were watching the room",
            {**_ok("Notifications", {"type": "array", "items": _ref("Notification")}),
             **_errors(400)},
            params=[{"name": "unread", "in": "query", "required": False,
                     "description": "1: only notices not yet acknowledged",
                     "schema": {"enum": ["0", "1", "true", "false"]}}],
            op_id="listNotifications")},
        "/kaizen/api/notifications/ack": {"post": _op(
            "Acknowledge the member's unread notices of exactly the destination the client "
            "has open (kind and exact resource ids; the run too when given), and no other",
            {**_ok("Acknowledged", {"type": "object", "properties": {"acknowledged": {
                "type": "array", "items": _ref("Notification")}}}), **_errors(400, 422)},
            body="OpenDestination", op_id="ackOpenDestination")},
        "/kaizen/api/notifications/{notification_id}/ack": {"post": _op(
            "Acknowledge one of the member's notices (idempotent)",
            {**_ok("Acknowledged", _ref("Notification")), **_errors(404)},
            params=[_path_param("notification_id")], op_id="ackNotification")},
        "/kaizen/api/tools": {"get": _op(
            "The tool catalog this member and agent would get",
            {**_ok("Catalog", _ref("Catalog")), **_errors(404)},
            params=[{"name": "conversation_id", "in": "query", "required": False,
                     "schema": {"type": "string"}},
                    {"name": "agent_id", "in": "query", "required": False,
                     "schema": {"type": "string"}}],
            op_id="listTools")},
        "/kaizen/api/members/me": {"get": _op(
            "Who the caller is", {**_ok("Me", _ref("Me")), **_errors()}, op_id="getMe")},
        "/kaizen/api/members/me/settings": {
            "get": _op("The member's settings", {**_ok("Settings", _ref("SettingsView")),
                                                 **_errors()}, op_id="getSettings"),
            "put": _op("Change the member's settings",
                       {**_ok("Settings", _ref("SettingsView")), **_errors(400, 422)},
                       body="MemberSettings", op_id="putSettings"),
        },
    }
    from kaizen_server_extension.api.artifacts import artifact_openapi

    artifact_paths, artifact_components = artifact_openapi()
    paths.update(artifact_paths)
    components.update(artifact_components)
    from kaizen_server_extension.api.kernel_console import kernel_console_openapi

    kernel_paths, kernel_components = kernel_console_openapi()
    paths.update(kernel_paths)
    components.update(kernel_components)
    from kaizen_server_extension.api.notebooks import notebook_openapi

    notebook_paths, notebook_components = notebook_openapi()
    paths.update(notebook_paths)
    components.update(notebook_components)
    if library:
        from kaizen_server_extension.api.library import library_openapi

        library_paths, library_components = library_openapi()
        paths.update(library_paths)
        components.update(library_components)
    from kaizen_server_extension.api.documents import documents_openapi

    document_paths, document_components = documents_openapi()
    paths.update(document_paths)
    components.update(document_components)
    from kaizen_server_extension.api.health import health_openapi

    health_paths, health_components = health_openapi()
    paths.update(health_paths)
    components.update(health_components)
    from kaizen_server_extension.api.jupyter_files import jupyter_files_openapi

    file_paths, file_components = jupyter_files_openapi()
    paths.update(file_paths)
    components.update(file_components)
    from kaizen_server_extension.api.tool_grants import tool_grants_openapi

    grant_paths, grant_components = tool_grants_openapi()
    paths.update(grant_paths)
    components.update(grant_components)
    from kaizen_server_extension.api.tool_choices import tool_choices_openapi

    choice_paths, choice_components = tool_choices_openapi()
    paths.update(choice_paths)
    components.update(choice_components)
    from kaizen_server_extension.api.tasks import tasks_openapi

    task_paths, task_components = tasks_openapi()
    paths.update(task_paths)
    components.update(task_components)
    if openapi_sources:
        from kaizen_server_extension.api.openapi_sources import openapi_sources_openapi

        source_paths, source_components = openapi_sources_openapi()
        paths.update(source_paths)
        components.update(source_components)
    from kaizen_server_extension.api.admin import admin_openapi

    admin_paths, admin_components = admin_openapi()
    paths.update(admin_paths)
    components.update(admin_components)
    if credentials:
        # Only with KAIZEN_CREDENTIALS_ENABLED, as handlers.routes registers them.
        from kaizen_server_extension.api.credentials import credentials_openapi

        credential_paths, credential_components = credentials_openapi()
        paths.update(credential_paths)
        components.update(credential_components)
    _complete(paths)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Kaizen for Jupyter", "version": __version__,
                 "description": "REST API of the Kaizen Jupyter server extension. Paths are "
                 "relative to the Jupyter server's base_url."},
        "servers": [{"url": "/"}],
        "security": [{"token": []}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"token": {"type": "apiKey", "in": "header",
                                          "name": "Authorization",
                                          "description": "`token <jupyter or member token>`"}},
        },
    }
