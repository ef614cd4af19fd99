"""A call that needs a credential pauses for the member's form, then completes with it
(docs/credentials.md, "A call that needs a credential"; spec: External OpenAPI sources).

When the model calls an External OpenAPI operation that requires authentication without a
``credential_ref``, the pipeline does not fail the call. After every earlier step — the
approval gate included, so a write's or a sensitive operation's one-shot approval has been
**consumed** for this call — it asks this module, which:

1. issues the signed form for this one call (``credentials/forms.py``): its plan binds the
   actor, the conversation (workroom), the source, the operation, the schema digest, the
   arguments' digest, the effect class, the consumed approval, the paused request, the nonce,
   the API base and the expiry (R-387); issuing re-checks the admin tree and the source now;
2. persists the paused request and moves the run to waiting, journaling
   ``credential.requested`` with the form's path and the destination origin — never a value
   (``store/credential_requests.py``), and raises
   :class:`~kaizen_server_extension.policy.errors.CredentialPending`.

The host keeps the run waiting exactly as for an approval. The member opens the form (the
destination origin first, R-388) and submits: the submission re-checks the live policy,
claims the nonce and settles the request with the opaque reference of the use-once value, in
one transaction (R-389, R-397). The host then re-issues the call; the approval gate finds its
approval consumed **by this paused call** (:meth:`PausedCalls.approval_resumes`), and this
module hands the pipeline a broker handle for the submitted value, whose binding names this
request and this approval, so it serves this call exactly once and nothing else (R-387,
R-391). Expired or cancelled, the re-issued call settles as a member-safe refusal instead and
the turn goes on.

**The approval digest keeps the ``credential_ref``.** An approval covers the exact argument
text the member was shown (R-224, R-283). A paused call has no reference when it is approved,
so its approval is asked, decided and consumed before any form exists, and the form binds the
approval — not the other way round. A call the model makes with a reference (a remembered
credential, or a form issued through ``POST credentials/forms``) is approved with that
reference in the digest, so an approval for one credential never runs the call with another.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

from kaizen_server_extension.credentials.broker import CredentialBroker, CredentialRefused
from kaizen_server_extension.credentials.call_binding import CallIdentity, call_arguments_digest
from kaizen_server_extension.credentials.forms import (
    FORM_PATH,
    CredentialForms,
    FormRefused,
    PausedFor,
)
from kaizen_server_extension.policy.errors import CredentialPending
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.store.core import new_id
from kaizen_server_extension.store.credential_requests import (
    CredentialRequests,
    NewPause,
    PausedCall,
)
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.tools.ports import PausedCallFacts
from kaizen_server_extension.tools.types import ToolDescriptor


@dataclass(frozen=True, slots=True)
class Resumed:
    """The submitted value's reference, and the call identity its handle is checked with."""

    credential_ref: str
    call: CallIdentity


class PausedCalls:
    def __init__(self, store: Store, forms: CredentialForms, broker: CredentialBroker) -> None:
        self.requests = CredentialRequests(store)
        self._forms = forms
        self._broker = broker

    async def approval_resumes(self, bundle: AuthorityBundle, facts: PausedCallFacts,
                               approval_id: str) -> bool:
        """Whether ``approval_id``, consumed, was consumed by this very call before it paused
        and the pause has settled since: the re-issued call goes on under it. Any other call
        — another call id, other arguments, another run — is asked anew."""
        paused = await self.requests.of_approval(approval_id)
        return (paused is not None and paused.run_id == bundle.run_id
                and paused.member == bundle.member and paused.call_id == facts.call_id
                and paused.args_digest == facts.args_digest and paused.status != "pending"
                and paused.resumed_at is None)

    async def paused_under(self, bundle: AuthorityBundle, facts: PausedCallFacts) -> str | None:
        """What authorized this call before it paused, if its pause settled and it was not
        resumed yet: the member's conversation grant then answers its re-issue too (the
        call's facts are read once, before the pause), as the approval it consumed does."""
        paused = await self.requests.of_call(bundle.run_id, facts.call_id, facts.args_digest)
        if paused is None or paused.member != bundle.member:
            return None
        return paused.authorized_by

    async def resume_or_pause(self, bundle: AuthorityBundle, facts: PausedCallFacts,
                              descriptor: ToolDescriptor, destination: str, effect: str,
                              schema_digest: str, arguments: dict[str, Any]) -> Resumed:
        """The submitted credential of this paused call; or a member-safe refusal when its
        form expired or was cancelled; or pause it now (raises CredentialPending)."""
        paused = await self.requests.of_call(bundle.run_id, facts.call_id, facts.args_digest)
        if paused is not None and paused.approval_id == facts.approval_id:
            return await self._resume(paused, descriptor, effect, schema_digest, arguments)
        await self._pause(bundle, facts, descriptor, destination, effect, arguments)

    async def _resume(self, paused: PausedCall, descriptor: ToolDescriptor, effect: str,
                      schema_digest: str, arguments: dict[str, Any]) -> Resumed:
        taken = await self.requests.resume(paused.id)
        if taken is None:
            raise CredentialRefused(f"The credential entered for {paused.origin} was already "
                                    f"used, so this {descriptor.name} call was not run.",
                                    "credential_request_used")
        status, ref = taken
        if status == "submitted" and ref is not None:
            return Resumed(ref, CallIdentity(
                descriptor.name, call_arguments_digest(arguments), schema_digest, effect,
                request=paused.id, approval=paused.approval_id))
        if status == "cancelled":
            raise CredentialRefused(
                f"The member cancelled the credential form for {paused.origin}, so "
                f"{descriptor.name} was not run. Do not call it again in this turn; tell the "
                "member it needs their credential.", "credential_form_cancelled")
        raise CredentialRefused(
            f"The member did not enter a credential for {paused.origin} before its form "
            f"expired, so {descriptor.name} was not run. Tell the member; call it again only "
            "if they ask.", "credential_form_expired")

    async def _pause(self, bundle: AuthorityBundle, facts: PausedCallFacts,
                     descriptor: ToolDescriptor, destination: str, effect: str,
                     arguments: dict[str, Any]) -> NoReturn:
        request_id = new_id()
        nonce, expires = self._forms.new_pause()
        try:
            form = await self._forms.issue(
                bundle.member, destination, call=(descriptor.name, arguments),
                paused=PausedFor(bundle.conversation_id, request_id, facts.approval_id,
                                 nonce, expires))
        except FormRefused as exc:
            # The live policy (or the source) refuses a form for this call: it is not run.
            raise CredentialRefused(f"{exc.message} So {descriptor.name} was not run.",
                                    exc.code) from None
        expires_at = datetime.fromtimestamp(form.expires_at, UTC)
        event = {"request_id": request_id, "call_id": facts.call_id, "tool": descriptor.name,
                 "destination": form.destination.id, "origin": form.destination.origin,
                 "scheme": form.destination.scheme.kind, "effect": effect,
                 "approval_id": facts.approval_id,
                 # Relative to the server's base URL; the token is the signed plan (no value).
                 "form_path": f"{FORM_PATH}/{form.token}",
                 "expires_at": expires_at.isoformat()}
        paused = await self.requests.pause(NewPause(
            id=request_id, run_id=bundle.run_id, fence=bundle.fence,
            conversation_id=bundle.conversation_id, call_id=facts.call_id,
            member=bundle.member, tool=descriptor.name, destination=form.destination.id,
            origin=form.destination.origin, effect=effect, args_digest=facts.args_digest,
            approval_id=facts.approval_id, authorized_by=facts.authorized_by, nonce=nonce,
            expires_at=expires_at), event)
        if not paused:
            raise CredentialRefused(f"This turn is no longer running, so {descriptor.name} "
                                    "was not run.", "run_not_waiting")
        raise CredentialPending(request_id, call_id=facts.call_id, tool=descriptor.name)


__all__ = ["PausedCalls", "Resumed"]
