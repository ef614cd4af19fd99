"""inspect_library / manage_library: the member's own Library, exposed to an agent.

Discovery is identity only, and an agent's knowledge scope narrows it to the member's items
inside the scope (R-002); organizing only files into a collection or links into a project,
through the same store methods a member's own click uses (``api/library.py``). Every id is a
selector, re-resolved under the caller inside the write. Both tools declare the Library
surface, so ``KAIZEN_LIBRARY_ENABLED=0`` withholds them from the registry (R-140).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from kaizen_server_extension.protocol.errors import MemberError
from kaizen_server_extension.settings import LIBRARY_SURFACE
from kaizen_server_extension.tools import (
    Capability,
    MemberSafeError,
    ResourceContext,
    ResourceVerdict,
    RoomClass,
    ToolContext,
    WriteCategory,
    hookimpl,
    tool,
)
from kaizen_server_extension.tools.hookspecs import ToolRegistrar

if TYPE_CHECKING:
    from kaizen_server_extension.store.artifacts import LibraryStore

Id = Annotated[str, Field(min_length=1, max_length=64)]


def _library(ctx: ToolContext | ResourceContext) -> LibraryStore:
    artifacts = ctx.services.artifacts
    if artifacts is None:
        raise MemberSafeError("The Library is not available on this server.",
                              code="library_unavailable")
    return artifacts.library


@tool(name="inspect_library", capability=Capability.READ,
      room_class=RoomClass.ACTOR_BOUND_READ, surface=LIBRARY_SURFACE, timeout_s=15)
async def inspect_library(ctx: ToolContext,
                          surface: Literal["artifacts", "collections", "projects"],
                          ) -> dict[str, Any]:
    """List one surface of the member's Library by identity only (id, name, short hint), to
    turn something the member named into the id another tool needs. Read content with
    read_artifact."""
    # An agent with a knowledge scope lists only the member's items inside it.
    items = await _library(ctx).inspect(ctx.member, surface,
                                        scope=ctx.services.knowledge_scope)
    return {"surface": surface, "items": items}


async def _owns_destination(ctx: ResourceContext,
                            arguments: Mapping[str, Any]) -> ResourceVerdict:
    """The destination collection or project is the member's own (R-226); read-only. The
    body re-resolves it, and the item, inside its write."""
    kind: Literal["collection", "project"] = (
        "collection" if arguments.get("action") == "file_into_collection" else "project")
    destination = str(arguments.get("destination_id", ""))
    if not await _library(ctx).owns_destination(ctx.member, kind, destination):
        return ResourceVerdict.deny(
            # The store's own sentence: which side refused is not distinguishable.
            "Nothing was changed: the destination or the item does not exist or is not "
            "available to you.",
            "library_not_found")
    return ResourceVerdict.allow()


@tool(name="manage_library", capability=Capability.WRITE,
      room_class=RoomClass.ACTOR_BOUND_WRITE, write_category=WriteCategory.MEMBER_STORE,
      surface=LIBRARY_SURFACE, timeout_s=15, authorize=_owns_destination)
async def manage_library(ctx: ToolContext,
                         action: Literal["file_into_collection", "link_into_project"],
                         destination_id: Id, item_id: Id,
                         item_kind: Literal["artifact", "collection", "project"] = "artifact",
                         ) -> dict[str, Any]:
    """File an existing artifact into one of the member's collections, or link an existing
    artifact, collection or project into one of their projects. It never creates, renames,
    deletes or shares anything."""
    library = _library(ctx)
    try:
        if action == "file_into_collection":
            if item_kind != "artifact":
                raise MemberSafeError("Only artifacts can be filed into a collection.",
                                      code="library_wrong_kind")
            added = await library.file_into_collection(ctx.member, destination_id, item_id)
        else:
            added = await library.link_into_project(ctx.member, destination_id, item_kind,
                                                    item_id)
    except MemberError as exc:
        raise MemberSafeError(exc.message, code=exc.code) from None
    return {"action": action, "destination_id": destination_id, "item_id": item_id,
            "changed": added,
            "summary": "Done." if added else "It was already there; nothing changed."}


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(inspect_library)
    register(manage_library)
