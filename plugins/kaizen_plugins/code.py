"""run_code: agent-written code in the member's sandboxed Jupyter kernel."""

from __future__ import annotations

from typing import Any

from kaizen_kernel.resources import FetchedVersion, ResourceGrant
from kaizen_kernel.schema import DESCRIPTION, INPUT_SCHEMA
from kaizen_plugins.artifacts import persist_run_files
from kaizen_plugins.office_idioms import OFFICE_IDIOMS
from kaizen_plugins.sandbox import SANDBOX_TOOL
from kaizen_server_extension.protocol.errors import NotFound
from kaizen_server_extension.resources import (
    DOCUMENT_REFERENCE,
    AdmittedResources,
    SharedResource,
)
from kaizen_server_extension.tools import (
    MemberSafeError,
    ToolContext,
    TrustedBody,
    hookimpl,
    tool,
)
from kaizen_server_extension.tools.hookspecs import ToolRegistrar

# Above the sandbox's own wall-time cap (SANDBOX_MAX_WALL_SECONDS, at most 240 s) plus the
# interrupt-then-restart grace, so the sandbox, not the pipeline, reports a slow program.
RUN_CODE_TIMEOUT_S = 240
#: Leads the description, so a budgeted prompt keeps it: small models otherwise end a script
#: with a top-level ``return`` and get a SyntaxError instead of the value.
PRINT_RESULTS = ("Run a program and read what it prints: print() every value you need (a "
                 "top-level return is a SyntaxError).")


@tool(
    name="run_code",
    # The native-office idioms are their own paragraph (tested against the real libraries).
    description=f"{PRINT_RESULTS} {DESCRIPTION}\n\n{OFFICE_IDIOMS}",
    input_schema=INPUT_SCHEMA,
    timeout_s=RUN_CODE_TIMEOUT_S,
    **SANDBOX_TOOL,
)
async def run_code(ctx: ToolContext, **arguments: Any) -> dict[str, Any]:
    service = ctx.services.run_code
    if service is None:
        raise MemberSafeError("Code execution is not available on this server.",
                              code="run_code_unavailable")
    bridge = ctx.services.bridge
    result = await service.run_arguments(
        ctx.member, ctx.bundle.conversation_id, dict(arguments),
        callable_tools=bridge.read_tools if bridge is not None else {},
        call_context=bridge,
        # Only the admission names files; nothing in the arguments can.
        resources=_resource_grant(ctx),
    )
    payload: dict[str, Any] = result.to_payload()
    # Output files persist through the artifact store, even when the program failed.
    stored = await persist_run_files(ctx, result.files, payload, failed=result.failed)
    # The stored files also travel as trusted data, so the journal can morph each declared
    # target's generation placeholder into its file, or drop it when there is none;
    # so do the displayed images, shown on the chat canvas in place of their markers.
    return TrustedBody(payload, stored, canvas=result.canvas())


def _resource_grant(ctx: ToolContext) -> ResourceGrant | None:
    """The turn's admitted files (and the document versions request_document added) and a
    fetcher of their exact versions as the member may read them now (owner, or bound to this
    exact room; a document readable here), for the sandbox to verify and project."""
    admitted = ctx.services.resources
    requested = ctx.services.requested_documents
    services = ctx.services.artifacts
    documents = ctx.services.documents
    if not admitted and not requested:
        return None
    member, room = ctx.member, ctx.bundle.conversation_id
    scope = ctx.services.knowledge_scope

    async def fetch(pinned: SharedResource) -> FetchedVersion:
        # Each read as the member now: a file no longer readable refuses the call.
        try:
            if pinned.kind == DOCUMENT_REFERENCE and documents is not None:
                found = await documents.version_file(member, pinned.reference_id,
                                                     pinned.version, room=room, scope=scope)
                return FetchedVersion(found.version, found.media_type, found.content)
            if pinned.kind != DOCUMENT_REFERENCE and services is not None:
                record = await services.store.resolve(member, pinned.reference_id,
                                                      version=pinned.version, room=room)
                return FetchedVersion(record.version, record.mime, record.content)
        except NotFound:
            raise LookupError(pinned.reference_id) from None
        raise LookupError(pinned.reference_id)

    # The admitted files, then the document versions request_document added this turn; the
    # sandbox verifies the bytes of every one against this list's digest.
    return ResourceGrant(AdmittedResources.of([*admitted.resources, *requested]), fetch)


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(run_code)
