"""REST for the member's own Library: collections and projects over their artifacts.

The two organizing writes are the member-side routes the agent's ``manage_library`` shares:
``POST collections/{id}/documents`` and ``POST projects/{id}/items`` call the same
:class:`LibraryStore` methods, so the ownership check, the re-resolution of the item under the
caller, the idempotent upsert and the audit row cannot drift between a click and an agent's
call (R-143, R-145). A foreign or missing destination and an item the caller cannot see are one
404 ``library_not_found`` (R-147); a kind the destination cannot hold keeps its own wording, 422
(R-148). Listings read through the same repository as ``inspect_library`` (R-141).

These routes exist only when ``KAIZEN_LIBRARY_ENABLED`` is on (``handlers.routes``); off, each
path answers as any path this server never had, and the OpenAPI document omits it (R-140).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints
from tornado import web

from kaizen_server_extension.api.base import KaizenHandler
from kaizen_server_extension.api.openapi_parts import (
    answer,
    error_answers,
    operation,
    path_param,
    ref,
)
from kaizen_server_extension.api.params import ID
from kaizen_server_extension.store.artifacts.repository import ArtifactStore
from kaizen_server_extension.store.library import LibraryStore

LIBRARY_ID = ID

#: A collection or project name as the member types it: trimmed, no control characters.
LibraryName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1,
                                               max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
ItemId = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class CreateLibraryContainer(BaseModel):
    """``POST collections`` / ``POST projects``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: LibraryName


class FileDocument(BaseModel):
    """``POST collections/{collection_id}/documents``: one of the member's documents."""

    model_config = ConfigDict(extra="forbid", strict=True)

    artifact_id: ItemId


class LinkProjectItem(BaseModel):
    """``POST projects/{project_id}/items``: a non-owning pointer to a Library item."""

    model_config = ConfigDict(extra="forbid", strict=True)

    item_kind: Literal["artifact", "collection", "project"]
    item_id: ItemId


class _LibraryHandler(KaizenHandler):
    @property
    def library(self) -> LibraryStore:
        store = self.kaizen.store
        return LibraryStore(store, ArtifactStore(store))


class CollectionsHandler(_LibraryHandler):
    @web.authenticated
    async def get(self) -> None:
        self.write_json(await self.library.inspect(self.member, "collections"))

    @web.authenticated
    async def post(self) -> None:
        body = self.parse_body(CreateLibraryContainer)
        created = await self.library.create_collection(self.member, body.name)
        self.write_json({"id": created, "name": body.name}, status=201)


class CollectionDocumentsHandler(_LibraryHandler):
    @web.authenticated
    async def get(self, collection_id: str) -> None:
        documents = await self.library.collection_items(self.member, collection_id)
        self.write_json({"collection_id": collection_id, "artifact_ids": documents})

    @web.authenticated
    async def post(self, collection_id: str) -> None:
        body = self.parse_body(FileDocument)
        changed = await self.library.file_into_collection(self.member, collection_id,
                                                          body.artifact_id)
        self.write_json({"collection_id": collection_id, "artifact_id": body.artifact_id,
                         "changed": changed})


class ProjectsHandler(_LibraryHandler):
    @web.authenticated
    async def get(self) -> None:
        self.write_json(await self.library.inspect(self.member, "projects"))

    @web.authenticated
    async def post(self) -> None:
        body = self.parse_body(CreateLibraryContainer)
        created = await self.library.create_project(self.member, body.name)
        self.write_json({"id": created, "name": body.name}, status=201)


class ProjectItemsHandler(_LibraryHandler):
    @web.authenticated
    async def get(self, project_id: str) -> None:
        items = await self.library.project_items(self.member, project_id)
        self.write_json({"project_id": project_id,
                         "items": [{"item_kind": kind, "item_id": ident}
                                   for kind, ident in items]})

    @web.authenticated
    async def post(self, project_id: str) -> None:
        body = self.parse_body(LinkProjectItem)
        changed = await self.library.link_into_project(self.member, project_id,
                                                       body.item_kind, body.item_id)
        self.write_json({"project_id": project_id, "item_kind": body.item_kind,
                         "item_id": body.item_id, "changed": changed})


def library_routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    return [
        (rf"{prefix}/collections", CollectionsHandler),
        (rf"{prefix}/collections/({LIBRARY_ID})/documents", CollectionDocumentsHandler),
        (rf"{prefix}/projects", ProjectsHandler),
        (rf"{prefix}/projects/({LIBRARY_ID})/items", ProjectItemsHandler),
    ]


#: What each error status means on these routes, in the OpenAPI document.
_ERROR_TEXT = {400: "Malformed request", 401: "Not authenticated",
               404: "The destination or the item does not exist or is not available to you",
               422: "Schema violation, or a kind the destination cannot hold"}


def _errors(*codes: int) -> dict[str, Any]:
    return error_answers(_ERROR_TEXT, *codes)


def library_openapi() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) for ``api/openapi.py``; only when the Library is on."""
    listing = {"type": "array", "items": ref("LibraryEntry")}
    collection, project = path_param("collection_id"), path_param("project_id")
    paths = {
        "/kaizen/api/collections": {
            "get": operation("The member's own collections, newest first (at most 100): id, name "
                             "and one short hint", "listCollections",
                             {**answer("Collections", listing), **_errors()}),
            "post": operation("Create a collection", "createCollection",
                              {**answer("Created", ref("LibraryContainer"), "201"),
                               **_errors(400, 422)}, body_schema="CreateLibraryContainer"),
        },
        "/kaizen/api/collections/{collection_id}/documents": {
            "get": operation("The documents filed in one of the member's collections",
                             "listCollectionDocuments",
                             {**answer("Documents", ref("CollectionDocuments")), **_errors(404)},
                             params=[collection]),
            "post": operation("File one of the member's documents (markdown or a native "
                              "file) into their collection; idempotent, audited as "
                              "member.collection.doc_added. The agent's manage_library "
                              "uses the same write",
                              "fileCollectionDocument",
                              {**answer("Filed (changed=false: it was already there)",
                                        ref("FiledDocument")), **_errors(400, 404, 422)},
                              params=[collection], body_schema="FileDocument"),
        },
        "/kaizen/api/projects": {
            "get": operation("The member's own projects, newest first (at most 100): id, name and "
                             "one short hint", "listProjects",
                             {**answer("Projects", listing), **_errors()}),
            "post": operation("Create a project", "createProject",
                              {**answer("Created", ref("LibraryContainer"), "201"),
                               **_errors(400, 422)}, body_schema="CreateLibraryContainer"),
        },
        "/kaizen/api/projects/{project_id}/items": {
            "get": operation("The items linked into one of the member's projects",
                             "listProjectItems",
                             {**answer("Items", ref("ProjectItems")), **_errors(404)},
                             params=[project]),
            "post": operation("Link an artifact, collection or project the member may open "
                              "into their project (a non-owning pointer; a composition cycle "
                              "is refused with library_cycle); idempotent. The agent's "
                              "manage_library uses the same write", "linkProjectItem",
                              {**answer("Linked (changed=false: it was already there)",
                                        ref("LinkedItem")), **_errors(400, 404, 422)},
                              params=[project], body_schema="LinkProjectItem"),
        },
    }
    string, flag = {"type": "string"}, {"type": "boolean"}
    item_kind = {"enum": ["artifact", "collection", "project"]}
    components: dict[str, Any] = {
        "LibraryEntry": {"type": "object", "required": ["id", "name", "hint"],
                         "properties": {"id": string, "name": string, "hint": string}},
        "LibraryContainer": {"type": "object", "required": ["id", "name"],
                             "properties": {"id": string, "name": string}},
        "CollectionDocuments": {"type": "object", "required": ["collection_id", "artifact_ids"],
                                "properties": {"collection_id": string,
                                               "artifact_ids": {"type": "array",
                                                                "items": string}}},
        "FiledDocument": {"type": "object",
                          "required": ["collection_id", "artifact_id", "changed"],
                          "properties": {"collection_id": string, "artifact_id": string,
                                         "changed": flag}},
        "ProjectItems": {"type": "object", "required": ["project_id", "items"],
                         "properties": {"project_id": string, "items": {
                             "type": "array", "items": {
                                 "type": "object", "required": ["item_kind", "item_id"],
                                 "properties": {"item_kind": item_kind, "item_id": string}}}}},
        "LinkedItem": {"type": "object",
                       "required": ["project_id", "item_kind", "item_id", "changed"],
                       "properties": {"project_id": string, "item_kind": item_kind,
                                      "item_id": string, "changed": flag}},
    }
    for model in (CreateLibraryContainer, FileDocument, LinkProjectItem):
        components[model.__name__] = model.model_json_schema()
    return paths, components
