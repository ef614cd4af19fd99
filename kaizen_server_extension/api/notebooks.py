"""REST for the member's notebooks (docs/notebook.md): attach one to a conversation, allow or
revoke kernel access there, decide proposed cell edits and report what the browser did, and
upload a bounded data file (``%kaizen_attach``).

Everything is the calling member's own: another member's proposal or a conversation the
caller cannot see is 404. Reading a notebook asks the Jupyter authorizer for ``read`` on
``contents``, allowing kernel access for ``execute`` on ``kernels``: Kaizen never reaches a
file or kernel its member could not reach through JupyterLab.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints, WithJsonSchema
from tornado import web

from kaizen_server_extension.api.base import KaizenHandler
from kaizen_server_extension.api.openapi_parts import answer, body, error_answers, path_param, ref
from kaizen_server_extension.api.params import ID, NUMBER, path_int, query_value
from kaizen_server_extension.jupyter_files import NOTEBOOK_PATH_PATTERN
from kaizen_server_extension.notebooks.service import NotebookRefused, NotebookService
from kaizen_server_extension.protocol.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    MemberError,
    NotFound,
    SchemaViolation,
    TooLarge,
)
from kaizen_server_extension.store.artifacts import ArtifactStore

#: Bytes of one uploaded data file (a DataFrame as CSV or Parquet).
MAX_UPLOAD_BYTES = 25 * 1024 * 1024
UPLOAD_TYPES = {"text/csv": ".csv", "application/vnd.apache.parquet": ".parquet"}
_UPLOAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,119}$")
#: The file name a client gives: the media type's extension is added when it lacks it.
_GIVEN_NAME = r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,111}$"


class AttachNotebook(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    path: Annotated[str, StringConstraints(min_length=1, max_length=1024,
                                           pattern=r"^[^\x00]*\.ipynb$"),
                    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 1024,
                                    "pattern": NOTEBOOK_PATH_PATTERN})]


class CellDecision(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    decision: Literal["accept", "reject"]
    #: Run the inserted code cell once it is applied (insert of a code cell only).
    run_after: bool = False


class CellResult(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    outcome: Literal["applied", "stale", "failed", "undone"]
    detail: Annotated[str, StringConstraints(max_length=300)] = ""


_REFUSAL_STATUS: dict[str, type[MemberError]] = {
    "notebook_not_found": NotFound, "not_a_notebook": SchemaViolation,
    "notebook_too_large": TooLarge,
}


def _member_error(refused: NotebookRefused) -> MemberError:
    return _REFUSAL_STATUS.get(refused.code, Conflict)(refused.message, code=refused.code)


class _NotebookHandler(KaizenHandler):
    @property
    def notebooks(self) -> NotebookService:
        service = self.kaizen.tools.notebooks
        if not isinstance(service, NotebookService):
            raise Conflict("Notebooks cannot be reached on this server.",
                           code="notebooks_unavailable")
        return service

    def _require(self, action: str, resource: str, message: str, code: str) -> None:
        if not self.authorizer.is_authorized(self, self.current_user, action, resource):
            raise Forbidden(message, code=code)


class AttachNotebookHandler(_NotebookHandler):
    @web.authenticated
    async def post(self, conversation_id: str) -> None:
        body = self.parse_body(AttachNotebook)
        await self.kaizen.store.conversations.get_for(conversation_id, self.member)
        self._require("read", "contents", "You are not allowed to read files on this Jupyter "
                      "server.", "contents_not_permitted")
        try:
            attached = await self.notebooks.attach(self.member, conversation_id, body.path)
        except NotebookRefused as refused:
            raise _member_error(refused) from None
        self.write_json(attached.public(), status=201)


class KernelAccessHandler(_NotebookHandler):
    async def _view(self, conversation_id: str) -> dict[str, Any]:
        granted = await self.notebooks.records.kernel_access(self.member, conversation_id)
        return {"allowed": granted is not None,
                "granted_at": granted.isoformat() if granted else None}

    @web.authenticated
    async def get(self, conversation_id: str) -> None:
        self.write_json(await self._view(conversation_id))

    @web.authenticated
    async def put(self, conversation_id: str) -> None:
        await self.kaizen.store.conversations.get_for(conversation_id, self.member)
        self._require("execute", "kernels", "You are not allowed to use Jupyter kernels on "
                      "this server.", "kernels_not_permitted")
        await self.notebooks.records.allow_kernel_access(self.member, conversation_id)
        self.write_json(await self._view(conversation_id))

    @web.authenticated
    async def delete(self, conversation_id: str) -> None:
        await self.notebooks.records.revoke_kernel_access(self.member, conversation_id)
        self.write_json(await self._view(conversation_id))


#: Ordinals a proposal may have (a proposal holds at most 16 cells; larger ones are 404).
MAX_ORDINAL = 999


def _ordinal(raw: str) -> int:
    return path_int(raw, minimum=0, maximum=MAX_ORDINAL, code="invalid_ordinal",
                    message="A cell ordinal is a whole number.")


class ProposalHandler(_NotebookHandler):
    @web.authenticated
    async def get(self, proposal_id: str) -> None:
        record = await self.notebooks.records.get(self.member, proposal_id)
        self.write_json(record.public())


class CellDecisionHandler(_NotebookHandler):
    @web.authenticated
    async def post(self, proposal_id: str, ordinal: str) -> None:
        body = self.parse_body(CellDecision)
        cell = await self.notebooks.records.decide(
            self.member, proposal_id, _ordinal(ordinal), accept=body.decision == "accept",
            run_after=body.run_after)
        self.write_json(cell.public())


class CellResultHandler(_NotebookHandler):
    @web.authenticated
    async def post(self, proposal_id: str, ordinal: str) -> None:
        body = self.parse_body(CellResult)
        cell = await self.notebooks.records.record_outcome(
            self.member, proposal_id, _ordinal(ordinal), body.outcome, body.detail)
        self.write_json(cell.public())


class UploadHandler(KaizenHandler):
    """A bounded data file for the next message (``%kaizen_attach``): stored as the member's
    artifact for that name in this conversation; attach its id to a message to pin it."""

    @web.authenticated
    async def post(self, conversation_id: str) -> None:
        name = query_value(self, "filename") or ""
        media_type = (self.request.headers.get("Content-Type") or "").split(";")[0].strip()
        extension = UPLOAD_TYPES.get(media_type)
        if extension is None:
            raise SchemaViolation("Upload CSV (text/csv) or Parquet "
                                  "(application/vnd.apache.parquet).", code="unsupported_type")
        if re.fullmatch(_GIVEN_NAME, name) and not name.endswith(extension):
            name += extension  # "sales" as text/csv is stored as "sales.csv"
        if not _UPLOAD_NAME.fullmatch(name) or not name.endswith(extension):
            raise BadRequest(f"filename must be a plain name (ending in {extension}).",
                             code="invalid_filename")
        # An empty file is a file (a CSV of no rows): stored as it is.
        content = self.body_bytes(MAX_UPLOAD_BYTES)
        await self.kaizen.store.conversations.get_for(conversation_id, self.member)
        record, reused = await ArtifactStore(self.kaizen.store).persist_file(
            self.member, conversation_id, None, name, content, media_type)
        self.write_json({"artifact_id": record.artifact_id, "version": record.version,
                         "filename": name, "media_type": media_type, "size": record.size,
                         "reused": reused}, status=201)


def notebook_routes(prefix: str, conversation_id: str) -> list[
        tuple[str, type[web.RequestHandler]]]:
    conversation = rf"{prefix}/conversations/({conversation_id})"
    proposal = rf"{prefix}/notebook-edits/({ID})"
    return [
        (rf"{conversation}/notebooks", AttachNotebookHandler),
        (rf"{conversation}/notebook-kernel-access", KernelAccessHandler),
        (rf"{conversation}/uploads", UploadHandler),
        (proposal, ProposalHandler),
        (rf"{proposal}/cells/({NUMBER})/decision", CellDecisionHandler),
        (rf"{proposal}/cells/({NUMBER})/result", CellResultHandler),
    ]


#: What each error status means on these routes, in the OpenAPI document.
_ERROR_TEXT = {400: "Malformed request", 401: "Not authenticated",
               403: "The Jupyter authorizer does not allow it", 404: "Not found or not yours",
               409: "Conflict with the current state", 413: "Too large",
               422: "Schema violation"}


def _errors(*codes: int) -> dict[str, Any]:
    return error_answers(_ERROR_TEXT, *codes)


def notebook_openapi() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) for ``api/openapi.py``."""

    conv = path_param("conversation_id")
    proposal = path_param("proposal_id")
    ordinal = path_param("ordinal", {"type": "integer", "minimum": 0, "maximum": 15})
    access = {"summary": "", "parameters": [conv]}
    paths: dict[str, Any] = {
        "/kaizen/api/conversations/{conversation_id}/notebooks": {"post": {
            "summary": "Attach a notebook from the Jupyter root: read it through the "
                       "ContentsManager and store its bytes as the member's artifact version "
                       "for that path here (unchanged bytes reuse the version); name the "
                       "artifact id in a message's attachments to pin it",
            "operationId": "attachNotebook", "parameters": [conv],
            "requestBody": body("AttachNotebook"),
            "responses": {**answer("Attached", ref("AttachedNotebook"), 201),
                          **_errors(400, 403, 404, 409, 413, 422)}}},
        "/kaizen/api/conversations/{conversation_id}/notebook-kernel-access": {
            "get": {**access, "summary": "Whether the member allowed inspect_notebook_kernel "
                    "in this conversation", "operationId": "getNotebookKernelAccess",
                    "responses": {**answer("Access", ref("NotebookKernelAccess")), **_errors(404)}},
            "put": {**access, "summary": "Allow inspect_notebook_kernel's fixed probe in the "
                    "kernels of notebooks attached here (idempotent)",
                    "operationId": "allowNotebookKernelAccess",
                    "responses": {**answer("Access", ref("NotebookKernelAccess")),
                                  **_errors(403, 404, 409)}},
            "delete": {**access, "summary": "Revoke it; the next inspection is refused",
                       "operationId": "revokeNotebookKernelAccess",
                       "responses": {**answer("Access", ref("NotebookKernelAccess")),
                                     **_errors(404, 409)}},
        },
        "/kaizen/api/conversations/{conversation_id}/uploads": {"post": {
            "summary": "Upload a data file (CSV or Parquet, at most 25 MiB) as the member's "
                       "artifact for that file name here; attach its id to a message",
            "operationId": "uploadDataFile",
            "parameters": [conv, {
                "name": "filename", "in": "query", "required": True,
                "description": "A plain file name; the media type's extension (.csv, "
                               ".parquet) is added when it does not end with it",
                "schema": {"type": "string", "pattern": _GIVEN_NAME}}],
            "requestBody": {"required": True, "content": {
                media: {"schema": {"type": "string", "format": "binary"}}
                for media in UPLOAD_TYPES}},
            "responses": {**answer("Stored", ref("UploadedFile"), 201),
                          **_errors(400, 404, 413, 422)}}},
        "/kaizen/api/notebook-edits/{proposal_id}": {"get": {
            "summary": "One of the member's notebook edit proposals with each cell's state",
            "operationId": "getNotebookEditProposal", "parameters": [proposal],
            "responses": {**answer("Proposal", ref("NotebookEditProposal")), **_errors(404)}}},
        "/kaizen/api/notebook-edits/{proposal_id}/cells/{ordinal}/decision": {"post": {
            "summary": "Accept or reject one proposed cell, once (a second decision is 409)",
            "operationId": "decideNotebookEditCell", "parameters": [proposal, ordinal],
            "requestBody": body("CellDecision"),
            "responses": {**answer("Decided", ref("NotebookEditCell")),
                          **_errors(400, 404, 409, 422)}}},
        "/kaizen/api/notebook-edits/{proposal_id}/cells/{ordinal}/result": {"post": {
            "summary": "Record what the member's browser did with an accepted cell: applied, "
                       "stale (the open notebook no longer matched), failed; undone after "
                       "applied",
            "operationId": "recordNotebookEditResult", "parameters": [proposal, ordinal],
            "requestBody": body("CellResult"),
            "responses": {**answer("Recorded", ref("NotebookEditCell")),
                          **_errors(400, 404, 409, 422)}}},
    }
    string, nullable = {"type": "string"}, {"type": ["string", "null"]}
    cell = {"type": "object",
            "required": ["ordinal", "op", "cell_id", "cell_type", "decision", "run_after"],
            "properties": {"ordinal": {"type": "integer"},
                           "op": {"enum": ["insert", "replace", "delete"]},
                           "cell_id": string, "after_cell_id": nullable,
                           "cell_type": {"enum": ["code", "markdown", "raw"]},
                           "base_source": nullable, "source": nullable,
                           "decision": {"enum": ["pending", "accepted", "rejected"]},
                           "run_after": {"type": "boolean"},
                           "outcome": {"enum": ["applied", "stale", "failed", "undone",
                                                None]}}}
    components: dict[str, Any] = {
        "AttachNotebook": AttachNotebook.model_json_schema(),
        "CellDecision": CellDecision.model_json_schema(),
        "CellResult": CellResult.model_json_schema(),
        "AttachedNotebook": {
            "type": "object",
            "required": ["artifact_id", "version", "path", "cells", "digest", "reused"],
            "properties": {"artifact_id": string, "version": {"type": "integer"},
                           "path": string, "cells": {"type": "integer"}, "digest": string,
                           "reused": {"type": "boolean"}}},
        "NotebookKernelAccess": {
            "type": "object", "required": ["allowed", "granted_at"],
            "properties": {"allowed": {"type": "boolean"},
                           "granted_at": {"type": ["string", "null"], "format": "date-time"}}},
        "UploadedFile": {
            "type": "object",
            "required": ["artifact_id", "version", "filename", "media_type", "size"],
            "properties": {"artifact_id": string, "version": {"type": "integer"},
                           "filename": string, "media_type": string,
                           "size": {"type": "integer"}, "reused": {"type": "boolean"}}},
        "NotebookEditCell": cell,
        "NotebookEditProposal": {
            "type": "object",
            "required": ["id", "member", "conversation_id", "run_id", "artifact_id",
                         "version", "path", "created_at", "cells"],
            "properties": {"id": string, "member": string, "conversation_id": string,
                           "run_id": string, "artifact_id": string,
                           "version": {"type": "integer"}, "path": string,
                           "created_at": {"type": "string", "format": "date-time"},
                           "cells": {"type": "array", "items": ref("NotebookEditCell")}}},
    }
    return paths, components
