"""Administrator-approved MCP artifact producers: a declared tool's result becomes a governed
renderable artifact (docs/mcp.md, "Artifact producers (version 2 envelopes)").

This is the shared result boundary for MCP tools: the one place a producer's answer turns
into the tool result. Only the administrator's registration (``artifact_tools`` of a
``KAIZEN_MCP_SERVERS`` entry) makes a producer; what the server lists, annotates or returns
never does (R-107). For a declared producer:

* the envelope is the result's single text block, parsed strictly here — duplicate keys,
  NaN or anything off the version 2 contract fail closed. A ``structuredContent`` the server
  sent beside it is never the envelope: the transport already parsed it permissively, so a
  later duplicate key could have replaced an earlier one there unseen. It is dropped with the
  rest of the raw result; only the canonical form of the strictly parsed text is stored;
* invalid, oversized, non-JSON or path-bearing output refuses the call with a member-safe
  error and writes nothing;
* a valid envelope is canonicalized, attested for this exact call and producer, and written
  through the owner-scoped governed writer as the calling member, in the run's room. The
  model gets back only the artifact's identity and what the attestation asserts.

The attestation asserts that this approved producer returned output that passed the
envelope contract. It does not assert that the producer's provenance or security markings
are true: a careless or compromised producer can mint false but schema-valid metadata, so
reviewing, enabling and revoking producers is the administrator's part (R-403).
"""

from __future__ import annotations

import logging
from typing import Any

from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.store.artifacts.content import (
    ATTESTATION_ASSERTS,
    Envelope,
    ValidationFailed,
    attest_trusted_result,
    validate_envelope,
)
from kaizen_server_extension.store.artifacts.repository import WriteContext
from kaizen_server_extension.tools.running_call import running_call_id
from kaizen_server_extension.tools.types import ToolContext

log = logging.getLogger("kaizen.tools.mcp")

#: Characters of text a declared producer's result may carry to this boundary (the envelope
#: contract's own byte bound is checked on the canonical form; this only stops an unbounded
#: read). Nothing of it reaches the model.
MAX_PRODUCER_TEXT_CHARS = 1024 * 1024
#: Characters of a validator's reason shown to the member (it may name the producer's keys).
_MAX_REASON_CHARS = 300


class ProducerRefused(MemberSafeError):
    """A declared producer's result was not a valid envelope: nothing was written."""


def _refused(server_id: str, remote: str, reason: str) -> ProducerRefused:
    return ProducerRefused(
        f"{remote} on the MCP server {server_id} is an approved artifact producer, but its "
        f"result is not a valid renderable artifact ({reason[:_MAX_REASON_CHARS]}). Nothing "
        "was saved.", code="artifact_envelope_invalid")


def envelope_of(server_id: str, remote: str, body: dict[str, Any]) -> Envelope:
    """The validated envelope a producer's bounded result carries, or :class:`ProducerRefused`."""
    if body.get("truncated"):
        raise _refused(server_id, remote, "the result is too large")
    texts = [p.get("text") for p in body.get("content", ()) if isinstance(p, dict)]
    if len(texts) != 1 or not isinstance(texts[0], str):
        raise _refused(server_id, remote, "it must be exactly one text block holding the "
                                          "envelope JSON")
    try:
        envelope = validate_envelope(texts[0])
    except ValidationFailed as exc:
        raise _refused(server_id, remote, str(exc)) from None
    return envelope


async def govern(ctx: ToolContext, *, server_id: str, remote: str, producer: str,
                 body: dict[str, Any]) -> dict[str, Any]:
    """A declared producer's result, written as a governed artifact: the bounded result the
    model gets. A result the server marked as an error passes through as that error."""
    if body.get("ok") is False:
        return body
    envelope = envelope_of(server_id, remote, body)
    call_id = running_call_id()
    artifacts = ctx.services.artifacts
    if call_id is None or artifacts is None:
        # Outside a guarded call (or without the artifact store) there is no call to scope an
        # attestation to: fail closed.
        raise ProducerRefused(f"{remote} on the MCP server {server_id} produces artifacts, "
                              "which cannot be saved here; nothing was saved.",
                              code="artifact_producer_unavailable")
    bundle = ctx.bundle
    # Scoped to this run's call, whatever call id the model reused elsewhere.
    attestation = attest_trusted_result(f"{bundle.run_id}:{call_id}", envelope,
                                        producer=producer)
    record = await artifacts.store.create_governed(
        ctx.member, envelope, attestation,
        where=WriteContext(conversation_id=bundle.conversation_id, run_id=bundle.run_id))
    log.info("MCP producer %s wrote governed artifact %s v%d (run %s)", producer,
             record.artifact_id, record.version, bundle.run_id)
    return {
        "server": server_id, "tool": remote,
        "artifact": {"id": record.artifact_id, "version": record.version,
                     "title": record.title[:200]},
        "attested": {"producer": producer, "asserts": ATTESTATION_ASSERTS},
        "note": ("Saved as a governed artifact. Kaizen attests only that this approved "
                 "producer returned validated output; its provenance and markings are the "
                 "producer's own claims, not verified facts."),
    }


__all__ = ["MAX_PRODUCER_TEXT_CHARS", "ProducerRefused", "envelope_of", "govern"]
