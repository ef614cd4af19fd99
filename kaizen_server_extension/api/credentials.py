"""REST and the browser form of the credential quarantine (docs/credentials.md).

Registered only when ``KAIZEN_CREDENTIALS_ENABLED`` is on; off, these paths do not exist.

* ``GET kaizen/api/credentials/destinations`` — where the caller may enter a credential now;
* ``POST kaizen/api/credentials/forms`` — issue a signed, five-minute, one-shot form for one
  destination; the answer is the form's URL (its token is the signed plan), never a value;
* ``GET|POST kaizen/credentials/forms/{token}`` — the form itself, a server-rendered page
  that shows the destination origin first; the member's browser submits the value straight
  to the server, which answers with the opaque ``credential_ref`` only;
* ``GET kaizen/api/credentials`` — the caller's references (identity only: no method anywhere
  reads a value back, R-395); ``DELETE kaizen/api/credentials/{ref}`` forgets one;
* ``GET kaizen/api/credentials/receipts`` — the caller's credential-free receipts (R-398);
* ``GET kaizen/api/credentials/requests`` — the caller's tool calls paused for a credential
  (identity and status); ``POST kaizen/api/credentials/requests/{id}/cancel`` — decline one:
  the call settles as refused and the turn goes on (docs/credentials.md, "A call that needs
  a credential"). Each pause is journaled as ``credential.requested`` with the path of its
  form, and its end as ``credential.settled``.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime
from typing import Any

from jupyter_server.base.handlers import JupyterHandler
from pydantic import BaseModel, ConfigDict, Field
from tornado import web

from kaizen_server_extension.api.base import AUTH_RESOURCE, KaizenHandler, admit_member
from kaizen_server_extension.api.openapi_parts import (
    answer,
    error_answers,
    operation,
    path_param,
    ref,
)
from kaizen_server_extension.api.params import ID, query_value
from kaizen_server_extension.context import KaizenContext
from kaizen_server_extension.credentials.forms import FORM_PATH, FormRefused, OpenForm
from kaizen_server_extension.credentials.service import CredentialService
from kaizen_server_extension.protocol.errors import BadRequest, Conflict, MemberError, NotFound
from kaizen_server_extension.store.credential_requests import (
    CREDENTIAL_REQUEST_STATUSES,
    CredentialRequests,
    RequestClosed,
)

REF = r"cref_[A-Za-z0-9_-]{22,64}"
TOKEN = r"[A-Za-z0-9_-]{16,4000}\.[A-Za-z0-9_-]{16,200}"


class FormCall(BaseModel):
    """The one call a form is for (an External OpenAPI operation's tool and arguments)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tool: str = Field(min_length=1, max_length=64)
    arguments: dict[str, Any] = Field(default_factory=dict)


class FormRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    destination: str = Field(min_length=1, max_length=120)
    label: str = Field(default="", max_length=200)
    #: Bind the form to this one call (R-387); absent: a form for the destination.
    call: FormCall | None = None


#: A form request's body bound (a call's arguments included).
FORM_REQUEST_MAX_BYTES = 64 * 1024


def _service(kaizen: KaizenContext) -> CredentialService:
    service = kaizen.credentials
    assert isinstance(service, CredentialService)
    return service


class CredentialDestinationsHandler(KaizenHandler):
    @web.authenticated
    async def get(self) -> None:
        service = _service(self.kaizen)
        usable = [d.public() for d in await service.destinations.listing(self.member)
                  if await service.broker.refusal(self.member, d) is None]
        self.write_json(usable)


class CredentialFormsHandler(KaizenHandler):
    @web.authenticated
    async def post(self) -> None:
        body = self.parse_body(FormRequest, limit=FORM_REQUEST_MAX_BYTES)
        call = (body.call.tool, body.call.arguments) if body.call is not None else None
        form = await _service(self.kaizen).forms.issue(self.member, body.destination,
                                                       body.label, call=call)
        self.write_json(_issued(self, form), status=201)


def _issued(handler: JupyterHandler, form: OpenForm) -> dict[str, Any]:
    issued: dict[str, Any] = {
        "form_url": f"{handler.base_url}{FORM_PATH}/{form.token}",
        "expires_at": datetime.fromtimestamp(form.expires_at, UTC).isoformat(),
        "destination": form.destination.public(),
        "remember_offered": form.remember_offered}
    call = form.call
    if call is not None:
        issued["call"] = call.public()
    return issued


class CredentialsHandler(KaizenHandler):
    @web.authenticated
    async def get(self) -> None:
        service = _service(self.kaizen)
        remembered = [c.public() for c in await service.records.remembered_by(self.member)]
        self.write_json({"remembered": remembered,
                         "once": service.broker.pending_once(self.member)})


class CredentialHandler(KaizenHandler):
    @web.authenticated
    async def delete(self, ref: str) -> None:
        service = _service(self.kaizen)
        pending = [p for p in service.broker.pending_once(self.member)
                   if p["credential_ref"] == ref]
        if pending:
            service.broker.drop_once(ref)
            self.write_json({"forgotten": pending[0]})
            return
        gone = await service.records.forget(self.member, ref)
        if gone is None:
            raise NotFound("You have no credential with that reference.",
                           code="credential_not_found")
        self.write_json({"forgotten": gone.public()})


class CredentialReceiptsHandler(KaizenHandler):
    @web.authenticated
    async def get(self) -> None:
        receipts = await _service(self.kaizen).records.receipts_of(self.member)
        self.write_json([r.public() for r in receipts])


class CredentialRequestsHandler(KaizenHandler):
    @web.authenticated
    async def get(self) -> None:
        status = query_value(self, "status")
        if status is not None and status not in CREDENTIAL_REQUEST_STATUSES:
            raise BadRequest("Unknown credential request status.", code="invalid_query")
        paused = await CredentialRequests(self.kaizen.store).list_for(self.member, status)
        self.write_json([p.public() for p in paused])


class CredentialRequestCancelHandler(KaizenHandler):
    @web.authenticated
    async def post(self, request_id: str) -> None:
        requests = CredentialRequests(self.kaizen.store)
        paused = await requests.get(request_id)
        if paused is None or paused.member != self.member:
            raise NotFound("No such credential request.", code="credential_request_not_found")
        try:
            settled = await requests.settle(request_id, "cancelled", self.member,
                                            member=self.member)
        except RequestClosed:
            raise Conflict("This credential request is no longer waiting.",
                           code="credential_request_closed") from None
        self.write_json(settled.public())


# --- the form page ------------------------------------------------------------------------

_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d1f23}
main{max-width:34rem;margin:3rem auto;background:#fff;padding:2rem;border-radius:8px;
box-shadow:0 1px 4px rgba(0,0,0,.12)}
.kz-to{margin:0;font-size:.9rem;color:#555}
#destination-origin{font:600 1.35rem ui-monospace,monospace;margin:.2rem 0 1rem;
word-break:break-all;padding:.6rem .8rem;border:2px solid #1d5fd6;border-radius:6px}
label{display:block;margin:.9rem 0 .3rem;font-weight:600}
input[type=password],input[type=text]{width:100%;box-sizing:border-box;padding:.5rem;
font:inherit}
button{margin-top:1.2rem;padding:.55rem 1rem;font:inherit;font-weight:600}
.kz-note{color:#555;font-size:.85rem}.kz-error{color:#a4161a;font-weight:600}
code{font:600 1rem ui-monospace,monospace;background:#eef2fb;padding:.15rem .35rem}
"""


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width\">"
            f"<meta name=\"referrer\" content=\"same-origin\">"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
            f"<body><main>{body}</main></body></html>")


_FIELD_LABELS = {"value": "Credential", "username": "User name", "password": "Password",
                 "certificate": "Client certificate (PEM)",
                 "private_key": "Private key (PEM)",
                 "passphrase": "Private key passphrase (only if the key is encrypted)"}


class CredentialFormPage(JupyterHandler):
    """The signed form: destination origin first (R-388), the value posted straight back."""

    auth_resource = AUTH_RESOURCE

    @property
    def kaizen(self) -> KaizenContext:
        ctx: KaizenContext = self.settings["kaizen"]
        return ctx

    async def prepare(self) -> None:  # type: ignore[override]
        await super().prepare()
        # Neither the page nor its answer is cached or sends its URL (the token) to another
        # origin. Not "no-referrer": under it a browser sends "Origin: null" with the form's
        # own POST, which the Jupyter server refuses as cross-origin for a cookie session.
        self.set_header("Cache-Control", "no-store")
        self.set_header("Referrer-Policy", "same-origin")
        self.set_header("X-Content-Type-Options", "nosniff")
        user = self.current_user
        if user is None:
            return  # web.authenticated answers (a redirect to log in)
        await admit_member(self, self.kaizen, user,
                           "read" if self.request.method == "GET" else "write")

    @property
    def member(self) -> str:
        name: str = self.current_user.username
        return name

    @web.authenticated
    async def get(self, token: str) -> None:
        try:
            form = await _service(self.kaizen).forms.open(self.member, token)
        except FormRefused as exc:
            self._refusal(exc)
            return
        self._form(form)

    @web.authenticated
    async def post(self, token: str) -> None:
        fields = {name: self.get_body_argument(name, "", strip=False)
                  for name in ("value", "username", "password", "certificate",
                               "private_key", "passphrase")}
        remember = self.get_body_argument("remember", "") == "yes"
        try:
            submitted = await _service(self.kaizen).forms.submit(
                self.member, token, fields, remember=remember)
        except MemberError as exc:
            self._refusal(exc)
            return
        finally:
            fields.clear()
        origin = html.escape(submitted.destination.origin)
        if submitted.resumed is not None:
            # The paused call takes it now; the reference is nobody's business here.
            self.finish(_page("Credential sent", (
                f"<p class=\"kz-to\">Sent for</p><h1 id=\"destination-origin\">{origin}</h1>"
                "<p id=\"kz-saved\" data-resumed=\"yes\">Your credential was received. The "
                "call it was asked for continues now and uses it once; it is not stored.</p>"
                "<p class=\"kz-note\">You can close this page.</p>")))
            return
        kept = ("It is kept, sealed, until you delete it." if submitted.retention == "remember"
                else "It will be used for one request and then forgotten; it is not stored.")
        self.finish(_page("Credential saved", (
            f"<p class=\"kz-to\">Saved for</p><h1 id=\"destination-origin\">{origin}</h1>"
            f"<p id=\"kz-saved\">Your credential was received. {kept}</p>"
            f"<p>Give Kaizen this reference (it is not the credential): "
            f"<code id=\"kz-credential-ref\">{html.escape(submitted.credential_ref)}</code></p>"
            "<p class=\"kz-note\">You can close this page.</p>")))

    def _form(self, form: OpenForm) -> None:
        destination = form.destination
        origin = html.escape(destination.origin)
        scheme = destination.scheme
        inputs = "".join(
            f"<label for=\"kz-{name}\">{_FIELD_LABELS[name]}</label>"
            f"<input id=\"kz-{name}\" name=\"{name}\" "
            f"type=\"{'text' if name == 'username' else 'password'}\" "
            f"{'' if scheme.optional(name) else 'required '}"
            "autocomplete=\"off\" spellcheck=\"false\">"
            for name in scheme.fields())
        remember = ("<label><input type=\"checkbox\" name=\"remember\" value=\"yes\" "
                    "id=\"kz-remember\"> Remember it for later requests (stored sealed; "
                    "delete it any time)</label>") if form.remember_offered else ""
        expires = datetime.fromtimestamp(form.expires_at, UTC).strftime("%H:%M:%S UTC")
        label = html.escape(str(form.plan.get("label") or destination.label or destination.id))
        call = form.call
        bound = (f"<p id=\"kz-call\">For one call only: <code>{html.escape(call.tool)}</code> "
                 f"({html.escape(call.effect)}), with the arguments the assistant asked "
                 "for.</p>") if call is not None else ""
        self.finish(_page(f"Credential for {destination.origin}", (
            "<p class=\"kz-to\">This credential will be sent only to</p>"
            f"<h1 id=\"destination-origin\">{origin}</h1>"
            f"<p>{label}: {html.escape(destination.scheme.describe())}. The assistant never "
            f"sees what you enter here; it gets an opaque reference.</p>{bound}"
            "<form method=\"post\" autocomplete=\"off\" id=\"kz-credential-form\">"
            f"{self.xsrf_form_html()}{inputs}{remember}"
            f"<button type=\"submit\">Send to {origin}</button></form>"
            f"<p class=\"kz-note\">This form works once and expires at {expires}.</p>")))

    def _refusal(self, exc: MemberError) -> None:
        self.set_status(exc.status)
        self.finish(_page("Credential form unavailable", (
            f"<p class=\"kz-error\" id=\"kz-refused\" data-code=\"{html.escape(exc.code)}\">"
            f"{html.escape(exc.message)}</p><p class=\"kz-note\">Nothing was stored.</p>")))


def credential_routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    return [
        (rf"{prefix}/credentials", CredentialsHandler),
        (rf"{prefix}/credentials/destinations", CredentialDestinationsHandler),
        (rf"{prefix}/credentials/forms", CredentialFormsHandler),
        (rf"{prefix}/credentials/receipts", CredentialReceiptsHandler),
        (rf"{prefix}/credentials/requests", CredentialRequestsHandler),
        (rf"{prefix}/credentials/requests/({ID})/cancel", CredentialRequestCancelHandler),
        (rf"{prefix}/credentials/({REF})", CredentialHandler),
        (rf"/{FORM_PATH}/({TOKEN})", CredentialFormPage),
    ]


_ERROR_TEXT = {401: "Not authenticated", 400: "Malformed body",
               403: "The destination is disabled or denied to you",
               404: "No such destination or credential of yours (call_unknown: the "
                    "destination has no such operation for you)",
               422: "The body does not match the schema (call_arguments_invalid: the call's "
                    "arguments do not fit its operation)"}


def credentials_openapi() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) for ``api/openapi.py`` (only when credentials are on)."""
    credential_ref = ref("CredentialRef")
    destination = ref("CredentialDestination")
    string = {"type": "string"}
    nullable = {"type": ["string", "null"]}
    when = {"type": "string", "format": "date-time"}
    paths = {
        "/kaizen/api/credentials/destinations": {"get": operation(
            "Where the caller may enter a credential now (enabled, allowed by admin policy)",
            "listCredentialDestinations",
            {**answer("Destinations", {"type": "array", "items": destination}),
             **error_answers(_ERROR_TEXT)})},
        "/kaizen/api/credentials/forms": {"post": operation(
            "Issue a signed, five-minute, one-shot credential form for one destination. The "
            "member opens form_url in their browser; the value never passes through this API",
            "issueCredentialForm",
            {**answer("The form", ref("CredentialForm"), 201),
             **error_answers(_ERROR_TEXT, 400, 403, 404, 422)},
            body_schema="CredentialFormRequest")},
        "/kaizen/api/credentials": {"get": operation(
            "The caller's credential references: identity only, never a value (no route "
            "reads one back)", "listCredentials",
            {**answer("References", {
                "type": "object", "required": ["remembered", "once"],
                "properties": {"remembered": {"type": "array", "items": credential_ref},
                               "once": {"type": "array", "items": credential_ref}}}),
             **error_answers(_ERROR_TEXT)})},
        "/kaizen/api/credentials/{credential_ref}": {"delete": operation(
            "Forget one of the caller's credentials", "forgetCredential",
            {**answer("Forgotten", {"type": "object", "required": ["forgotten"],
                                    "properties": {"forgotten": credential_ref}}),
             **error_answers(_ERROR_TEXT, 404)},
            params=[path_param("credential_ref", {"type": "string",
                                                  "pattern": f"^{REF}$"})])},
        "/kaizen/api/credentials/requests": {"get": operation(
            "The caller's tool calls paused for a credential: identity and status, never a "
            "value or reference. The form of a pending one is in its credential.requested "
            "event", "listCredentialRequests",
            {**answer("Paused calls", {"type": "array", "items": ref("CredentialRequest")}),
             **error_answers(_ERROR_TEXT)},
            params=[{"name": "status", "in": "query", "required": False,
                     "schema": {"enum": list(CREDENTIAL_REQUEST_STATUSES)}}])},
        "/kaizen/api/credentials/requests/{request_id}/cancel": {"post": operation(
            "Decline to enter the credential a paused call asks for: the call settles as "
            "refused (nothing sent) and the turn goes on; its form is refused from now on",
            "cancelCredentialRequest",
            {**answer("Cancelled", ref("CredentialRequest")),
             **error_answers({**_ERROR_TEXT, 409: "The request is no longer waiting"},
                             404, 409)},
            params=[path_param("request_id")])},
        "/kaizen/api/credentials/receipts": {"get": operation(
            "The caller's credential receipts: which nonce or request was claimed and how it "
            "ended; no value, argument, body or result", "listCredentialReceipts",
            {**answer("Receipts", {"type": "array", "items": ref("CredentialReceipt")}),
             **error_answers(_ERROR_TEXT)})},
    }
    components = {
        "CredentialFormRequest": {
            "type": "object", "additionalProperties": False, "required": ["destination"],
            "properties": {"destination": {"type": "string", "minLength": 1,
                                           "maxLength": 120},
                           "label": {"type": "string", "maxLength": 200},
                           "call": {
                               "description": "Bind the form to this one call of an "
                                              "External OpenAPI operation (its tool name and "
                                              "arguments); absent: a form for the destination",
                               "type": "object", "additionalProperties": False,
                               "required": ["tool"],
                               "properties": {
                                   "tool": {"type": "string", "minLength": 1,
                                            "maxLength": 64},
                                   "arguments": {"type": "object"}}}}},
        "CredentialForm": {
            "type": "object",
            "required": ["form_url", "expires_at", "destination", "remember_offered"],
            "properties": {"form_url": string, "expires_at": when, "destination": destination,
                           "remember_offered": {"type": "boolean"},
                           "call": ref("CredentialFormCall")}},
        "CredentialFormCall": {
            "description": "The one call a form is bound to: identity and digests, never the "
                           "arguments",
            "type": "object",
            "required": ["tool", "source", "operation", "effect", "schema_digest",
                         "arguments_digest"],
            "properties": {"tool": string, "source": string, "operation": string,
                           "effect": {"enum": ["read", "write", "sensitive"]},
                           "schema_digest": string, "arguments_digest": string,
                           "request_id": {"type": "string", "description": (
                               "A paused call's form: the request it resumes")},
                           "approval_id": {"type": "string", "description": (
                               "A paused call's form: the approval that call consumed "
                               "before it paused")}}},
        "CredentialRequest": {
            "description": "A tool call paused for a credential form (docs/credentials.md)",
            "type": "object",
            "required": ["id", "run_id", "conversation_id", "call_id", "tool", "destination",
                         "origin", "effect", "approval_id", "status", "expires_at",
                         "created_at", "settled_at"],
            "properties": {"id": string, "run_id": string, "conversation_id": string,
                           "call_id": string, "tool": string, "destination": string,
                           "origin": string,
                           "effect": {"enum": ["read", "write", "sensitive"]},
                           "approval_id": nullable,
                           "status": {"enum": list(CREDENTIAL_REQUEST_STATUSES)},
                           "expires_at": when, "created_at": when,
                           "settled_at": {"type": ["string", "null"], "format": "date-time"}}},
        "CredentialRequestedData": {
            "description": "data of a credential.requested event: a tool call paused until "
                           "its member enters a credential on the signed form at form_path "
                           "(relative to the server's base URL; the form shows origin "
                           "first). No value, and no reference, is ever in an event",
            "type": "object",
            "required": ["request_id", "call_id", "tool", "destination", "origin", "scheme",
                         "effect", "approval_id", "form_path", "expires_at"],
            "properties": {"request_id": string, "call_id": string, "tool": string,
                           "destination": string, "origin": string, "scheme": string,
                           "effect": {"enum": ["read", "write", "sensitive"]},
                           "approval_id": {"type": ["string", "null"], "description": (
                               "The approval the call consumed before it paused (null when "
                               "none authorized it); the form is bound to it")},
                           "form_path": {"type": "string",
                                         "pattern": f"^{FORM_PATH}/{TOKEN}$"},
                           "expires_at": when}},
        "CredentialSettledData": {
            "description": "data of a credential.settled event: how a paused call's wait "
                           "ended. submitted: the call goes on with the value once; "
                           "cancelled or expired: it settles as refused and the turn goes on",
            "type": "object",
            "required": ["request_id", "call_id", "tool", "origin", "status"],
            "properties": {"request_id": string, "call_id": string, "tool": string,
                           "origin": string,
                           "status": {"enum": ["submitted", "cancelled", "expired"]}}},
        "CredentialDestination": {
            "type": "object", "required": ["id", "origin", "label", "scheme", "enabled"],
            "properties": {"id": string, "origin": string, "label": string,
                           "enabled": {"type": "boolean"}, "provider": string,
                           "scheme": {"type": "object", "required": ["kind"], "properties": {
                               "kind": {"enum": ["bearer", "header", "basic", "cookie",
                                                 "query", "mtls"]},
                               "name": nullable}},
                           "fields": {
                               "description": "The fields the form asks for, without any "
                                              "value (a passphrase only for an encrypted "
                                              "private key)",
                               "type": "array", "items": {
                                   "type": "object", "required": ["name", "required"],
                                   "properties": {
                                       "name": {"enum": ["value", "username", "password",
                                                         "certificate", "private_key",
                                                         "passphrase"]},
                                       "required": {"type": "boolean"}}}}}},
        "CredentialRef": {
            "type": "object",
            "required": ["credential_ref", "destination", "origin", "retention"],
            "properties": {"credential_ref": {"type": "string", "pattern": f"^{REF}$"},
                           "destination": string, "origin": string, "scheme": string,
                           "label": string, "retention": {"enum": ["once", "remember"]},
                           "created_at": when, "call": ref("CredentialFormCall")}},
        "CredentialReceipt": {
            "type": "object",
            "required": ["id", "kind", "destination", "origin", "status", "claimed_at"],
            "properties": {"id": string, "kind": {"enum": ["form", "request"]},
                           "destination": string, "origin": string,
                           "credential_ref": nullable,
                           "retention": {"enum": ["once", "remember", None]},
                           "operation": nullable, "effect": nullable, "run_id": nullable,
                           "status": {"enum": ["claimed", "stored", "succeeded", "failed",
                                               "ambiguous"]},
                           "claimed_at": when,
                           "settled_at": {"type": ["string", "null"], "format": "date-time"}}},
    }
    return paths, components
