"""REST for the member's documents (docs/retrieval.md): upload, versions, shares, search.

The store decides access in every query (store/documents.py); whatever another member may not
read or manage is the same 404 as a document that never existed.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from tornado import web

from kaizen_server_extension.api.base import KaizenHandler
from kaizen_server_extension.api.jupyter_files import ContentsHandler, ContentsPath
from kaizen_server_extension.api.openapi_parts import (
    answer,
    error_answers,
    operation,
    path_param,
    ref,
)
from kaizen_server_extension.api.params import (
    ID,
    MAX_INT32,
    NUMBER,
    path_int,
    query_int,
    query_value,
)
from kaizen_server_extension.document_text import (
    MAX_DOCUMENT_BYTES,
    media_type_for,
    query_terms,
)
from kaizen_server_extension.jupyter_files import api_path
from kaizen_server_extension.protocol.errors import BadRequest
from kaizen_server_extension.store.documents import MAX_HITS, DocumentStore, SourceOutcome

DOCUMENT_ID = ID
#: A file name as uploaded: one path segment, a suffix naming its type.
FileName = Annotated[str, StringConstraints(min_length=1, max_length=300,
                                            pattern=r"^[^/\\\x00-\x1f]+\.[A-Za-z0-9]{1,10}$")]
Title = Annotated[str, StringConstraints(min_length=1, max_length=300,
                                         pattern=r"^[^\x00-\x1f]+$")]
#: Padded base64 of 1 to MAX_DOCUMENT_BYTES bytes.
Content = Annotated[str, StringConstraints(
    min_length=4, max_length=(MAX_DOCUMENT_BYTES + 2) // 3 * 4,
    pattern=r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$")]
MAX_QUERY_CHARS = 500


class UploadDocument(BaseModel):
    """``POST documents``: a new document, or with ``documents/{id}/versions`` a new version."""

    model_config = ConfigDict(extra="forbid", strict=True)

    filename: FileName
    content_base64: Content
    title: Title | None = None


class UploadVersion(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    filename: FileName
    content_base64: Content


class AddJupyterDocument(BaseModel):
    """``POST jupyter-documents``: a file of the member's Jupyter tree into their corpus."""

    model_config = ConfigDict(extra="forbid", strict=True)

    path: ContentsPath = Field(description="API path relative to the Jupyter server's root, "
                                           "as the file browser shows it")
    title: Title | None = Field(None, description="The title of the document the first add "
                                                  "of this path creates (else the file's "
                                                  "name); a later add keeps it")


def _content(raw: str) -> bytes:
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("content_base64 is not valid base64.", code="invalid_base64") from None


class _DocumentHandler(KaizenHandler):
    @property
    def documents(self) -> DocumentStore:
        return DocumentStore(self.kaizen.store)

    async def _view(self, document_id: str) -> dict[str, Any]:
        record = await self.documents.get(self.member, document_id)
        body = record.public(self.member)
        body["versions"] = await self.documents.versions(self.member, document_id)
        # Where it is shared: the owner's to know and manage.
        body["shared_in"] = (await self.documents.shares(self.member, document_id)
                             if record.owner == self.member else [])
        return body


class DocumentsHandler(_DocumentHandler):
    @web.authenticated
    async def get(self) -> None:
        self.write_json([r.public(self.member)
                         for r in await self.documents.list_for(self.member)])

    @web.authenticated
    async def post(self) -> None:
        body = self.parse_body(UploadDocument, limit=MAX_DOCUMENT_BYTES * 2)
        record = await self.documents.upload(self.member, body.filename,
                                             _content(body.content_base64), body.title)
        self.set_header("Location", f"{self.request.path}/{record.id}")
        self.write_json(record.public(self.member), status=201)


class JupyterDocumentsHandler(_DocumentHandler, ContentsHandler):
    """The member's Jupyter file, read by the server through its ContentsManager as the
    member (the path rules of ``jupyter_files.py``, the Jupyter server's own permission for
    ``contents``), becomes a document, or the next version of the one that path made."""

    @web.authenticated
    async def post(self) -> None:
        body = self.parse_body(AddJupyterDocument, limit=16 * 1024)
        files = self._files("read", max_bytes=MAX_DOCUMENT_BYTES,
                            bound="a document's limit")
        # The type is the name's, as for an upload: refused before a byte is read (a path
        # outside the rules is that first).
        media_type_for(posixpath.basename(api_path(body.path)))
        file = await files.read(body.path)
        record, outcome = await self.documents.add_from_path(
            self.member, file.path, file.name, file.content, body.title)
        created = outcome is not SourceOutcome.UNCHANGED
        if outcome is SourceOutcome.CREATED:
            # This route's sibling: .../jupyter-documents -> .../documents/{id}.
            base = self.request.path.rsplit("/", 1)[0]
            self.set_header("Location", f"{base}/documents/{record.id}")
        self.write_json({"path": file.path, "outcome": outcome.value,
                         "document": record.public(self.member)},
                        status=201 if created else 200)


class DocumentHandler(_DocumentHandler):
    @web.authenticated
    async def get(self, document_id: str) -> None:
        self.write_json(await self._view(document_id))

    @web.authenticated
    async def delete(self, document_id: str) -> None:
        await self.documents.delete(self.member, document_id)
        self.set_status(204)
        self.finish()


class DocumentVersionsHandler(_DocumentHandler):
    @web.authenticated
    async def post(self, document_id: str) -> None:
        body = self.parse_body(UploadVersion, limit=MAX_DOCUMENT_BYTES * 2)
        record = await self.documents.add_version(self.member, document_id, body.filename,
                                                  _content(body.content_base64))
        self.write_json(record.public(self.member), status=201)


class DocumentVersionHandler(_DocumentHandler):
    @web.authenticated
    async def get(self, document_id: str, version: str) -> None:
        number = path_int(version, minimum=1, maximum=MAX_INT32, code="invalid_version",
                          message="A version is a whole number from 1.")
        record, found, body = await self.documents.text_of(self.member, document_id, number)
        self.write_json({"document_id": record.id, "version": found, "title": record.title,
                         "text": body})


class DocumentPassagesHandler(_DocumentHandler):
    """What a citation link opens: one exact version's passages in order, each with its
    chunk id and locator, so the panel can show the cited one in its place."""

    @web.authenticated
    async def get(self, document_id: str, version: str) -> None:
        number = path_int(version, minimum=1, maximum=MAX_INT32, code="invalid_version",
                          message="A version is a whole number from 1.")
        record, passages = await self.documents.version_passages(self.member, document_id,
                                                                 number)
        self.write_json({
            "document_id": record.id, "version": number, "title": record.title,
            "current_version": record.current_version,
            "source_path": record.public(self.member)["source_path"],
            "passages": [{"chunk_id": p.chunk_id, "ordinal": p.ordinal, "locator": p.locator,
                          "text": p.body} for p in passages]})


class DocumentShareHandler(_DocumentHandler):
    @web.authenticated
    async def put(self, document_id: str, conversation_id: str) -> None:
        changed = await self.documents.share(self.member, document_id, conversation_id)
        self.write_json({"document_id": document_id, "conversation_id": conversation_id,
                         "shared": True, "changed": changed})

    @web.authenticated
    async def delete(self, document_id: str, conversation_id: str) -> None:
        changed = await self.documents.unshare(self.member, document_id, conversation_id)
        self.write_json({"document_id": document_id, "conversation_id": conversation_id,
                         "shared": False, "changed": changed})


class DocumentSearchHandler(_DocumentHandler):
    @web.authenticated
    async def get(self) -> None:
        query = query_value(self, "q")
        if query is None or not query.strip() or len(query) > MAX_QUERY_CHARS:
            raise BadRequest(f"q is the search text, 1 to {MAX_QUERY_CHARS} characters.",
                             code="invalid_query")
        limit = query_int(query_value(self, "limit"), "limit", 8, minimum=1, maximum=MAX_HITS)
        if not query_terms(query):  # only punctuation or symbols: nothing can match
            self.write_json({"query": query, "searched_documents": 0, "hits": []})
            return
        result = await self.documents.search(self.member, query, limit=limit)
        self.write_json({"query": query, "searched_documents": result.searched,
                         "hits": [h.public() for h in result.hits]})


def document_routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    base = rf"{prefix}/documents"
    return [
        (rf"{prefix}/document-search", DocumentSearchHandler),
        (base, DocumentsHandler),
        (rf"{prefix}/jupyter-documents", JupyterDocumentsHandler),
        (rf"{base}/({DOCUMENT_ID})", DocumentHandler),
        (rf"{base}/({DOCUMENT_ID})/versions", DocumentVersionsHandler),
        (rf"{base}/({DOCUMENT_ID})/versions/({NUMBER})", DocumentVersionHandler),
        (rf"{base}/({DOCUMENT_ID})/versions/({NUMBER})/passages", DocumentPassagesHandler),
        (rf"{base}/({DOCUMENT_ID})/shares/({ID})", DocumentShareHandler),
    ]


_ERROR_TEXT = {
    400: "Malformed request", 401: "Not authenticated",
    403: "hidden_path, outside_root (a symlink out of the root), contents_forbidden (the "
         "Jupyter server's own permission)",
    404: "The document (or room, or Jupyter file: file_not_found) does not exist or is not "
         "available to you",
    409: "file_unreadable (the Jupyter server returned the file in a form Kaizen cannot "
         "read), document_busy (try again)",
    413: "The request body (or the Jupyter file: file_too_large) is too large",
    422: "Schema violation, or a file that cannot be read as a document"}


def documents_openapi() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) for ``api/openapi.py``."""

    def errors(*codes: int) -> dict[str, Any]:
        return error_answers(_ERROR_TEXT, *codes)

    def op(summary: str, op_id: str, responses: dict[str, Any], *,
           params: list[dict[str, Any]] | None = None, body: str | None = None
           ) -> dict[str, Any]:
        return operation(summary, op_id, responses, params=params, body_schema=body)

    document, room = path_param("document_id"), path_param("conversation_id")
    version = path_param("version")
    paths = {
        "/kaizen/api/documents": {
            "get": op("The documents the member may read (their own, and those shared into a "
                      "room they are in), newest first, at most 100", "listDocuments",
                      {**answer("Documents", {"type": "array", "items": ref("Document")}),
                       **errors()}),
            "post": op("Upload a document (text, Markdown, .ipynb, PDF or DOCX, by the file "
                       "name's suffix); its text is chunked and indexed for search",
                       "uploadDocument",
                       {**answer("Created", ref("Document"), "201"),
                        **errors(400, 413, 422)}, body="UploadDocument"),
        },
        "/kaizen/api/documents/{document_id}": {
            "get": op("One readable document: its current version, its versions and (for "
                      "the owner) the rooms it is shared into", "getDocument",
                      {**answer("Document", ref("DocumentView")), **errors(404)},
                      params=[document]),
            "delete": op("Delete a document (owner only) with every version, chunk and "
                         "share; access ends at once", "deleteDocument",
                         {"204": {"description": "Deleted"}, **errors(404)},
                         params=[document]),
        },
        "/kaizen/api/documents/{document_id}/versions": {
            "post": op("Upload a new current version (owner only); search then finds only "
                       "its text", "addDocumentVersion",
                       {**answer("Created", ref("Document"), "201"),
                        **errors(400, 404, 413, 422)},
                       params=[document], body="UploadVersion"),
        },
        "/kaizen/api/documents/{document_id}/versions/{version}": {
            "get": op("The text extracted from one exact version", "getDocumentVersion",
                      {**answer("Text", ref("DocumentText")), **errors(400, 404)},
                      params=[document, version]),
        },
        "/kaizen/api/documents/{document_id}/shares/{conversation_id}": {
            "put": op("Share the document into a room the owner is a participant of; its "
                      "participants may then read and search it (idempotent)",
                      "shareDocument",
                      {**answer("Shared (changed=false: it already was)", ref("DocumentShare")),
                       **errors(404)}, params=[document, room]),
            "delete": op("Stop sharing the document into the room (owner only); access "
                         "through the share ends at once", "unshareDocument",
                         {**answer("Unshared (changed=false: it was not shared there)",
                                   ref("DocumentShare")), **errors(404)},
                         params=[document, room]),
        },
        "/kaizen/api/jupyter-documents": {
            "post": op("Add a file of the member's Jupyter contents tree (text, Markdown, "
                       ".ipynb, PDF or DOCX) to their documents: the server reads it through "
                       "its ContentsManager as the member. The first add of a path creates a "
                       "document (201, outcome created); adding it again with other bytes "
                       "makes its next version (201, new_version); unchanged bytes add "
                       "nothing (200, unchanged). Bad paths (invalid_path, not_a_file, "
                       "hidden_path, outside_root, file_not_found, file_too_large) and "
                       "unsupported types write nothing", "addJupyterDocument",
                       {**answer("Created, or a new version", ref("JupyterDocument"), "201"),
                        **answer("Unchanged: the current version", ref("JupyterDocument")),
                        **errors(400, 403, 404, 409, 413, 422)}, body="AddJupyterDocument"),
        },
        "/kaizen/api/documents/{document_id}/versions/{version}/passages": {
            "get": op("The passages of one exact version in order, each with its chunk id "
                      "and locator: what a citation link opens", "getDocumentPassages",
                      {**answer("Passages", ref("DocumentPassages")), **errors(400, 404)},
                      params=[document, version]),
        },
        "/kaizen/api/document-search": {
            "get": op("Full-text search over the current versions of the documents the member "
                      "may read; passages with chunk ids and citations", "searchDocuments",
                      {**answer("Hits", ref("DocumentSearch")), **errors(400)},
                      params=[{"name": "q", "in": "query", "required": True,
                               "schema": {"type": "string", "minLength": 1,
                                          "maxLength": MAX_QUERY_CHARS}},
                              {"name": "limit", "in": "query", "required": False,
                               "schema": {"type": "integer", "minimum": 1,
                                          "maximum": MAX_HITS}}]),
        },
    }
    string, integer, flag = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
    document_fields = {"id": string, "owner": string, "title": string, "version": integer,
                       "filename": string, "media_type": string, "size": integer,
                       "sha256": string, "chunks": integer, "created_at": string,
                       "updated_at": string,
                       # The owner's Jupyter path it was added from; null for others.
                       "source_path": {"type": ["string", "null"]}}
    version_entry = {"type": "object",
                     "required": ["version", "filename", "size", "sha256", "created_at"],
                     "properties": {"version": integer, "filename": string, "size": integer,
                                    "sha256": string, "created_at": string}}
    hit = {"type": "object",
           "required": ["chunk_id", "document_id", "version", "title", "locator", "excerpt",
                        "score", "citation"],
           "properties": {"chunk_id": string, "document_id": string, "version": integer,
                          "title": string, "locator": string, "excerpt": string,
                          "score": {"type": "number"}, "citation": string}}
    components: dict[str, Any] = {
        "Document": {"type": "object", "required": list(document_fields),
                     "properties": document_fields},
        "DocumentView": {"type": "object",
                         "required": [*document_fields, "versions", "shared_in"],
                         "properties": {**document_fields,
                                        "versions": {"type": "array", "items": version_entry},
                                        "shared_in": {"type": "array", "items": string}}},
        "DocumentText": {"type": "object",
                         "required": ["document_id", "version", "title", "text"],
                         "properties": {"document_id": string, "version": integer,
                                        "title": string, "text": string}},
        "JupyterDocument": {"type": "object", "required": ["path", "outcome", "document"],
                            "properties": {"path": string,
                                           "outcome": {"type": "string",
                                                       "enum": [o.value
                                                                for o in SourceOutcome]},
                                           "document": ref("Document")}},
        "DocumentPassages": {
            "type": "object",
            "required": ["document_id", "version", "title", "current_version", "source_path",
                         "passages"],
            "properties": {
                "document_id": string, "version": integer, "title": string,
                "current_version": integer, "source_path": {"type": ["string", "null"]},
                "passages": {"type": "array", "items": {
                    "type": "object", "required": ["chunk_id", "ordinal", "locator", "text"],
                    "properties": {"chunk_id": string, "ordinal": integer, "locator": string,
                                   "text": string}}}}},
        "DocumentShare": {"type": "object",
                          "required": ["document_id", "conversation_id", "shared", "changed"],
                          "properties": {"document_id": string, "conversation_id": string,
                                         "shared": flag, "changed": flag}},
        "DocumentSearch": {"type": "object",
                           "required": ["query", "searched_documents", "hits"],
                           "properties": {"query": string, "searched_documents": integer,
                                          "hits": {"type": "array", "items": hit}}},
    }
    for model in (UploadDocument, UploadVersion, AddJupyterDocument):
        components[model.__name__] = model.model_json_schema()
    return paths, components
