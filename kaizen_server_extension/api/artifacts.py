"""REST for artifacts (API.md): owner- or exact-room-authorized reads, downloads, rename, fork.

Everything another member may not see is 404, never 403 (R-126): the store answers NotFound
for a foreign root before anything reveals its type.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints
from tornado import web

from kaizen_server_extension.api.base import KaizenHandler
from kaizen_server_extension.api.params import ID, MAX_INT32, NUMBER, path_int, query_value
from kaizen_server_extension.protocol.errors import BadRequest
from kaizen_server_extension.store.artifacts.repository import (
    ArtifactStore,
    ArtifactVersionRecord,
    WriteContext,
)

ARTIFACT_ID = ID
VERSION = NUMBER
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]+")
# Extensions a download gets by kind, so a browser never sniffs its way into rendering it.
_EXTENSIONS = {"markdown": ".md", "html": ".html", "svg": ".svg", "code": ".txt",
               "mermaid": ".mmd", "react": ".jsx", "json": ".json", "graph": ".json"}


class RenameArtifact(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    title: Annotated[str, StringConstraints(min_length=1, max_length=300)]


class ForkArtifact(BaseModel):
    """A fork copies the exact stored bytes: a copy request carries no replacement content,
    title or envelope field (R-117), so the body, when present, is an empty object."""

    model_config = ConfigDict(extra="forbid", strict=True, title="ForkArtifact")


def _room(handler: KaizenHandler) -> str | None:
    room = query_value(handler, "conversation_id")
    if room is not None and not (len(room) <= 64 and re.fullmatch(ID, room)):
        raise BadRequest("conversation_id is not valid.", code="invalid_query")
    return room


def _version(raw: str) -> int:
    return path_int(raw, minimum=1, maximum=MAX_INT32, code="invalid_version",
                    message="A version is a whole number from 1.")


class _ArtifactHandler(KaizenHandler):
    @property
    def artifacts(self) -> ArtifactStore:
        return ArtifactStore(self.kaizen.store)

    async def _view(self, artifact_id: str, version: int | None) -> dict[str, Any]:
        record = await self.artifacts.resolve(self.member, artifact_id, version=version,
                                              room=_room(self))
        body = record.public(content=True)
        body["versions"] = await self.artifacts.versions(self.member, artifact_id)
        return body

    def _send(self, record: ArtifactVersionRecord) -> None:
        stem = _SAFE_NAME.sub("_", record.title).strip(" .") or "artifact"
        if record.governed:
            # The inert canonical JSON envelope, never a renderable page (R-123).
            mime, name = "application/json", f"{stem}.json"
        elif record.kind == "file":
            mime, name = record.mime, stem
        else:
            mime = "text/plain; charset=utf-8" if record.kind != "json" else "application/json"
            name = stem if stem.endswith(_EXTENSIONS[record.kind]) \
                else stem + _EXTENSIONS[record.kind]
        self.set_status(200)
        self.set_header("Content-Disposition", f'attachment; filename="{name}"')
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Content-Security-Policy", "sandbox; default-src 'none'")
        self.set_header("ETag", f'"{record.digest}"')
        self.finish(record.content, set_content_type=mime)


class ArtifactsHandler(_ArtifactHandler):
    @web.authenticated
    async def get(self) -> None:
        records = await self.artifacts.list_for(self.member, room=_room(self))
        self.write_json([r.public() for r in records])


class ArtifactHandler(_ArtifactHandler):
    @web.authenticated
    async def get(self, artifact_id: str) -> None:
        self.write_json(await self._view(artifact_id, None))

    @web.authenticated
    async def patch(self, artifact_id: str) -> None:
        body = self.parse_body(RenameArtifact)
        record = await self.artifacts.rename(self.member, artifact_id, body.title)
        self.write_json(record.public())  # the title as stored, not as asked


class ArtifactForkHandler(_ArtifactHandler):
    @web.authenticated
    async def post(self, artifact_id: str) -> None:
        if self.request.body.strip():
            self.parse_body(ForkArtifact)
        record = await self.artifacts.fork(self.member, artifact_id, where=WriteContext(),
                                           room=_room(self))
        self.write_json(record.public(), status=201)


class ArtifactVersionHandler(_ArtifactHandler):
    @web.authenticated
    async def get(self, artifact_id: str, version: str) -> None:
        self.write_json(await self._view(artifact_id, _version(version)))


class ArtifactDownloadHandler(_ArtifactHandler):
    @web.authenticated
    async def get(self, artifact_id: str) -> None:
        self._send(await self.artifacts.resolve(self.member, artifact_id, room=_room(self)))


class ArtifactVersionDownloadHandler(_ArtifactHandler):
    @web.authenticated
    async def get(self, artifact_id: str, version: str) -> None:
        self._send(await self.artifacts.resolve(self.member, artifact_id,
                                                version=_version(version), room=_room(self)))


def artifact_routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    base = rf"{prefix}/artifacts"
    return [
        (base, ArtifactsHandler),
        (rf"{base}/({ARTIFACT_ID})", ArtifactHandler),
        (rf"{base}/({ARTIFACT_ID})/download", ArtifactDownloadHandler),
        (rf"{base}/({ARTIFACT_ID})/fork", ArtifactForkHandler),
        (rf"{base}/({ARTIFACT_ID})/versions/({VERSION})", ArtifactVersionHandler),
        (rf"{base}/({ARTIFACT_ID})/versions/({VERSION})/download",
         ArtifactVersionDownloadHandler),
    ]


def _errors(ref: Any, *codes: int) -> dict[str, Any]:
    text = {400: "Malformed request", 401: "Not authenticated",
            404: "Not found or not visible to you",
            422: "Schema or validation failure (unstorable_text: a value holds U+0000 or an "
                 "unpaired surrogate)"}
    return {str(c): {"description": text[c], "content": {"application/json": {"schema": ref}}}
            for c in (401, *codes)}


def artifact_openapi() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) for ``api/openapi.py``."""
    error = {"$ref": "#/components/schemas/Error"}
    artifact = {"$ref": "#/components/schemas/Artifact"}
    room = {"name": "conversation_id", "in": "query", "required": False,
            "description": "A shared room the caller participates in: read the version "
                           "bound to exactly that room",
            "schema": {"type": "string", "maxLength": 64, "pattern": f"^{ID}$"}}
    artifact_id = {"name": "artifact_id", "in": "path", "required": True,
                   "schema": {"type": "string"}}
    version = {"name": "version", "in": "path", "required": True,
               "schema": {"type": "integer", "minimum": 1}}
    view = {"allOf": [artifact, {"type": "object", "properties": {
        "content": {"type": "string"},
        "versions": {"type": "array", "items": {"type": "integer"}}}}]}
    # The bytes go with the artifact's own media type (text/plain, application/json, a stored
    # file's type such as text/csv or image/png): any type, always as an attachment.
    raw = {"schema": {"type": "string", "format": "binary"}}
    binary = {"200": {"description": "The exact stored bytes, as an attachment, in the "
                                     "artifact's media type",
                      "content": {"application/octet-stream": raw, "*/*": raw}}}

    def op(summary: str, op_id: str, responses: dict[str, Any],
           params: list[dict[str, Any]], body: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"summary": summary, "operationId": op_id,
                               "parameters": params, "responses": responses}
        if body:
            out["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{body}"}}}}
        return out

    fork_op = op("Copy the visible version into a new artifact the member owns: the exact "
                 "stored bytes, language and attestation; a governed artifact stays governed "
                 "and locked (R-117, R-118); the body, if any, must be empty",
                 "forkArtifact",
                 {"201": {"description": "The new artifact", "content": {
                     "application/json": {"schema": artifact}}},
                  "409": {"description": "The member already has a copy of that exact "
                                         "version (R-164); the message names it",
                          "content": {"application/json": {"schema": error}}},
                  **_errors(error, 400, 404, 422)},
                 [artifact_id, room])
    fork_op["requestBody"] = {"required": False, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/ForkArtifact"}}}}
    paths = {
        "/kaizen/api/artifacts": {"get": op(
            "The member's own artifacts, or those bound to one room they participate in",
            "listArtifacts",
            {"200": {"description": "Artifacts (latest visible version each, no content)",
                     "content": {"application/json": {"schema": {
                         "type": "array", "items": artifact}}}}, **_errors(error, 400, 404)},
            [room])},
        "/kaizen/api/artifacts/{artifact_id}": {
            "get": op("The latest version the member may see, with its content",
                      "getArtifact",
                      {"200": {"description": "Artifact", "content": {
                          "application/json": {"schema": view}}}, **_errors(error, 400, 404)},
                      [artifact_id, room]),
            "patch": op("Rename an artifact the member owns (governed artifacts refuse with "
                        "validation_failed). The title is the artifact's: every read, listing "
                        "and download shows it from now on (Content-Disposition too); no "
                        "version is appended, and each version keeps the title it was "
                        "created with (version_title). A title holding U+0000 or an "
                        "unpaired surrogate is refused: 422 unstorable_text",
                        "renameArtifact",
                        {"200": {"description": "Renamed: the artifact as stored (its new "
                                                "title read back), at its latest version",
                                 "content": {
                            "application/json": {"schema": artifact}}},
                         **_errors(error, 400, 404, 422)},
                        [artifact_id], body="RenameArtifact"),
        },
        "/kaizen/api/artifacts/{artifact_id}/download": {"get": op(
            "Download the latest visible version", "downloadArtifact",
            {**binary, **_errors(error, 400, 404)}, [artifact_id, room])},
        "/kaizen/api/artifacts/{artifact_id}/fork": {"post": fork_op},
        "/kaizen/api/artifacts/{artifact_id}/versions/{version}": {"get": op(
            "One immutable version", "getArtifactVersion",
            {"200": {"description": "Artifact version", "content": {
                "application/json": {"schema": view}}}, **_errors(error, 400, 404)},
            [artifact_id, version, room])},
        "/kaizen/api/artifacts/{artifact_id}/versions/{version}/download": {"get": op(
            "Download one immutable version", "downloadArtifactVersion",
            {**binary, **_errors(error, 400, 404)}, [artifact_id, version, room])},
    }
    string, nullable = {"type": "string"}, {"type": ["string", "null"]}
    components = {
        "Artifact": {"type": "object",
                     "required": ["id", "owner", "version", "latest_version", "kind", "title",
                                  "digest", "size"],
                     "properties": {"id": string, "owner": string,
                                    "version": {"type": "integer"},
                                    "latest_version": {"type": "integer"},
                                    "kind": string, "language": nullable,
                                    "title": {"type": "string", "description": (
                                        "The artifact's current title: it lives on the "
                                        "artifact, so a rename (PATCH) shows in every read, "
                                        "listing and download, whatever version is read.")},
                                    "version_title": {"type": "string", "description": (
                                        "The title this version was created with. Versions "
                                        "are immutable and keep their own history: a "
                                        "rename appends no version and changes no "
                                        "version_title; the next version written is "
                                        "created with the current title.")},
                                    "mime": string, "digest": string,
                                    "size": {"type": "integer"}, "author": string,
                                    "conversation_id": nullable, "room_id": nullable,
                                    "governed": {"type": "boolean"},
                                    "attested": {
                                        "type": ["object", "null"],
                                        "description": (
                                            "What a governed version's server attestation "
                                            "asserts, null for an ordinary version. It "
                                            "asserts only that the named "
                                            "administrator-approved producer returned output "
                                            "that passed the envelope contract; it does not "
                                            "assert that the envelope's provenance or "
                                            "security markings are true (docs/mcp.md)."),
                                        "required": ["producer", "asserts"],
                                        "properties": {
                                            "producer": {
                                                "type": ["string", "null"],
                                                "description": (
                                                    "The producer's tool name "
                                                    "(mcp__<server>__<tool>); null when "
                                                    "none was recorded.")},
                                            "asserts": {
                                                "type": "string",
                                                "enum": ["validated_output_of_approved_"
                                                         "producer"]}}},
                                    "derived_from": nullable,
                                    "created_at": {"type": "string", "format": "date-time"}}},
        "RenameArtifact": RenameArtifact.model_json_schema(),
        "ForkArtifact": ForkArtifact.model_json_schema(),
    }
    return paths, components
