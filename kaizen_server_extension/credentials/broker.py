"""The credential broker: the one place a credential value is held, and the only thing that
turns an opaque reference into one bounded request.

Spec: "Credential-backed tools receive an opaque broker handle; only the registered broker
adapter may turn it into a bounded operation, and no credential value returns to Kaizen or
the model loop" (R-443). So:

* the model, the journal and the tool see a ``credential_ref`` (``cref_…``) and nothing else
  (R-350, R-386); the pipeline swaps it for a :class:`BrokerHandle` just before execution;
* a handle sends **exactly one** request, to its destination's origin only, with the value
  injected by the broker (never a redirect, never a retry), after its credential-free receipt
  was claimed durably (R-391, R-397). The tool gets a :class:`BrokeredResponse` with no
  request attached and the submitted value scrubbed from the body in its plain, URL, JSON,
  Base64 and Basic encodings (R-396) — the echo guard; the pipeline scrubs the whole result
  with the same handle again;
* a use-once credential lives in this process's memory only and is spent by the first
  request that claims it, whatever that request's outcome (a failed attempt needs re-entry,
  R-393); a remembered one is sealed in the database (``credentials/crypto.py``) and opened
  per request;
* a request whose delivery is uncertain (the connection broke or timed out after it was sent)
  is *ambiguous* for a write or sensitive call: its receipt says so and the call raises
  :class:`AmbiguousDelivery`, which the pipeline settles as an unknown outcome that closes the
  turn and is never retried. A read's transport failure is a bounded, repairable error
  (R-399).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote, quote_plus

import httpx

from kaizen_server_extension.credentials.call_binding import CallBinding, CallIdentity
from kaizen_server_extension.credentials.crypto import SealBroken, Vault
from kaizen_server_extension.credentials.destinations import Destination, StaticDestinations
from kaizen_server_extension.credentials.destinations import origin_of as _origin_of
from kaizen_server_extension.policy.credential_arguments import CREDENTIAL_REF_RE
from kaizen_server_extension.policy.redaction import REDACTED
from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.store.core import utcnow
from kaizen_server_extension.store.credentials import (
    CredentialRecords,
    NonceSpent,
    SealedCredential,
)
from kaizen_server_extension.tools.mtls import (
    CERTIFICATE_LABELS,
    KEY_LABELS,
    ClientCertificate,
    load_client_certificate,
    pem_blocks,
)

log = logging.getLogger("kaizen.credentials")
T = TypeVar("T")

#: A use-once credential not used within this long is dropped.
ONCE_TTL_S = 300.0
#: Use-once credentials one member may hold at a time; entering another drops the oldest.
MAX_ONCE_PER_MEMBER = 16
#: The body a brokered response may carry back to the tool.
MAX_RESPONSE_BYTES = 1024 * 1024
DEFAULT_TIMEOUT_S = 30.0
#: Response headers that never reach a tool: they set or echo credentials.
_WITHHELD_RESPONSE_HEADERS = frozenset({"set-cookie", "set-cookie2", "authorization",
                                        "proxy-authenticate", "www-authenticate"})
#: Connection failures that prove nothing was sent.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout,
             httpx.UnsupportedProtocol, httpx.InvalidURL, httpx.LocalProtocolError)

#: ``async (member, destination) -> refusal code or None``: the live admin policy.
PolicyCheck = Callable[[str, Destination], Awaitable[str | None]]


class CredentialRefused(MemberSafeError):
    """The reference cannot be used here: nothing was sent (the model can repair it)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message, code=code, domain="caller")


class CredentialRequestFailed(MemberSafeError):
    """The brokered request failed definitely (nothing sent, or a read that broke)."""


class AmbiguousDelivery(Exception):
    """A write's request may have reached its destination; whether it took effect is unknown."""


def new_ref() -> str:
    return "cref_" + secrets.token_urlsafe(24)


@dataclass(slots=True)
class _Held:
    """A credential as the broker holds it for one use: the value never leaves this object
    except into the request it builds."""

    ref: str
    member: str
    destination: str
    origin: str
    retention: str
    secret: dict[str, str] = field(repr=False)
    #: The one call a form bound this credential to (R-387), or None.
    binding: CallBinding | None = None

    def variants(self) -> list[str]:
        """Every form the value may come back in (the echo guard, R-396)."""
        values = [v for v in self.secret.values() if len(v) >= 4]
        for name in ("certificate", "private_key"):
            # PEM comes back line by line too (the certificate-line encoding).
            values.extend(_pem_lines(self.secret.get(name, "")))
        if "username" in self.secret and "password" in self.secret:
            pair = f"{self.secret['username']}:{self.secret['password']}"
            values.append(pair)
            values.append(base64.b64encode(pair.encode()).decode())
        out: set[str] = set()
        for v in values:
            raw = v.encode()
            out.update({v, quote(v, safe=""), quote_plus(v), json.dumps(v)[1:-1],
                        base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode(),
                        base64.b64encode(raw).decode().rstrip("=")})
        return sorted((o for o in out if len(o) >= 4), key=len, reverse=True)


def _pem_lines(text: str) -> list[str]:
    """The base64 lines of the PEM blocks in ``text`` (canonical 64-character lines), and each
    block's whole base64 body."""
    if "-----BEGIN " not in text:
        return []
    try:
        canonical = pem_blocks(text, CERTIFICATE_LABELS | KEY_LABELS)
    except MemberSafeError:
        return []
    lines = [line for line in canonical.splitlines() if line and not line.startswith("-----")]
    bodies = "".join(lines)
    return [line for line in lines if len(line) >= 16] + ([bodies] if bodies else [])


@dataclass(frozen=True, slots=True)
class BrokeredResponse:
    """What a tool gets back: status, safe headers and the scrubbed body; no request."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes
    truncated: bool = False

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


class BrokerHandle:
    """An opaque, single-request capability for one credential at one destination.

    It carries no value a tool can read: ``repr`` names the reference only, it cannot be
    pickled or copied, and its one operation is :meth:`send`."""

    __slots__ = ("_broker", "_destination", "_effect", "_held", "_operation", "_run_id",
                 "_used", "_variants")

    def __init__(self, broker: CredentialBroker, held: _Held, destination: Destination, *,
                 operation: str, effect: str, run_id: str | None) -> None:
        self._broker = broker
        self._held = held
        self._destination = destination
        self._operation = operation
        self._effect = effect
        self._run_id = run_id
        self._used = False
        # What the echo guard looks for, kept until the call's result was scrubbed (close).
        self._variants = held.variants()

    def __repr__(self) -> str:
        return f"BrokerHandle({self._held.ref}, destination={self._destination.id})"

    def __reduce__(self) -> Any:
        raise TypeError("a broker handle cannot be serialized")

    def __copy__(self) -> Any:
        raise TypeError("a broker handle cannot be copied")

    def __deepcopy__(self, memo: Any) -> Any:
        raise TypeError("a broker handle cannot be copied")

    @property
    def credential_ref(self) -> str:
        return self._held.ref

    @property
    def origin(self) -> str:
        return self._destination.origin

    async def send(self, method: str, url: str, *, params: Mapping[str, Any] | None = None,
                   json_body: Any = None, content: bytes | None = None,
                   headers: Mapping[str, str] | None = None,
                   client: httpx.AsyncClient | None = None,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> BrokeredResponse:
        """Send the one request this handle allows (see the module docstring)."""
        if self._used:
            raise CredentialRefused("This credential was already used for a request in this "
                                    "call; a call sends one request.", "credential_spent")
        self._used = True
        return await self._broker._send(self._held, self._destination, method, url,
                                        params=params, json_body=json_body, content=content,
                                        headers=headers, client=client, timeout_s=timeout_s,
                                        operation=self._operation, effect=self._effect,
                                        run_id=self._run_id)

    async def attach(self, target_origin: str,
                     perform: Callable[[Injector], Awaitable[T]]) -> T:
        """The seam for a source with its own HTTP client (an External OpenAPI source's
        egress): ``perform`` gets an :class:`Injector` to apply to the one request it sends
        to ``target_origin``. The same checks, receipt and ambiguity rules as :meth:`send`;
        ``perform``'s exception propagates as it is (one with ``sent = False`` proves nothing
        was delivered). Its result is the caller's to scrub (the pipeline scrubs the tool's
        whole result with this handle)."""
        if self._used:
            raise CredentialRefused("This credential was already used for a request in this "
                                    "call; a call sends one request.", "credential_spent")
        self._used = True
        try:
            return await self._broker._attach(
                self._held, self._destination, target_origin, perform,
                operation=self._operation, effect=self._effect, run_id=self._run_id)
        finally:
            self._held.secret = {}

    def scrub(self, value: object) -> object:
        """``value`` with every form of this handle's credential replaced (R-396)."""
        return scrub(value, self._variants)

    def close(self) -> None:
        self._held.secret = {}
        self._variants = []


def scrub(value: object, variants: list[str], _depth: int = 0) -> object:
    if not variants or _depth > 64:
        return value
    if isinstance(value, str):
        for v in variants:
            value = value.replace(v, REDACTED)
        return value
    if isinstance(value, bytes | bytearray):
        out = bytes(value)
        for v in variants:
            out = out.replace(v.encode(), REDACTED.encode())
        return out
    if isinstance(value, Mapping):
        return {scrub(k, variants, _depth + 1): scrub(v, variants, _depth + 1)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v, variants, _depth + 1) for v in value]
    return value


class CredentialBroker:
    """Holds use-once credentials, opens remembered ones, and sends brokered requests."""

    def __init__(self, records: CredentialRecords, vault: Vault,
                 destinations: StaticDestinations, policy: PolicyCheck, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._records = records
        self._vault = vault
        self.destinations = destinations
        self._policy = policy
        self._clock = clock
        self._once: dict[str, tuple[float, _Held]] = {}

    def __repr__(self) -> str:
        return "CredentialBroker(<values withheld>)"

    # --- policy -------------------------------------------------------------------------------

    async def refusal(self, member: str, destination: Destination | None) -> str | None:
        """Why ``member`` may not use ``destination`` now (live), else None."""
        if destination is None:
            return "destination_unknown"
        if not destination.enabled:
            return "destination_disabled"
        # The declaring source's own rules first (a source module's destination), then the
        # admin policy of the destination itself.
        declared = await self.destinations.provider_refusal(member, destination)
        if declared is not None:
            return declared
        return await self._policy(member, destination)

    # --- accepting a value (the form's submission) ------------------------------------------

    def hold_once(self, member: str, destination: Destination, secret: Mapping[str, str], *,
                  binding: CallBinding | None = None) -> str:
        """Keep ``secret`` in memory for one request (of the call ``binding`` names, when
        the form was for one call); its new reference."""
        self._expire()
        held = [r for r, (_, h) in self._once.items() if h.member == member]
        for old in held[:max(0, len(held) - MAX_ONCE_PER_MEMBER + 1)]:
            self._once.pop(old, None)  # insertion order: the oldest first
        ref = new_ref()
        self._once[ref] = (self._clock() + ONCE_TTL_S, _Held(
            ref, member, destination.id, destination.origin, "once", dict(secret), binding))
        return ref

    def seal(self, member: str, destination: Destination, secret: Mapping[str, str],
             label: str) -> SealedCredential:
        """The sealed row of a credential the member chose to remember (not yet stored)."""
        ref = new_ref()
        identity = {"ref": ref, "member": member, "destination": destination.id,
                    "origin": destination.origin, "scheme": destination.scheme.kind}
        return SealedCredential(ref, member, destination.id, destination.origin,
                                destination.scheme.kind, label,
                                self._vault.seal(secret, identity), utcnow())

    def drop_once(self, ref: str) -> None:
        self._once.pop(ref, None)

    def pending_once(self, member: str) -> list[dict[str, Any]]:
        """The member's unspent use-once references (identity only)."""
        self._expire()
        return [{"credential_ref": held.ref, "destination": held.destination,
                 "origin": held.origin, "retention": "once",
                 **({"call": held.binding.public()} if held.binding is not None else {})}
                for _, held in self._once.values() if held.member == member]

    def _expire(self) -> None:
        now = self._clock()
        for ref in [r for r, (until, _) in self._once.items() if until <= now]:
            self._once.pop(ref, None)

    # --- resolving a reference ------------------------------------------------------------------

    async def handle(self, member: str, ref: object, destination_id: str, *,
                     operation: str, effect: str, run_id: str | None = None,
                     call: CallIdentity | None = None) -> BrokerHandle:
        """A handle for ``ref`` at ``destination_id`` as ``member``, or :class:`CredentialRefused`
        (unknown, another member's, another destination's, spent, entered for another call,
        or the destination is no longer allowed). Nothing is sent here."""
        destination = await self.destinations.lookup(destination_id, member)
        refused = await self.refusal(member, destination)
        if refused is not None or destination is None:
            raise CredentialRefused(
                f"Credentials for {destination_id} are not available to you now, so the "
                "call was not run.", refused or "destination_unknown")
        if not isinstance(ref, str) or not CREDENTIAL_REF_RE.fullmatch(ref):
            raise CredentialRefused(
                f"This call needs a credential_ref for {destination.origin}. Ask the member "
                "to enter a credential for it (Kaizen credential form) and pass the reference "
                "they give you; never a credential itself.", "credential_required")
        held = await self._resolve(member, ref, destination)
        if held.binding is not None:
            differs = held.binding.mismatch(call)
            if differs is not None:
                # Not spent: the call it was entered for may still use it.
                held.secret = {}
                raise CredentialRefused(
                    f"That credential_ref was entered for one call ({held.binding.tool} with "
                    f"the arguments shown on its form) and this call differs in its {differs}, "
                    "so it was not run. Make that exact call, or ask the member for a new "
                    "form for this one.", "credential_bound_elsewhere")
        return BrokerHandle(self, held, destination, operation=operation, effect=effect,
                            run_id=run_id)

    async def listing_handle(self, member: str, destination_id: str, *,
                             operation: str) -> BrokerHandle | None:
        """A read handle on ``member``'s newest remembered credential for ``destination_id``
        (listing an MCP server's tools, docs/mcp.md), when the live policy allows it; None
        otherwise. A use-once value is never taken: it is kept for the call it was entered
        for."""
        destination = await self.destinations.lookup(destination_id, member)
        if destination is None or await self.refusal(member, destination) is not None:
            return None
        remembered = [s for s in await self._records.remembered_by(member)
                      if s.destination == destination.id and s.origin == destination.origin
                      and s.scheme == destination.scheme.kind]
        for sealed in reversed(remembered):  # newest first
            try:
                held = await self._resolve(member, sealed.ref, destination)
            except CredentialRefused:
                continue  # sealed under another key: an older one may still open
            return BrokerHandle(self, held, destination, operation=operation, effect="read",
                                run_id=None)
        return None

    async def _resolve(self, member: str, ref: str, destination: Destination) -> _Held:
        unusable = CredentialRefused(
            f"That credential_ref cannot be used for {destination.origin}: it is unknown, "
            "spent, expired or not for this destination. Ask the member to enter the "
            "credential again.", "credential_unusable")
        self._expire()
        once = self._once.get(ref)
        if once is not None:
            held = once[1]
            if held.member != member or held.destination != destination.id \
                    or held.origin != destination.origin:
                raise unusable
            return _Held(held.ref, held.member, held.destination, held.origin, "once",
                         dict(held.secret), held.binding)
        sealed = await self._records.sealed(ref)
        if sealed is None or sealed.member != member or sealed.destination != destination.id \
                or sealed.origin != destination.origin \
                or sealed.scheme != destination.scheme.kind:
            raise unusable
        try:
            secret = self._vault.open(sealed.sealed, sealed.identity())
        except SealBroken:
            log.warning("remembered credential %s did not open (another key?); refused", ref)
            raise unusable from None
        return _Held(ref, member, destination.id, destination.origin, "remember", secret)

    # --- the one request --------------------------------------------------------------------------

    async def _attach(self, held: _Held, destination: Destination, target_origin: str,
                      perform: Callable[[Injector], Awaitable[T]], *, operation: str,
                      effect: str, run_id: str | None) -> T:
        """Run ``perform`` with an :class:`Injector` for exactly one request to
        ``target_origin``: refused unless it is the destination's origin and the live policy
        still allows it; the receipt is claimed before ``perform`` starts and settled with
        how it ended. ``perform``'s own exception propagates unchanged."""
        if target_origin != destination.origin:
            raise CredentialRefused(
                f"A credential for {destination.origin} is only sent there; this request "
                "was not sent.", "destination_mismatch")
        # Policy again at the instant of use: a revocation since the handle was made holds.
        current = await self.destinations.lookup(destination.id, held.member)
        if current is not None and current.fingerprint() != destination.fingerprint():
            current = None  # changed since the handle was made: not the same destination
        refused = await self.refusal(held.member, current)
        if refused is not None:
            raise CredentialRefused("Credentials for this destination were withdrawn, so the "
                                    "request was not sent.", refused)
        # The durable, credential-free receipt before any network I/O; for a use-once value
        # its nonce is the reference, so a second spend fails in the database too.
        nonce = (f"once:{held.ref}" if held.retention == "once"
                 else f"request:{secrets.token_urlsafe(18)}")
        try:
            receipt = await self._records.claim(
                nonce=nonce, kind="request", member=held.member, destination=destination.id,
                origin=destination.origin, operation=operation[:200], effect=effect,
                run_id=run_id, credential_ref=held.ref, retention=held.retention)
        except NonceSpent:
            raise CredentialRefused("That credential was already used once; ask the member "
                                    "to enter it again.", "credential_spent") from None
        finally:
            if held.retention == "once":
                self.drop_once(held.ref)  # spent whatever happens next
        injector = Injector(destination, held.secret)
        status = "failed"
        try:
            result = await perform(injector)
            status = "succeeded"  # the destination answered, whatever it answered
            return result
        except BaseException as exc:
            status = delivery_status(exc, effect)
            raise
        finally:
            injector.clear()
            held.secret = {}
            # Shielded: a cancelled call still settles its receipt.
            await asyncio.shield(self._records.settle(receipt, status))

    async def _send(self, held: _Held, destination: Destination,
                    method: str, url: str, *, params: Mapping[str, Any] | None, json_body: Any,
                    content: bytes | None, headers: Mapping[str, str] | None,
                    client: httpx.AsyncClient | None, timeout_s: float, operation: str,
                    effect: str, run_id: str | None) -> BrokeredResponse:
        try:
            target = _origin_of(str(httpx.URL(url).copy_with(path="/", query=None,
                                                               fragment=None)))
        except Exception:
            target = ""
        variants = held.variants()

        async def perform(injector: Injector) -> tuple[httpx.Response, bytes, bool]:
            material = injector.client_certificate()
            if material is not None and client is not None:
                # The certificate rides on this request's own connection only: a client the
                # tool brought has its own TLS context, which must not be given the key.
                raise CredentialRefused("A client certificate is sent only on a connection "
                                        "of its own; this request was not sent.",
                                        "mtls_own_connection")
            request_headers = dict(headers or {})
            request_params = dict(params or {})
            injector.apply(request_headers)
            injector.apply_query(request_params)
            own = client is None
            http = client or httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(
                    retries=0, verify=_tls_context(destination, material)),
                trust_env=False, timeout=timeout_s)
            try:
                request = http.build_request(method, url, params=request_params or None,
                                             json=json_body, content=content,
                                             headers=request_headers, timeout=timeout_s)
                try:
                    response = await http.send(request, follow_redirects=False)
                    body, truncated = await _bounded_body(response)
                except _NOT_SENT as exc:
                    raise CredentialRequestFailed(
                        f"{destination.origin} could not be reached ({type(exc).__name__}); "
                        "nothing was sent.", code="destination_unreachable") from None
                except httpx.TransportError as exc:
                    if effect == "read":
                        raise CredentialRequestFailed(
                            f"The request to {destination.origin} failed "
                            f"({type(exc).__name__}).", code="request_failed") from None
                    raise AmbiguousDelivery(
                        f"the request to {destination.origin} broke off after it was sent "
                        f"({type(exc).__name__})") from None
                return response, body, truncated
            finally:
                if own:
                    await http.aclose()

        response, data, truncated = await self._attach(
            held, destination, target, perform, operation=operation, effect=effect,
            run_id=run_id)
        safe_headers = {k: v for k, v in response.headers.items()
                        if k.lower() not in _WITHHELD_RESPONSE_HEADERS}
        scrubbed = scrub(data, variants)
        assert isinstance(scrubbed, bytes)
        safe = scrub(safe_headers, variants)
        assert isinstance(safe, dict)
        return BrokeredResponse(response.status_code, safe, scrubbed, truncated)


def _tls_context(destination: Destination,
                 material: ClientCertificate | None) -> ssl.SSLContext | bool:
    """How a request the broker sends itself verifies TLS: against the destination's CA
    bundle when the administrator named one (else httpx's default trust), presenting a
    mutual-TLS destination's client certificate, loaded through /dev/shm only (R-392). A
    fresh context per request, so a certificate is never on a connection another request
    could reuse."""
    if not destination.ca_file and material is None:
        return True
    context = (ssl.create_default_context(cafile=destination.ca_file) if destination.ca_file
               else httpx.create_ssl_context())
    if material is not None:
        load_client_certificate(context, material)
    return context


def delivery_status(exc: BaseException, effect: str) -> str:
    """How a request that raised ended, for its receipt: ``failed`` when it provably was not
    delivered (a member-safe refusal, which vouches that nothing was committed, or an error
    saying ``sent = False``) or was a read; ``ambiguous`` for a write or sensitive request
    that may have reached its destination (R-399)."""
    if isinstance(exc, MemberSafeError) or getattr(exc, "sent", None) is False:
        return "failed"
    return "failed" if effect == "read" else "ambiguous"


class Injector:
    """What the broker adds to the one request it allows: the credential, where the
    destination's scheme says (``apply`` for headers, ``apply_query`` for a query scheme).
    It is the seam a source's own HTTP client calls (``tools/egress.py: RequestCredential``);
    any same-named header a caller set is replaced, never merged. Cleared after the request."""

    __slots__ = ("_destination", "_secret")

    def __init__(self, destination: Destination, secret: Mapping[str, str]) -> None:
        self._destination = destination
        self._secret = dict(secret)

    def __repr__(self) -> str:
        return f"Injector(<withheld>, destination={self._destination.id})"

    def __reduce__(self) -> Any:
        raise TypeError("an injector cannot be serialized")

    def apply(self, headers: MutableMapping[str, str]) -> None:
        scheme = self._destination.scheme
        secret = self._secret
        if not secret:
            raise CredentialRefused("This credential was already used.", "credential_spent")
        for name in [h for h in headers if h.lower() in ("authorization", "cookie",
                                                         scheme.name.lower())]:
            del headers[name]
        if scheme.kind == "bearer":
            headers["Authorization"] = f"Bearer {secret['value']}"
        elif scheme.kind == "basic":
            pair = f"{secret['username']}:{secret['password']}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        elif scheme.kind == "header":
            headers[scheme.name] = secret["value"]
        elif scheme.kind == "cookie":
            headers["Cookie"] = f"{scheme.name}={secret['value']}"

    def apply_query(self, params: MutableMapping[str, Any]) -> None:
        if self._destination.scheme.kind == "query" and self._secret:
            params[self._destination.scheme.name] = self._secret["value"]

    def client_certificate(self) -> ClientCertificate | None:
        """The client certificate a mutual-TLS destination presents on the request's own
        connection (``tools/egress.py`` loads it through /dev/shm only, R-392); None for
        every other scheme."""
        if self._destination.scheme.kind != "mtls":
            return None
        if not self._secret:
            raise CredentialRefused("This credential was already used.", "credential_spent")
        return ClientCertificate.from_fields(self._secret["certificate"],
                                             self._secret["private_key"],
                                             self._secret.get("passphrase", ""))

    def clear(self) -> None:
        self._secret = {}


async def _bounded_body(response: httpx.Response) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            await response.aclose()
            return b"".join(chunks)[:MAX_RESPONSE_BYTES], True
    return b"".join(chunks), False


def live_policy(allowed: Callable[[str, str], Awaitable[bool]]) -> PolicyCheck:
    """The admin tool-policy tree as the broker's policy: the destination's selector
    ``credentials__<id>`` must be allowed to the member (docs/tool-policies.md)."""

    async def check(member: str, destination: Destination) -> str | None:
        try:
            ok = await allowed(member, destination.policy_name)
        except Exception:
            log.exception("credential policy check failed; refusing")
            return "policy_check_failed"
        return None if ok else "destination_denied"

    return check


__all__ = ["AmbiguousDelivery", "BrokerHandle", "BrokeredResponse", "CredentialBroker",
           "CredentialRefused", "CredentialRequestFailed", "live_policy", "new_ref", "scrub"]
