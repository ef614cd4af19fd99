"""read_notebook / inspect_notebook_kernel / propose_notebook_edit: the member's notebook as
context, its kernel with their permission, and edits they review cell by cell.

Every tool acts only on a notebook *attached to the message this run answers*: the turn's
admitted resources (``ctx.services.resources``, pinned at acceptance and bound into the
bundle's resource digest). A path or id in the arguments only chooses among those; it grants
nothing (R-456-style: the model cannot add a notebook). The pinned bytes are fetched as the
member may read them now and checked against the pinned digest, as run_code does.

* ``read_notebook`` reads the pinned version: cells by index range, bounded.
* ``inspect_notebook_kernel`` runs the server's fixed probe in the notebook's live kernel,
  refused unless the member allowed it for this conversation in the panel, the kernel runs
  and is idle (``notebooks/service.py``, ``notebooks/probe.py``).
* ``propose_notebook_edit`` changes nothing in the notebook: it records a proposal (insert,
  replace or delete cells by id) that the member accepts or rejects per cell in the panel,
  where JupyterLab applies accepted cells to the open notebook. A notebook whose cells
  changed since the pinned version was read is refused as stale, and nothing is recorded.

The services (``notebooks``, ``artifacts``, ``resources``) are reached here only, through
``_services``, so they can move onto typed services in one place.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from kaizen_server_extension.notebooks.document import (
    CELL_ID,
    CELL_TYPES,
    MAX_CELL_SOURCE,
    NOTEBOOK_MEDIA_TYPE,
    NotebookDocument,
    NotebookFormatError,
    source_digest,
)
from kaizen_server_extension.notebooks.probe import fit
from kaizen_server_extension.notebooks.service import (
    NotebookRefused,
    NotebookService,
)
from kaizen_server_extension.notebooks.store import MAX_EDIT_CELLS, ProposedCell
from kaizen_server_extension.protocol.errors import NotFound, UnstorableText
from kaizen_server_extension.resources import AdmittedResources, SharedResource
from kaizen_server_extension.tools import (
    Capability,
    MemberSafeError,
    RoomClass,
    ToolContext,
    WriteCategory,
    hookimpl,
    tool,
)
from kaizen_server_extension.tools.hookspecs import ToolRegistrar

#: JSON characters one read_notebook result may carry (inside the pipeline's own bound).
READ_BUDGET = 14_000
MAX_READ_CELLS = 50
#: Characters of one proposed cell's new source.
MAX_PROPOSED_SOURCE = 16_000
NOTEBOOK_SURFACE = "notebook"

_SELECTOR = {"type": "string", "minLength": 1, "maxLength": 1024,
             "description": "Which attached notebook: its path or attachment id as shown in "
                            "the message. Optional when one notebook is attached."}


@dataclass(frozen=True, slots=True)
class PinnedNotebook:
    resource: SharedResource
    path: str
    doc: NotebookDocument

    def identity(self) -> dict[str, Any]:
        return {"notebook": self.path, "attachment": self.resource.reference_id,
                "version": self.resource.version}


def _services(ctx: ToolContext) -> tuple[Any, AdmittedResources | None, NotebookService | None]:
    """The artifact store, the turn's admitted files, the notebook service (one place)."""
    artifacts = ctx.services.artifacts
    return (artifacts.store if artifacts is not None else None,
            ctx.services.resources or None, ctx.services.notebooks)


async def pinned_notebook(ctx: ToolContext, selector: str | None) -> PinnedNotebook:
    """The attached notebook ``selector`` names (or the only one), at its pinned version."""
    artifacts, admitted, _ = _services(ctx)
    notebooks = [r for r in (admitted.resources if admitted else ())
                 if r.media_type == NOTEBOOK_MEDIA_TYPE]
    if not notebooks or artifacts is None:
        raise MemberSafeError(
            "No notebook is attached to the message you are answering. Ask the member to "
            "use \"Ask Kaizen about this notebook\" in JupyterLab (it attaches the notebook "
            "to their message).", code="notebook_not_attached")
    member, room = ctx.member, ctx.bundle.conversation_id
    pinned: list[PinnedNotebook] = []
    for resource in notebooks:
        try:
            record = await artifacts.resolve(member, resource.reference_id,
                                             version=resource.version, room=room)
        except NotFound:
            raise MemberSafeError("An attached notebook is no longer available to you.",
                                  code="resource_unavailable") from None
        if hashlib.sha256(record.content).hexdigest() != resource.sha256:
            raise MemberSafeError("An attached notebook does not match what was attached.",
                                  code="resource_manifest_mismatch")
        path = record.source_name or resource.filename
        if selector is None or selector in (path, resource.reference_id, resource.filename):
            try:
                doc = NotebookDocument.parse(record.content)
            except NotebookFormatError as exc:
                raise MemberSafeError(str(exc), code="not_a_notebook") from None
            pinned.append(PinnedNotebook(resource, path, doc))
    if not pinned:
        raise MemberSafeError("That notebook is not attached to this message; the attached "
                              "notebooks are: " + ", ".join(json.dumps(r.filename)
                                                            for r in notebooks) + ".",
                              code="notebook_not_attached")
    if len(pinned) > 1:
        raise MemberSafeError("Several notebooks are attached; name one with 'notebook': "
                              + ", ".join(json.dumps(p.path) for p in pinned) + ".",
                              code="notebook_ambiguous")
    return pinned[0]


# --- read_notebook ------------------------------------------------------------------------

READ_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "notebook": _SELECTOR,
        "start": {"type": "integer", "minimum": 0, "default": 0,
                  "description": "Index of the first cell (0-based)."},
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_READ_CELLS, "default": 20,
                  "description": "At most this many cells."},
    },
    "additionalProperties": False,
}


@tool(name="read_notebook", capability=Capability.READ, room_class=RoomClass.ACTOR_BOUND_READ,
      surface=NOTEBOOK_SURFACE, timeout_s=15, input_schema=READ_SCHEMA,
      description=(
          "Read cells of the notebook the member attached to this message, as it was when "
          "attached: each cell's index, id, type, full source and its outputs as text "
          "(images and rich outputs are described, not shown). Use start/limit to page; "
          "next_start says where to go on. Cell ids are what propose_notebook_edit takes."))
async def read_notebook(ctx: ToolContext, **arguments: Any) -> dict[str, Any]:
    pinned = await pinned_notebook(ctx, arguments.get("notebook"))
    cells = pinned.doc.cells
    start = int(arguments.get("start", 0))
    limit = int(arguments.get("limit", 20))
    if start > len(cells):
        raise MemberSafeError(f"The notebook has {len(cells)} cells; start must be at most "
                              f"{len(cells)}.", code="invalid_range")
    views: list[dict[str, Any]] = []
    used = 400  # the envelope
    for cell in cells[start:start + limit]:
        view = cell.view()
        weight = len(json.dumps(view, ensure_ascii=False))
        if views and used + weight > READ_BUDGET:
            break
        if not views and weight > READ_BUDGET:
            view = cell.view(source_chars=READ_BUDGET // 2, output_chars=300)
            weight = len(json.dumps(view, ensure_ascii=False))
        views.append(view)
        used += weight
    end = start + len(views)
    return {**pinned.identity(), "language": pinned.doc.language or None,
            "total_cells": len(cells), "start": start, "cells": views,
            "next_start": end if end < len(cells) else None}


# --- inspect_notebook_kernel -----------------------------------------------------------------

INSPECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "notebook": _SELECTOR,
        "names": {"type": "array", "maxItems": 50, "uniqueItems": True,
                  "items": {"type": "string", "minLength": 1, "maxLength": 200},
                  "description": "Only these variables (default: all public ones)."},
    },
    "additionalProperties": False,
}


@tool(name="inspect_notebook_kernel", capability=Capability.READ,
      room_class=RoomClass.ACTOR_PRIVATE_READ, surface=NOTEBOOK_SURFACE, timeout_s=20,
      explicit_grant_only=True, input_schema=INSPECT_SCHEMA,
      description=(
          "List the variables in the live kernel of the notebook the member attached to this "
          "message: names, types, lengths and shapes; for DataFrames the columns, dtypes and "
          "first rows. Runs a fixed inspection written by Kaizen (never your code) and changes "
          "nothing in the kernel. Works only after the member allowed kernel access for this "
          "conversation in the Kaizen panel, and only while the kernel runs and is idle; "
          "otherwise it says why. Values are cut short and credentials are redacted."))
async def inspect_notebook_kernel(ctx: ToolContext, **arguments: Any) -> dict[str, Any]:
    pinned = await pinned_notebook(ctx, arguments.get("notebook"))
    _, _, service = _services(ctx)
    if service is None:
        raise MemberSafeError("Notebook kernels cannot be reached on this server.",
                              code="notebooks_unavailable")
    try:
        result = await service.inspect_kernel(ctx.member, ctx.bundle.conversation_id,
                                              pinned.path, tuple(arguments.get("names", ())))
    except NotebookRefused as refused:
        raise MemberSafeError(refused.message, code=refused.code) from None
    return {"notebook": pinned.path, **fit(result)}


# --- propose_notebook_edit ---------------------------------------------------------------

EDIT_ITEM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "op": {"enum": ["insert", "replace", "delete"]},
        "cell_id": {"type": "string", "minLength": 1, "maxLength": 64,
                    "description": "replace/delete: the id of the cell to change."},
        "after_cell_id": {"type": ["string", "null"], "maxLength": 64,
                          "description": "insert: the new cell goes after this cell (null or "
                                         "omitted: at the top)."},
        "cell_type": {"enum": list(CELL_TYPES),
                      "description": "insert/replace: code (default for insert), markdown or "
                                     "raw."},
        "source": {"type": "string", "maxLength": MAX_PROPOSED_SOURCE,
                   "description": "insert/replace: the cell's complete new source."},
    },
    "required": ["op"],
    "additionalProperties": False,
}

PROPOSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "notebook": _SELECTOR,
        "edits": {"type": "array", "minItems": 1, "maxItems": MAX_EDIT_CELLS,
                  "items": EDIT_ITEM},
        "summary": {"type": "string", "maxLength": 500,
                    "description": "One line for the member: what the edit does."},
    },
    "required": ["edits"],
    "additionalProperties": False,
}


@tool(name="propose_notebook_edit", capability=Capability.WRITE,
      write_category=WriteCategory.MEMBER_STORE, room_class=RoomClass.ACTOR_BOUND_WRITE,
      surface=NOTEBOOK_SURFACE, timeout_s=20, repeat_creates_object=True,
      explicit_grant_only=True, input_schema=PROPOSE_SCHEMA,
      description=(
          "Propose changes to the notebook the member attached to this message: insert, "
          "replace or delete cells by cell id (ids from the attachment or read_notebook). "
          "Nothing changes and nothing runs until the member reviews the proposal in the "
          "Kaizen panel and accepts cells one by one; say so in your answer. If the notebook "
          "changed since it was attached the proposal is refused as stale: ask the member to "
          "attach it again."))
async def propose_notebook_edit(ctx: ToolContext, **arguments: Any) -> dict[str, Any]:
    pinned = await pinned_notebook(ctx, arguments.get("notebook"))
    _, _, service = _services(ctx)
    if service is None:
        raise MemberSafeError("Notebooks cannot be reached on this server.",
                              code="notebooks_unavailable")
    doc = pinned.doc
    if not doc.has_cell_ids:
        raise MemberSafeError("This notebook has no cell ids (it is older than nbformat "
                              "4.5), so edits cannot be proposed; saving it in JupyterLab 4 "
                              "adds them.", code="notebook_without_ids")
    cells = _proposed_cells(doc, arguments["edits"])
    try:
        current = await service.current(pinned.path)
    except NotebookRefused as refused:
        raise MemberSafeError(refused.message, code=refused.code) from None
    if current.fingerprint() != doc.fingerprint():
        raise MemberSafeError(
            "The notebook changed since it was attached (cells were added, removed or "
            "edited), so this proposal was refused as stale and nothing was recorded. Ask the "
            "member to attach the notebook again.", code="notebook_stale")
    try:
        record = await service.records.create_proposal(
            member=ctx.member, conversation_id=ctx.bundle.conversation_id,
            run_id=ctx.bundle.run_id, artifact_id=pinned.resource.reference_id,
            version=pinned.resource.version, path=pinned.path, fingerprint=fingerprint(doc),
            cells=cells, summary=str(arguments.get("summary", ""))[:500])
    except UnstorableText:
        # Refused at bind time in the proposal's one transaction: nothing was recorded.
        raise MemberSafeError(
            "A proposed cell holds a character that cannot be stored (U+0000 or an unpaired "
            "surrogate), so the proposal was refused and nothing was recorded.",
            code="unstorable_text") from None
    return {**pinned.identity(), "proposal_id": record.id, "status": "awaiting_review",
            "cells": [{"ordinal": c.ordinal, "op": c.op, "cell_id": c.cell_id}
                      for c in record.cells],
            "message": "Proposed. The notebook is unchanged until the member accepts cells "
                       "in the Kaizen panel."}


def fingerprint(doc: NotebookDocument) -> str:
    return hashlib.sha256(json.dumps(doc.fingerprint()).encode("utf-8")).hexdigest()


def _proposed_cells(doc: NotebookDocument, edits: list[dict[str, Any]]) -> list[ProposedCell]:
    """Each edit checked against the pinned notebook; one refusal refuses all of them."""
    out: list[ProposedCell] = []
    touched: set[str] = set()
    for number, edit in enumerate(edits, start=1):
        op = edit["op"]
        where = f"Edit {number} ({op})"
        if op == "insert":
            anchor = edit.get("after_cell_id")
            if anchor is not None and doc.cell(anchor) is None:
                raise MemberSafeError(f"{where}: no cell has id {anchor!r}.",
                                      code="unknown_cell")
            if "source" not in edit or "cell_id" in edit:
                raise MemberSafeError(f"{where}: give source (and optionally after_cell_id, "
                                      "cell_type), not cell_id.", code="invalid_edit")
            out.append(ProposedCell(op=op, cell_id=_new_cell_id(doc, touched),
                                    cell_type=edit.get("cell_type", "code"),
                                    source=edit["source"], after_cell_id=anchor))
            touched.add(out[-1].cell_id)
            continue
        cell_id = edit.get("cell_id")
        cell = doc.cell(cell_id) if isinstance(cell_id, str) else None
        if cell is None or not CELL_ID.fullmatch(cell.id):
            raise MemberSafeError(f"{where}: no cell has id {cell_id!r}.", code="unknown_cell")
        if cell.id in touched:
            raise MemberSafeError(f"{where}: cell {cell.id!r} is already changed by this "
                                  "proposal.", code="invalid_edit")
        if len(cell.source) > MAX_CELL_SOURCE:
            raise MemberSafeError(f"{where}: cell {cell.id!r} is too large to change by "
                                  "proposal.", code="cell_too_large")
        if op == "replace" and "source" not in edit:
            raise MemberSafeError(f"{where}: give the cell's complete new source.",
                                  code="invalid_edit")
        if op == "delete" and ("source" in edit or "cell_type" in edit):
            raise MemberSafeError(f"{where}: a delete takes only cell_id.",
                                  code="invalid_edit")
        if "after_cell_id" in edit:
            raise MemberSafeError(f"{where}: after_cell_id is for insert only.",
                                  code="invalid_edit")
        touched.add(cell.id)
        out.append(ProposedCell(
            op=op, cell_id=cell.id, cell_type=edit.get("cell_type", cell.cell_type),
            source=edit["source"] if op == "replace" else None,
            base_source=cell.source, base_digest=source_digest(cell.source)))
    return out


def _new_cell_id(doc: NotebookDocument, taken: set[str]) -> str:
    while True:
        candidate = uuid.uuid4().hex[:8]
        if doc.cell(candidate) is None and candidate not in taken:
            return candidate


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(read_notebook)
    register(inspect_notebook_kernel)
    register(propose_notebook_edit)
