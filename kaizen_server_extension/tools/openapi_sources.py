"""External OpenAPI sources as guarded tools (docs/openapi-sources.md).

A member registers an uncredentialed HTTPS OpenAPI document and its HTTPS API base
(``store/openapi_sources.py``, REST in ``api/openapi_sources.py``); with
``KAIZEN_OPENAPI_SOURCES_ENABLED`` off (the default) none of this exists (R-378). Each run
discovers, when it is admitted and as its member, the operations of the member's enabled
sources that its agent grants; each operation becomes an ordinary :class:`RegisteredTool` of
that run only, so every call travels the same authority, permission, ceiling, approval, audit
and failure path as a built-in tool.

* **Names** encode the source: ``openapi__<source id>__<operationId>`` (R-400); a call reads
  exactly that source's row, the caller's own, again before anything is sent.
* **Effect classes** come from the compiled document (``tools/openapi_compiler.py``: method and
  ``x-effect``, never a safer guess, R-340, R-341); writes and sensitive operations reach the
  approval gate like any built-in write (R-342).
* **Admin policy** is a tree (R-312..R-316): ``sources`` (every source tool, MCP's too),
  ``openapi`` (the family), ``openapi__<source id>`` (the source: its surface) and the exact
  tool. Each level is read with the member's own row over the everyone row, and every level
  must allow: an ancestor only tightens, a denied ancestor is a hard ceiling over an exact
  allow, and no allow on an ancestor grants what the exact tool's own row denies.
* **Private turns only** (R-374): no reviewed audience class, so never in a shared room.
* **Egress** goes only through ``tools/egress.py`` to the registered origin (R-343, R-381,
  R-382); :meth:`OpenApiSources.call` is the one place a source operation is sent, and the
  place where a credential can later be attached to that request (``credential=`` of
  :meth:`Egress.send`).
* **Credentials** (docs/credentials.md): an operation whose document requires authentication
  (``CompiledAuth``) is offered only when the credential quarantine is on. Its schema gains
  an optional opaque ``credential_ref`` (without one the call pauses for the member's form,
  ``credentials/paused_calls.py``), its descriptor names its credential destination
  (:func:`credential_destination`: one per source and security scheme), and the pipeline
  hands it a broker handle for it; the call then sends its one request with the handle's
  injector as :meth:`Egress.send`'s ``credential``, so the value never passes through the
  model, the arguments, or this module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from kaizen_server_extension.policy.credential_arguments import (
    CREDENTIAL_REF_ARGUMENT,
    CREDENTIAL_REF_RE,
)
from kaizen_server_extension.protocol.errors import MemberSafeError, SchemaViolation
from kaizen_server_extension.protocol.tools import Capability, WriteCategory
from kaizen_server_extension.store.openapi_sources import (
    MAX_URL_CHARS,
    OpenApiSourceStore,
    SourceNotFound,
    SourceRecord,
)
from kaizen_server_extension.tools.egress import (
    Egress,
    EgressFailed,
    EgressRefused,
    EgressResponse,
    Origin,
    OutgoingRequest,
    RequestCredential,
)
from kaizen_server_extension.tools.openapi_compiler import (
    BODY,
    CompiledAuth,
    CompiledDocument,
    CompiledOperation,
)
from kaizen_server_extension.tools.openapi_schema_cache import SchemaCache, SchemaUnavailable
from kaizen_server_extension.tools.ports import (
    CREDENTIAL_DESTINATION_KEY,
    CREDENTIAL_HANDLE_ARGUMENT,
)
from kaizen_server_extension.tools.types import (
    MAX_TIMEOUT_S,
    SOURCES_ROOT,
    Discovered,
    RegisteredTool,
    RoomClass,
    ToolContext,
    ToolDescriptor,
)

log = logging.getLogger("kaizen.tools.openapi")

FAMILY = "openapi"
PREFIX = f"{FAMILY}__"
SEPARATOR = "__"
SOURCE_ID_RE = re.compile(r"^s[0-9a-f]{10}$")
OPERATION_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_NAME_CHARS = 64
#: Bytes of a response read from a source, and characters of its text carried on.
MAX_RESPONSE_BYTES = 1024 * 1024
MAX_RESULT_CHARS = 64 * 1024
#: How long discovery waits for one source's schema.
DISCOVERY_TIMEOUT_S = 15.0
SURFACE_PREFIX = "openapi:"


def source_selector(source_id: str) -> str:
    return f"{PREFIX}{source_id}"


def tool_name(source_id: str, operation_id: str) -> str | None:
    name = f"{PREFIX}{source_id}{SEPARATOR}{operation_id}"
    return name if OPERATION_RE.fullmatch(operation_id) and len(name) <= MAX_NAME_CHARS \
        else None


def parse_name(name: str) -> tuple[str, str | None] | None:
    """(source id, operation or None for the source selector) of an OpenAPI name, else None."""
    if not name.startswith(PREFIX):
        return None
    source, sep, operation = name[len(PREFIX):].partition(SEPARATOR)
    if not SOURCE_ID_RE.fullmatch(source):
        return None
    if not sep:
        return source, None
    return (source, operation) if OPERATION_RE.fullmatch(operation) else None


def ancestors_of(name: str) -> tuple[str, ...]:
    """The policy selectors above ``name`` in the tree, root first (empty for other names)."""
    if name == FAMILY:
        return (SOURCES_ROOT,)
    parsed = parse_name(name)
    if parsed is None:
        return ()
    if parsed[1] is None:
        return (SOURCES_ROOT, FAMILY)
    return (SOURCES_ROOT, FAMILY, source_selector(parsed[0]))


# --- registration -------------------------------------------------------------------------


def checked_url(url: str, field: str) -> str:
    """An uncredentialed HTTPS URL (R-375, R-380), else a 422 naming the rule it breaks."""
    if len(url) > MAX_URL_CHARS or any(ord(ch) <= 32 or ord(ch) == 127 for ch in url) \
            or "\\" in url:
        raise SchemaViolation(f"{field} is not a plain URL.", code="invalid_url")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise SchemaViolation(f"{field} is not a valid URL.", code="invalid_url") from None
    if parts.scheme.lower() != "https":
        raise SchemaViolation(f"{field} must be an https:// URL.", code="https_required")
    if not parts.hostname:
        raise SchemaViolation(f"{field} has no host.", code="invalid_url")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise SchemaViolation(f"{field} may not carry user information (credentials).",
                              code="credentialed_url")
    if parts.query or "?" in url:
        raise SchemaViolation(f"{field} may not carry a query (it can hold a credential).",
                              code="credentialed_url")
    if parts.fragment or "#" in url:
        raise SchemaViolation(f"{field} may not carry a fragment.", code="invalid_url")
    path = parts.path or "/"
    if "//" in path or any(s in (".", "..") for s in path.split("/")):
        raise SchemaViolation(f"{field} has a path that is not plain.", code="invalid_url")
    host = parts.hostname.lower()
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != 443:
        netloc += f":{port}"
    return f"https://{netloc}{path if parts.path else ''}"


@dataclass(frozen=True, slots=True)
class SourceUrls:
    schema_url: str
    api_base: str
    cross_origin: bool


def api_base_path(api_base: str) -> str:
    return urlsplit(api_base).path.rstrip("/")


# --- descriptors --------------------------------------------------------------------------


#: The credential destination of one source's security scheme: ``oas-<source id>-<hash>``.
DESTINATION_RE = re.compile(r"^oas-(s[0-9a-f]{10})-([0-9a-f]{8})$")


def scheme_tag(scheme: str) -> str:
    return hashlib.sha256(scheme.encode()).hexdigest()[:8]


def credential_destination(source_id: str, scheme: str) -> str:
    """The credential destination id of ``scheme`` on ``source_id`` (docs/credentials.md)."""
    return f"oas-{source_id}-{scheme_tag(scheme)}"


def with_credential_ref(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with the optional opaque ``credential_ref`` the model may pass (R-350).
    Without one, the call pauses and the member is asked for the credential in a form bound
    to that call (``credentials/paused_calls.py``)."""
    properties = {**(schema.get("properties") or {}), CREDENTIAL_REF_ARGUMENT: {
        "type": "string", "pattern": CREDENTIAL_REF_RE.pattern,
        "description": "Optional: the opaque reference of a credential the member gave you "
                       "for this source (never a credential itself). Omit it and the member "
                       "is asked to enter the credential for this call."}}
    return {**schema, "properties": properties}


def descriptor_for(source: SourceRecord, operation: CompiledOperation,
                   timeout_s: float, schema_digest: str = "") -> ToolDescriptor | None:
    name = tool_name(source.id, operation.operation_id)
    if name is None:
        return None
    extra: dict[str, Any] = {"openapi_source": source.id,
                             "openapi_operation": operation.operation_id,
                             # What a credential form bound to one call compares.
                             "openapi_schema_digest": schema_digest}
    schema: Mapping[str, Any] = operation.input_schema
    if operation.auth is not None:
        extra[CREDENTIAL_DESTINATION_KEY] = credential_destination(source.id,
                                                                   operation.auth.scheme)
        schema = with_credential_ref(schema)
    head = f"[OpenAPI source {source.id}: {operation.method} {operation.path[:200]}]"
    effect = operation.effect
    return ToolDescriptor(
        name=name,
        description=f"{head} {operation.description}".rstrip(),
        input_schema=schema,
        capability=effect,
        timeout_s=min(timeout_s, MAX_TIMEOUT_S),
        # A repeated write may create a second object: never deduplicated.
        repeat_creates_object=effect is not Capability.READ,
        # No reviewed audience class: private turns only.
        room_class=RoomClass.UNKNOWN,
        private_room_only=True,
        write_category=(WriteCategory.NONE if effect is Capability.READ
                        else WriteCategory.EXTERNAL_EFFECT),
        surface=f"{SURFACE_PREFIX}{source.id}",
        first_party=False,
        extra=extra,
    )


class SourceUnavailable(MemberSafeError):
    """Nothing was sent: the source is gone, disabled, changed or cannot be reached."""

    def __init__(self, message: str, *, code: str = "openapi_source_unavailable") -> None:
        super().__init__(message, code=code)


class SourceCallFailed(Exception):
    """A write or sensitive call failed after it may have reached the source: its outcome is
    unknown and it is never retried automatically (R-399)."""


class OpenApiSources:
    """The members' sources: URL rules, discovery for a run, and the call of one operation."""

    def __init__(self, store: OpenApiSourceStore, egress: Egress, cache: SchemaCache, *,
                 cross_origin_enabled: bool = False, timeout_s: float = 30.0,
                 credentials_enabled: bool = False,
                 query_auth_enabled: bool = False) -> None:
        self._store = store
        self._egress = egress
        self._cache = cache
        self._cross_origin_enabled = cross_origin_enabled
        self._timeout_s = timeout_s
        # Operations that need a credential are offered only with the quarantine on.
        self._credentials_enabled = credentials_enabled
        # A query-string API key is offered only under this admin ceiling.
        self._query_auth_enabled = query_auth_enabled

    @property
    def store(self) -> OpenApiSourceStore:
        return self._store

    # --- registration rules ---------------------------------------------------------------

    def checked_urls(self, schema_url: str, api_base: str | None,
                     cross_origin: bool) -> SourceUrls:
        """The URLs of a source being registered or changed, or a 422 (nothing is written):
        both uncredentialed HTTPS (R-375, R-380), on ports and addresses the egress policy
        allows (R-381), and on one origin unless the source consents and the admin ceiling is
        on (R-383)."""
        schema = checked_url(schema_url, "schema_url")
        base = checked_url(api_base, "api_base") if api_base else str(Origin.of(schema))
        for url in (schema, base):
            origin = Origin.of(url)
            try:
                self._egress.policy.check_port(origin)
                self._egress.policy.check_literal(origin)
            except EgressRefused as refused:
                raise SchemaViolation(str(refused), code=refused.code) from None
        if Origin.of(schema) != Origin.of(base) and not self._cross_origin_allowed(cross_origin):
            raise SchemaViolation(
                "The API base must be on the schema URL's origin (a different origin needs "
                "the source's consent and the administrator's cross-origin setting).",
                code="cross_origin_refused")
        return SourceUrls(schema, base, cross_origin)

    def _cross_origin_allowed(self, consent: bool) -> bool:
        return consent and self._cross_origin_enabled

    @property
    def query_auth_enabled(self) -> bool:
        """Whether the query-auth ceiling (``KAIZEN_EXTERNAL_QUERY_AUTH_ENABLED``) is on."""
        return self._query_auth_enabled

    def auth_allowed(self, auth: CompiledAuth) -> bool:
        """Whether the deployment's ceilings allow this authentication alternative now: a
        query-string key only under the query-auth ceiling (R-384)."""
        return self._query_auth_enabled or not auth.in_query

    def usable(self, source: SourceRecord) -> bool:
        """Whether a stored source may be used now: enabled, and cross-origin only while the
        source consents and the administrator's ceiling is on (turning it off revokes)."""
        return source.enabled and (
            Origin.of(source.schema_url) == Origin.of(source.api_base)
            or self._cross_origin_allowed(source.cross_origin))

    # --- policy names ---------------------------------------------------------------------

    @staticmethod
    def ancestors_of(name: str) -> tuple[str, ...]:
        return ancestors_of(name)

    async def policy_name_known(self, name: str) -> bool:
        """Whether an admin policy may name ``name``: the family, or an existing source's
        selector or a tool name under one."""
        if name == FAMILY:
            return True
        parsed = parse_name(name)
        return parsed is not None and await self._store.exists(parsed[0])

    # --- discovery ------------------------------------------------------------------------

    @staticmethod
    def grants(ceiling: Iterable[str], source_id: str, name: str | None = None) -> bool:
        """Whether an agent's tool list grants ``name`` of ``source_id`` (or any of its tools
        when ``name`` is None): the family, the source, or the exact tool."""
        names = set(ceiling)
        selector = source_selector(source_id)
        if FAMILY in names or selector in names:
            return True
        if name is not None:
            return name in names
        return any(n.startswith(selector + SEPARATOR) for n in names)

    async def discover(self, member: str, ceiling: Sequence[str]) -> Discovered:
        """The operations of ``member``'s usable sources the agent grants, each source's
        schema read through the cache; a source that fails gives nothing (fail closed)."""
        if not any(n == FAMILY or n.startswith(PREFIX) for n in ceiling):
            return Discovered()
        sources = [s for s in await self._store.enabled_for(member)
                   if self.usable(s) and self.grants(ceiling, s.id)]
        if not sources:
            return Discovered()
        found = await asyncio.gather(*(self._document(s) for s in sources))
        tools: list[RegisteredTool] = []
        down: list[str] = []
        for source, document in zip(sources, found, strict=True):
            if document is None:
                down.append(source.id)
                continue
            for operation in self.offerable(document)[0]:
                descriptor = descriptor_for(source, operation, self._timeout_s,
                                            document.digest)
                if descriptor is None or not self.grants(ceiling, source.id, descriptor.name):
                    continue
                tools.append(RegisteredTool(descriptor=descriptor,
                                            impl=self._impl(source, operation, descriptor)))
        return Discovered(tuple(tools), tuple(down))

    def offerable(self, document: CompiledDocument) -> tuple[
            tuple[CompiledOperation, ...], tuple[tuple[str, str], ...]]:
        """The operations that can be offered here, and (where, reason) for those that
        cannot: one that requires authentication needs the credential quarantine on, and its
        authentication becomes the first alternative the ceilings allow — a query-string key
        only under the query-auth ceiling (R-384); none allowed omits it."""
        usable: list[CompiledOperation] = []
        unavailable: list[tuple[str, str]] = []
        for op in document.operations:
            where = f"{op.method} {op.path}"
            if op.auth is None:
                usable.append(op)
            elif not self._credentials_enabled:
                unavailable.append(
                    (where, "requires authentication, and credentials are not enabled"))
            else:
                allowed = [a for a in op.auth_alternatives or (op.auth,)
                           if self.auth_allowed(a)]
                if allowed:
                    usable.append(op if allowed[0] == op.auth
                                  else dataclasses.replace(op, auth=allowed[0]))
                else:
                    unavailable.append((where, "its only supported authentication is a "
                                               "query-string API key, and query-string "
                                               "credentials are not enabled"))
        return tuple(usable), tuple(unavailable)

    async def _document(self, source: SourceRecord) -> CompiledDocument | None:
        try:
            async with asyncio.timeout(DISCOVERY_TIMEOUT_S):
                return await self._cache.get(source.schema_url)
        except (SchemaUnavailable, EgressRefused, TimeoutError) as exc:
            log.warning("OpenAPI source %s: discovery failed (%s); it gives no tools this run",
                        source.id, getattr(exc, "code", type(exc).__name__))
            return None

    async def operations(self, source: SourceRecord) -> CompiledDocument:
        """The compiled document of one source, for its owner's REST listing."""
        return await self._cache.get(source.schema_url)

    # --- calls ----------------------------------------------------------------------------

    def _impl(self, source: SourceRecord, operation: CompiledOperation,
              descriptor: ToolDescriptor) -> Any:
        sources = self

        async def call_openapi_operation(ctx: ToolContext, **arguments: Any) -> dict[str, Any]:
            handle = arguments.pop(CREDENTIAL_HANDLE_ARGUMENT, None)
            if operation.auth is None:
                return await sources.call(ctx.member, source, operation, arguments)
            if handle is None:
                raise SourceUnavailable(f"{operation.operation_id} needs a credential, so it "
                                        "was not run.", code="credential_required")

            async def send(injector: RequestCredential) -> dict[str, Any]:
                return await sources.call(ctx.member, source, operation, arguments,
                                          credential=injector)

            # The broker checks the origin, claims the receipt and hands over the injector
            # for exactly this one request (docs/credentials.md).
            result: dict[str, Any] = await handle.attach(str(Origin.of(source.api_base)), send)
            return result

        call_openapi_operation.__name__ = descriptor.name
        return call_openapi_operation

    async def call(self, member: str, discovered: SourceRecord, operation: CompiledOperation,
                   arguments: Mapping[str, Any], *,
                   credential: RequestCredential | None = None) -> dict[str, Any]:
        """Send one operation of ``member``'s source ``discovered`` — the one place a source
        operation goes out. The source's own row is read again first (R-400): gone, disabled,
        moved to other URLs or no longer allowed cross-origin, nothing is sent. The URL,
        method, path and query names and headers come from the compiled operation and the
        registered API base; the model's arguments fill values only (R-343)."""
        try:
            source = await self._store.get_for(discovered.id, member)
        except SourceNotFound:
            raise SourceUnavailable(f"The source {discovered.id} no longer exists, so "
                                    f"{operation.operation_id} was not run.") from None
        if not self.usable(source):
            raise SourceUnavailable(f"The source {source.id} is disabled, so "
                                    f"{operation.operation_id} was not run.")
        if (source.schema_url, source.api_base) != (discovered.schema_url,
                                                    discovered.api_base):
            raise SourceUnavailable(f"The source {source.id} changed since this turn began, "
                                    f"so {operation.operation_id} was not run.",
                                    code="openapi_source_changed")
        request = build_request(api_base_path(source.api_base), operation, arguments)
        try:
            response = await self._egress.send(Origin.of(source.api_base), request,
                                               max_bytes=MAX_RESPONSE_BYTES,
                                               credential=credential)
        except EgressRefused:
            raise
        except EgressFailed as failed:
            if not failed.sent or operation.effect is Capability.READ:
                # Nothing reached the source, or a read did: either way no effect.
                raise SourceUnavailable(
                    f"The source {source.id} could not be reached, so "
                    f"{operation.operation_id} did not complete. Try again later or answer "
                    "without it.") from None
            raise SourceCallFailed(f"{operation.operation_id} on source {source.id} failed "
                                   f"in transport ({failed.kind})") from None
        return result_body(source.id, operation, response)


def build_request(base_path: str, operation: CompiledOperation,
                  arguments: Mapping[str, Any]) -> OutgoingRequest:
    """The request of ``operation`` under ``base_path`` with the arguments' values: a path
    value is percent-encoded whole (it cannot add a segment or leave the path), query names
    are the operation's own, and only a JSON body is sent."""
    path = operation.path
    query: list[tuple[str, str]] = []
    for parameter in operation.parameters:
        if parameter.name not in arguments:
            continue
        value = arguments[parameter.name]
        if parameter.location == "path":
            path = path.replace("{" + parameter.name + "}", quote(_scalar(value), safe=""))
        elif value is not None:
            values = value if isinstance(value, list) else [value]
            query.extend((parameter.name, _scalar(v)) for v in values)
    has_body = operation.takes_body and BODY in arguments
    return OutgoingRequest(method=operation.method, path=f"{base_path}{path}", query=query,
                           json_body=arguments.get(BODY) if has_body else None,
                           has_body=has_body)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def result_body(source_id: str, operation: CompiledOperation,
                response: EgressResponse) -> dict[str, Any]:
    """The response as a bounded JSON body; binary content is described by size and digest,
    never carried. A non-2xx status is a failed call (R-274), a redirect is never followed."""
    body: dict[str, Any] = {"source": source_id, "operation": operation.operation_id,
                            "status": response.status}
    media = response.content_type.split(";", 1)[0].strip().lower()
    if response.body:
        if media == "application/json" or media.endswith("+json"):
            text = response.body.decode("utf-8", errors="replace")
            parsed: Any = None
            if not response.truncated and len(text) <= MAX_RESULT_CHARS:
                try:
                    parsed = json.loads(text)
                except ValueError:
                    parsed = None
            if parsed is not None:
                body["json"] = parsed
            else:
                body["text"] = text[:MAX_RESULT_CHARS]
        elif media.startswith("text/") or media in ("application/xml", "application/yaml"):
            body["text"] = response.body.decode("utf-8", errors="replace")[:MAX_RESULT_CHARS]
        else:
            body["binary"] = {"media_type": media[:100], "bytes": len(response.body),
                              "sha256": hashlib.sha256(response.body).hexdigest()}
    if response.truncated or len(body.get("text", "")) >= MAX_RESULT_CHARS:
        body["truncated"] = True
    if 300 <= response.status < 400:
        body["ok"] = False
        body["error"] = {"message": "The source answered with a redirect, which is never "
                                    "followed."}
    elif not 200 <= response.status < 300:
        body["ok"] = False
        body["error"] = {"message": f"The source answered {response.status}."}
    return body


__all__ = ["FAMILY", "MAX_URL_CHARS", "OpenApiSources", "SourceCallFailed", "SourceUnavailable",
           "ancestors_of", "build_request", "checked_url", "descriptor_for", "parse_name",
           "result_body", "source_selector", "tool_name", "with_credential_ref"]
