"""Credential forms: a signed, expiring, one-shot page where a member enters a credential.

The only way a credential value enters Kaizen is a member typing it into this form in their
own browser; the model never sees the form's values (R-386). A form is issued for one member
and one destination as a signed plan (``credentials/crypto.py``): the member, the destination
and its fingerprint (origin, scheme, provider), the origin itself, a random nonce and an
expiry five minutes out (R-387). The token is the form's URL; nothing about an issued form is
stored, so issuing costs nothing and an unsubmitted form simply expires.

Opening the form verifies the signature, the expiry and the member, and answers with the
destination origin before anything else (R-388). Submitting verifies all of that again,
re-checks the live policy — the destination still exists, is enabled, has the same
fingerprint, and the member's admin policy for it still allows it — and only then claims the
nonce, by inserting the form's receipt in the same transaction that stores a remembered value
(R-389, R-390, R-397). A refusal at any step stores nothing and leaves no receipt. A nonce is
claimed once: a replayed submission is refused by the database's UNIQUE constraint.

A form may also be issued for **one exact call** of an External OpenAPI operation
(``credentials/call_binding.py``): its plan then binds the source, the operation, the
digest of the source's schema document, the digest of the call's arguments and the effect
class as well. Opening and submitting it re-check that the source still offers that very
operation from the same document and API base (a changed source needs a new form, R-390);
its credential is held for use once, and the broker gives it only to that call (R-387).

A form for a call the pipeline **paused** for a credential (``credentials/paused_calls.py``)
binds the paused request and the approval that call consumed too. Submitting it settles that
request in the same transaction that claims the nonce, so the value reaches the waiting call
and nothing else; a request that is no longer waiting (cancelled, expired, its run ended)
refuses the form with nothing stored.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kaizen_server_extension.credentials.broker import CredentialBroker
from kaizen_server_extension.credentials.call_binding import BindingMalformed, CallBinding
from kaizen_server_extension.credentials.crypto import PlanRejected, open_plan, sign_plan
from kaizen_server_extension.credentials.destinations import Destination
from kaizen_server_extension.protocol.errors import MemberError
from kaizen_server_extension.store.credential_requests import (
    CredentialRequests,
    RequestClosed,
)
from kaizen_server_extension.store.credentials import CredentialRecords, NonceSpent
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.tools.mtls import (
    ClientCertificate,
    MtlsUnavailable,
    check_client_material,
)

#: How long an issued form can be submitted (spec: a five-minute expiry).
FORM_TTL_S = 300
#: Where the form page is served, under the server's base URL (``api/credentials.py``).
FORM_PATH = "kaizen/credentials/forms"
PLAN_VERSION = 1
#: The longest secret field a form accepts.
MAX_SECRET_CHARS = 8192
MAX_LABEL_CHARS = 200


class FormRefused(MemberError):
    """A form that cannot be opened or submitted; nothing was stored."""

    status = 400


class _FormForbidden(FormRefused):
    status = 403


class _FormNotFound(FormRefused):
    status = 404


class _FormUsed(FormRefused):
    status = 409


class _FormExpired(FormRefused):
    status = 410


class _FormInvalid(FormRefused):
    status = 422


_BY_STATUS: Mapping[int, type[FormRefused]] = {
    400: FormRefused, 403: _FormForbidden, 404: _FormNotFound, 409: _FormUsed,
    410: _FormExpired, 422: _FormInvalid}


_REFUSALS: Mapping[str, tuple[int, str]] = {
    "form_tampered": (400, "This credential form link is not valid."),
    "form_expired": (410, "This credential form has expired. Ask for a new one."),
    "form_used": (409, "This credential form was already used. Ask for a new one."),
    "form_not_yours": (404, "Not found."),
    "destination_unknown": (404, "This credential destination no longer exists."),
    "destination_changed": (409, "This credential destination changed after the form was "
                                 "issued. Ask for a new form."),
    "destination_disabled": (403, "Credentials for this destination are disabled."),
    "destination_denied": (403, "You may not enter credentials for this destination."),
    "query_auth_disabled": (403, "Credentials sent in a URL's query string are not enabled "
                                 "on this server."),
    "policy_check_failed": (403, "Credentials for this destination cannot be checked now."),
    "call_unknown": (404, "This destination has no such operation for you."),
    "operation_denied": (403, "You may not use this operation now."),
    "call_arguments_invalid": (422, "These arguments do not fit the operation, so no form "
                                    "can be issued for that call."),
    "operation_changed": (409, "The operation this form was issued for changed since (its "
                               "source's document or API base). Ask for a new form."),
    "request_closed": (409, "The call this form was for is no longer waiting for a "
                            "credential (it was cancelled, it expired, or its turn ended). "
                            "Nothing was stored."),
}


def refused(code: str) -> FormRefused:
    status, message = _REFUSALS[code]
    return _BY_STATUS[status](message, code=code)


@dataclass(frozen=True, slots=True)
class OpenForm:
    """A verified plan with its live destination: what the page shows."""

    token: str
    plan: Mapping[str, Any]
    destination: Destination
    remember_offered: bool

    @property
    def expires_at(self) -> int:
        return int(self.plan["exp"])

    @property
    def call(self) -> CallBinding | None:
        """The one call this form is for, or None (a form for the destination)."""
        value = self.plan.get("call")
        return None if value is None else CallBinding.from_plan(value)


@dataclass(frozen=True, slots=True)
class Submitted:
    credential_ref: str
    retention: str
    receipt_id: str
    destination: Destination
    #: The paused call this submission resumed, if the form was for one.
    resumed: str | None = None


@dataclass(frozen=True, slots=True)
class PausedFor:
    """The paused call a form is issued for: its conversation, request and the approval it
    consumed (None when no approval authorized it), and the request's nonce and expiry."""

    conversation: str
    request: str
    approval: str | None
    nonce: str
    expires_at: int


class CredentialForms:
    def __init__(self, store: Store, broker: CredentialBroker, form_key: bytes, *,
                 remember_enabled: bool, clock: Callable[[], float] = time.time,
                 ttl_s: int = FORM_TTL_S) -> None:
        if not 1 <= ttl_s <= FORM_TTL_S:
            raise ValueError("a form's lifetime is at most five minutes")
        self._ttl_s = ttl_s
        self._store = store
        self._records = CredentialRecords(store)
        self._broker = broker
        self._key = form_key
        self._remember = remember_enabled
        self._clock = clock

    @property
    def remember_enabled(self) -> bool:
        return self._remember

    @property
    def ttl_s(self) -> int:
        return self._ttl_s

    def new_pause(self) -> tuple[str, int]:
        """A nonce and expiry for a paused call's form (the request row stores both)."""
        return secrets.token_urlsafe(18), int(self._clock()) + self._ttl_s

    async def issue(self, member: str, destination_id: str, label: str = "", *,
                    call: tuple[str, Mapping[str, Any]] | None = None,
                    paused: PausedFor | None = None) -> OpenForm:
        """A fresh form for ``member`` and the destination, if they may use it now; with
        ``call`` (a tool name and its arguments), for that one call only (R-387); with
        ``paused`` too, for that paused call under the approval it consumed."""
        destination = await self._broker.destinations.lookup(destination_id, member)
        code = await self._broker.refusal(member, destination)
        if code is not None or destination is None:
            raise refused(code or "destination_unknown")
        plan: dict[str, Any] = {
            "v": PLAN_VERSION, "member": member, "destination": destination.id,
            "fingerprint": destination.fingerprint(), "origin": destination.origin,
            "nonce": secrets.token_urlsafe(18), "exp": int(self._clock()) + self._ttl_s,
            "label": label.strip()[:MAX_LABEL_CHARS]}
        if paused is not None and call is None:
            raise ValueError("a paused call's form is for that call")
        if call is not None:
            bound = await self._broker.destinations.bind_call(member, destination, *call)
            if isinstance(bound, str):
                raise refused(bound)
            if paused is not None:
                bound = replace(bound, conversation=paused.conversation,
                                request=paused.request, approval=paused.approval)
                plan["nonce"], plan["exp"] = paused.nonce, paused.expires_at
            plan["call"] = bound.plan()
        token = sign_plan(plan, self._key)
        return OpenForm(token, plan, destination, self._offers_remember(plan))

    def _offers_remember(self, plan: Mapping[str, Any]) -> bool:
        # A form for one call gives a credential for that call: used once, never kept.
        return self._remember and plan.get("call") is None

    async def open(self, member: str, token: str) -> OpenForm:
        """The form behind ``token`` for ``member``, verified now (raises FormRefused)."""
        try:
            plan = open_plan(token, self._key)
        except PlanRejected as exc:
            raise refused(exc.code) from None
        if plan.get("v") != PLAN_VERSION or not isinstance(plan.get("exp"), int):
            raise refused("form_tampered")
        # Another member's form is not theirs to know about.
        if plan.get("member") != member:
            raise refused("form_not_yours")
        if plan["exp"] <= self._clock():
            raise refused("form_expired")
        destination = await self._broker.destinations.lookup(str(plan.get("destination")),
                                                             member)
        code = await self._broker.refusal(member, destination)
        if code is not None or destination is None:
            raise refused(code or "destination_unknown")
        if destination.fingerprint() != plan.get("fingerprint") \
                or destination.origin != plan.get("origin"):
            raise refused("destination_changed")
        if "call" in plan:
            try:
                binding = CallBinding.from_plan(plan["call"])
            except BindingMalformed:
                raise refused("form_tampered") from None
            # The same operation, from the same document and API base, offered now.
            code = await self._broker.destinations.call_refusal(member, destination, binding)
            if code is not None:
                raise refused(code)
        if await self._records.nonce_claimed(f"form:{plan['nonce']}"):
            raise refused("form_used")
        request = plan["call"].get("request") if "call" in plan else None
        if request is not None:
            waiting = await CredentialRequests(self._store).get(str(request))
            if waiting is None or waiting.member != member \
                    or waiting.status != "pending":
                raise refused("request_closed")
        return OpenForm(token, plan, destination, self._offers_remember(plan))

    async def submit(self, member: str, token: str, fields: Mapping[str, str], *,
                     remember: bool) -> Submitted:
        """Verify and re-check everything (``open``), then claim the nonce and keep the
        value: sealed in the database when the member chose Remember (and it is enabled),
        else in memory for one request. Raises FormRefused with nothing stored."""
        form = await self.open(member, token)
        destination = form.destination
        secret = _secret_fields(destination, fields)
        if remember and not form.remember_offered:
            raise FormRefused("Remembering this credential is not offered (it is not enabled "
                              "on this server, or the form is for one call).",
                              code="remember_disabled")
        binding = form.call
        retention = "remember" if remember else "once"
        label = str(form.plan.get("label") or "") or destination.label or destination.id
        ref: str | None = None
        try:
            async with self._store.transaction() as tx:
                receipt = await CredentialRecords.claim_in(
                    tx, nonce=f"form:{form.plan['nonce']}", kind="form", member=member,
                    destination=destination.id, origin=destination.origin,
                    retention=retention,
                    operation=binding.tool if binding is not None else None,
                    effect=binding.effect if binding is not None else None)
                if retention == "remember":
                    sealed = self._broker.seal(member, destination, secret, label)
                    ref = sealed.ref
                    await CredentialRecords.remember_in(tx, sealed)
                else:
                    ref = self._broker.hold_once(member, destination, secret,
                                                 binding=binding)
                if binding is not None and binding.request is not None:
                    # The paused call takes this value, now or never.
                    await CredentialRequests.settle_in(tx, binding.request, "submitted", member,
                                                       member=member, credential_ref=ref)
                await CredentialRecords.settle_in(tx, receipt, "stored", credential_ref=ref)
                await tx.audit(member, "credential.entered", {
                    "credential_ref": ref, "destination": destination.id,
                    "origin": destination.origin, "retention": retention,
                    "receipt": receipt,
                    **({"call": binding.public()} if binding is not None else {})})
        except NonceSpent:
            raise refused("form_used") from None
        except RequestClosed:
            if ref is not None and retention == "once":
                self._broker.drop_once(ref)
            raise refused("request_closed") from None
        except BaseException:
            if ref is not None and retention == "once":
                self._broker.drop_once(ref)
            raise
        return Submitted(ref, retention, receipt, destination,
                         binding.request if binding is not None else None)


def _secret_fields(destination: Destination, fields: Mapping[str, str]) -> dict[str, str]:
    secret: dict[str, str] = {}
    scheme = destination.scheme
    for name in scheme.fields():
        value = fields.get(name, "")
        if scheme.optional(name) and value == "":
            continue  # left empty, as it may be (an unencrypted key's passphrase)
        if not isinstance(value, str) or not value or len(value) > MAX_SECRET_CHARS \
                or any(ord(c) < 32 or c == "\x7f" for c in value):
            raise _FormInvalid(f"Enter the {name.replace('_', ' ')} (at most "
                               f"{MAX_SECRET_CHARS} characters, no control characters).",
                               code="credential_field_invalid")
        secret[name] = value
    if destination.scheme.kind == "basic" and ":" in secret["username"]:
        raise _FormInvalid("A user name cannot contain ':'.", code="credential_field_invalid")
    if destination.scheme.kind == "mtls":
        _check_client_material(secret)
    return secret


def _check_client_material(secret: Mapping[str, str]) -> None:
    """A client certificate that could never be presented (not PEM, a key that is not its
    own, an encrypted key without its passphrase or with a wrong one) is refused now, in
    memory, before the nonce is claimed: nothing is stored and the member can correct it."""
    try:
        check_client_material(ClientCertificate.from_fields(
            secret["certificate"], secret["private_key"], secret.get("passphrase", "")))
    except MtlsUnavailable as exc:
        raise _FormInvalid(str(exc), code=exc.code) from None
