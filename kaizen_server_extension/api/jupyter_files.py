"""REST between the member's artifacts and the Jupyter contents tree (``jupyter_files.py``).

* ``POST jupyter-files`` ``{path}`` reads one file through the server's ContentsManager into
  an artifact the caller owns (a new version when the bytes changed) and answers it; the
  panel then attaches its id to a message (``attachments``), which pins that version and
  projects it read-only into run_code's working directory under the file's own name.
* ``POST artifacts/{id}/save-to-jupyter`` ``{path, version?, overwrite?}`` writes one version
  of an artifact the caller owns into the contents tree, never over an existing file unless
  ``overwrite`` is true.

Both need the Jupyter server's own permission for ``contents`` (its Authorizer) besides
Kaizen's, and follow the path rules of ``jupyter_files.py``.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
)
from tornado import web

from kaizen_server_extension.api.base import KaizenHandler, whole_number
from kaizen_server_extension.api.openapi_parts import body, error_answers
from kaizen_server_extension.api.params import ID, MAX_INT32
from kaizen_server_extension.jupyter_files import MAX_PATH_CHARS, PATH_PATTERN, JupyterFiles
from kaizen_server_extension.protocol.errors import Forbidden
from kaizen_server_extension.store.artifacts.repository import ArtifactStore
from kaizen_server_extension.store.jupyter_files import JupyterFileCopies

log = logging.getLogger("kaizen.api")

ARTIFACT_ID = ID
# Validated by jupyter_files.api_path (its own 400s); the document gives its pattern.
ContentsPath = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATH_CHARS),
                         WithJsonSchema({"type": "string", "minLength": 1,
                                         "maxLength": MAX_PATH_CHARS, "pattern": PATH_PATTERN})]


class ReadJupyterFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    path: ContentsPath = Field(description="API path relative to the Jupyter server's root, "
                                           "as the file browser shows it")


#: An artifact version in a body: as in a path (``params.MAX_INT32``), 2.0 taken as 2.
Version = Annotated[int, Field(ge=1, le=MAX_INT32), BeforeValidator(whole_number)]


class SaveToJupyter(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    path: ContentsPath = Field(description="Where to write, relative to the Jupyter server's "
                                           "root; the folder must exist")
    version: Version | None = Field(
        None, description="The version to write; the latest when omitted")
    overwrite: bool = Field(False, description="Replace an existing file (else 409 "
                                               "file_exists)")


class ContentsHandler(KaizenHandler):
    """A route that reads or writes the member's Jupyter files (here, and documents added
    from Jupyter in ``api/documents.py``)."""

    def _files(self, action: str, *, max_bytes: int | None = None,
               bound: str = "KAIZEN_JUPYTER_FILE_MAX_BYTES") -> JupyterFiles:
        # Kaizen's own permission was checked in prepare(); the Jupyter server's for its
        # contents is the operator's word on who may touch the files (e.g. read-only users).
        if not self.authorizer.is_authorized(self, self.current_user, action, "contents"):
            raise Forbidden("You are not allowed to use this Jupyter server's files.",
                            code="contents_forbidden")
        limit = self.kaizen.jupyter_file_max_bytes
        if max_bytes is not None and max_bytes < limit:
            limit = max_bytes
        else:
            bound = "KAIZEN_JUPYTER_FILE_MAX_BYTES"
        return JupyterFiles(self.contents_manager, max_bytes=limit, bound=bound)


class JupyterFilesHandler(ContentsHandler):
    @web.authenticated
    async def post(self) -> None:
        body = self.parse_body(ReadJupyterFile, limit=16 * 1024)
        file = await self._files("read").read(body.path)
        record, reused = await JupyterFileCopies(self.kaizen.store).keep(
            self.member, file.path, file.name, file.content, file.media_type)
        self.write_json({"path": file.path, "reused": reused, "artifact": record.public()},
                        status=200 if reused else 201)


class SaveToJupyterHandler(ContentsHandler):
    @web.authenticated
    async def post(self, artifact_id: str) -> None:
        body = self.parse_body(SaveToJupyter, limit=16 * 1024)
        files = self._files("write")
        record = await ArtifactStore(self.kaizen.store).resolve(
            self.member, artifact_id, version=body.version)
        if record.owner != self.member:
            raise Forbidden("Only the artifact's owner can save it into the Jupyter folder; "
                            "download it instead.", code="not_owner")
        saved = await files.write(body.path, record.content, overwrite=body.overwrite)
        log.info("artifact %s v%d saved into the Jupyter contents tree", record.artifact_id,
                 record.version)
        self.write_json({"path": saved.path, "name": saved.name, "size": saved.size,
                         "overwritten": saved.overwritten, "artifact_id": record.artifact_id,
                         "version": record.version}, status=201)


def jupyter_file_routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    return [
        (rf"{prefix}/jupyter-files", JupyterFilesHandler),
        (rf"{prefix}/artifacts/({ARTIFACT_ID})/save-to-jupyter", SaveToJupyterHandler),
    ]


_ERROR_TEXT = {
    400: "invalid_path (absolute, '.' or '..', empty segment), not_a_file, malformed JSON",
    401: "Not authenticated",
    403: "hidden_path, outside_root (a symlink out of the root), contents_forbidden, "
         "not_owner",
    404: "file_not_found, folder_not_found, artifact_not_found",
    409: "file_exists (no overwrite), not_a_file",
    413: "file_too_large (names KAIZEN_JUPYTER_FILE_MAX_BYTES)",
    422: "Schema violation"}


def jupyter_files_openapi() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) for ``api/openapi.py``."""

    def errors(*codes: int) -> dict[str, Any]:
        return error_answers(_ERROR_TEXT, *codes)

    read = {"type": "object", "required": ["path", "reused", "artifact"],
            "properties": {"path": {"type": "string"}, "reused": {"type": "boolean"},
                           "artifact": {"$ref": "#/components/schemas/Artifact"}}}
    saved = {"type": "object",
             "required": ["path", "name", "size", "overwritten", "artifact_id", "version"],
             "properties": {"path": {"type": "string"}, "name": {"type": "string"},
                            "size": {"type": "integer"}, "overwritten": {"type": "boolean"},
                            "artifact_id": {"type": "string"},
                            "version": {"type": "integer"}}}
    paths = {
        "/kaizen/api/jupyter-files": {"post": {
            "summary": "Read a file of the Jupyter contents tree (through the server's "
                       "ContentsManager) into an artifact the caller owns, ready to attach "
                       "to a message; unchanged bytes reuse the latest version",
            "operationId": "readJupyterFile", "requestBody": body("ReadJupyterFile"),
            "responses": {
                "201": {"description": "Stored as a new version", "content": {
                    "application/json": {"schema": read}}},
                "200": {"description": "Unchanged: the latest version", "content": {
                    "application/json": {"schema": read}}},
                **errors(400, 403, 404, 413, 422)}}},
        "/kaizen/api/artifacts/{artifact_id}/save-to-jupyter": {"post": {
            "summary": "Write one version of an artifact the caller owns into the Jupyter "
                       "contents tree; never over an existing file without overwrite",
            "operationId": "saveArtifactToJupyter",
            "parameters": [{"name": "artifact_id", "in": "path", "required": True,
                            "schema": {"type": "string"}}],
            "requestBody": body("SaveToJupyter"),
            "responses": {"201": {"description": "Written", "content": {
                "application/json": {"schema": saved}}},
                **errors(400, 403, 404, 409, 422)}}},
    }
    components = {
        "ReadJupyterFile": ReadJupyterFile.model_json_schema(),
        "SaveToJupyter": SaveToJupyter.model_json_schema(),
    }
    return paths, components
