"""External OpenAPI sources as credential destinations (docs/credentials.md, "Sources").

Each security scheme a member's source uses is one destination, ``oas-<source id>-<tag>``
(``tools/openapi_sources.py: credential_destination``): its origin is the source's registered
API base, its scheme the compiled plan (``CompiledAuth``), and its revision the source's
URLs and cross-origin consent, so a changed source is a new destination and forms issued
for the old one are refused (R-390). Looked up as the member: another member's source is no
destination of theirs. Before a form's nonce is claimed and before every request, the source
is re-read: it must still be the member's, be usable (enabled, and cross-origin only while
consented and allowed by the administrator), a query-string key needs the query-auth
ceiling (``KAIZEN_EXTERNAL_QUERY_AUTH_ENABLED``, R-384), and the admin tree must allow it
(R-389).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping

from kaizen_server_extension.credentials.call_binding import CallBinding, call_arguments_digest
from kaizen_server_extension.credentials.destinations import (
    Destination,
    DestinationInvalid,
    make_scheme,
)
from kaizen_server_extension.policy.credential_arguments import (
    CREDENTIAL_REF_ARGUMENT,
    find_credential,
)
from kaizen_server_extension.store.openapi_sources import SourceNotFound, SourceRecord
from kaizen_server_extension.tools.egress import Origin
from kaizen_server_extension.tools.openapi_compiler import CompiledAuth, CompiledOperation
from kaizen_server_extension.tools.openapi_sources import (
    DESTINATION_RE,
    OpenApiSources,
    credential_destination,
    parse_name,
    scheme_tag,
    source_selector,
    tool_name,
)
from kaizen_server_extension.tools.schema import validator_for

log = logging.getLogger("kaizen.credentials")

PROVIDER = "openapi"


def _revision(source: SourceRecord) -> str:
    text = f"{source.schema_url}\n{source.api_base}\n{source.cross_origin}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class OpenApiDestinations:
    provider = PROVIDER

    def __init__(self, sources: OpenApiSources,
                 allowed: Callable[[str, str], Awaitable[bool]]) -> None:
        self._sources = sources
        self._allowed = allowed

    async def _source(self, source_id: str, member: str) -> SourceRecord | None:
        try:
            return await self._sources.store.get_for(source_id, member)
        except SourceNotFound:
            return None

    async def _schemes(self, source: SourceRecord, *, offered: bool) -> list[CompiledAuth]:
        """The source's security schemes: the ones its offered operations use now
        (``offered``), or every supported alternative its document declares, so that a form
        for one the ceilings now refuse is refused by name (:meth:`refusal`)."""
        try:
            document = await self._sources.operations(source)
        except Exception as exc:
            # No document now: no destination now (it fails closed).
            log.info("OpenAPI source %s: no credential destinations (%s)", source.id,
                     type(exc).__name__)
            return []
        seen: dict[str, CompiledAuth] = {}
        if offered:
            for operation in self._sources.offerable(document)[0]:
                if operation.auth is not None:
                    seen.setdefault(operation.auth.scheme, operation.auth)
        else:
            for operation in document.operations:
                for auth in operation.auth_alternatives:
                    seen.setdefault(auth.scheme, auth)
        return list(seen.values())

    @staticmethod
    def _destination(source: SourceRecord, auth: CompiledAuth) -> Destination | None:
        try:
            scheme = make_scheme(auth.kind, auth.name)
        except DestinationInvalid:
            return None
        return Destination(id=credential_destination(source.id, auth.scheme),
                           origin=str(Origin.of(source.api_base)), scheme=scheme,
                           label=f"OpenAPI source {source.id} ({auth.scheme})",
                           enabled=source.enabled, provider=PROVIDER,
                           revision=_revision(source))

    async def lookup(self, destination_id: str, member: str) -> Destination | None:
        parsed = DESTINATION_RE.fullmatch(destination_id)
        if parsed is None:
            return None
        source = await self._source(parsed.group(1), member)
        if source is None:
            return None
        for auth in await self._schemes(source, offered=False):
            if scheme_tag(auth.scheme) == parsed.group(2):
                return self._destination(source, auth)
        return None

    async def listing(self, member: str) -> list[Destination]:
        out: list[Destination] = []
        for source in await self._sources.store.enabled_for(member):
            if not self._sources.usable(source):
                continue
            for auth in await self._schemes(source, offered=True):
                destination = self._destination(source, auth)
                if destination is not None:
                    out.append(destination)
        return out

    async def refusal(self, member: str, destination: Destination) -> str | None:
        parsed = DESTINATION_RE.fullmatch(destination.id)
        source = await self._source(parsed.group(1), member) if parsed else None
        if source is None:
            return "destination_unknown"
        if not self._sources.usable(source):
            return "destination_disabled"
        if destination.scheme.kind == "query" and not self._sources.query_auth_enabled:
            # The query-auth ceiling is off (now): a rendered form for such a key is revoked.
            return "query_auth_disabled"
        if _revision(source) != destination.revision \
                or str(Origin.of(source.api_base)) != destination.origin:
            return "destination_changed"
        try:
            allowed = await self._allowed(member, source_selector(source.id))
        except Exception:
            log.exception("credential policy check of source %s failed; refusing", source.id)
            return "policy_check_failed"
        return None if allowed else "destination_denied"

    # --- forms bound to one call (R-387, R-390) -----------------------------------------------

    async def _offered(self, member: str, destination: Destination,
                       tool: str) -> tuple[SourceRecord, str, CompiledOperation] | None:
        """The source, its document digest and the operation ``tool`` names, as offered now,
        when it authenticates through ``destination``; else None."""
        parsed_tool = parse_name(tool)
        parsed_destination = DESTINATION_RE.fullmatch(destination.id)
        if parsed_tool is None or parsed_tool[1] is None or parsed_destination is None \
                or parsed_tool[0] != parsed_destination.group(1):
            return None
        source = await self._source(parsed_tool[0], member)
        if source is None:
            return None
        try:
            document = await self._sources.operations(source)
        except Exception as exc:
            log.info("OpenAPI source %s: no call binding now (%s)", source.id,
                     type(exc).__name__)
            return None
        for operation in self._sources.offerable(document)[0]:
            if operation.operation_id == parsed_tool[1] and operation.auth is not None \
                    and credential_destination(source.id, operation.auth.scheme) \
                    == destination.id and tool_name(source.id, operation.operation_id) == tool:
                return source, document.digest, operation
        return None

    async def bind_call(self, member: str, destination: Destination, tool: str,
                        arguments: Mapping[str, object]) -> CallBinding | str:
        found = await self._offered(member, destination, tool)
        if found is None:
            return "call_unknown"
        source, digest, operation = found
        denied = await self._operation_refusal(member, tool)
        if denied is not None:
            return denied
        plain = {k: v for k, v in arguments.items() if k != CREDENTIAL_REF_ARGUMENT}
        # Arguments the call could never be made with, or ones that carry a credential
        # themselves, make no form (the pipeline would refuse that call anyway).
        if find_credential(plain) is not None \
                or next(validator_for(operation.input_schema).iter_errors(plain), None):
            return "call_arguments_invalid"
        return CallBinding(tool=tool, source=source.id, operation=operation.operation_id,
                           schema_digest=digest, args_digest=call_arguments_digest(plain),
                           effect=operation.effect.value, api_base=source.api_base)

    async def call_refusal(self, member: str, destination: Destination,
                           binding: CallBinding) -> str | None:
        found = await self._offered(member, destination, binding.tool)
        if found is None:
            return "operation_changed"
        source, digest, operation = found
        if digest != binding.schema_digest or source.api_base != binding.api_base \
                or operation.effect.value != binding.effect:
            return "operation_changed"
        # The endpoint itself may have been disabled for the member since.
        return await self._operation_refusal(member, binding.tool)

    async def _operation_refusal(self, member: str, tool: str) -> str | None:
        """The admin tree for the exact operation (every level down to the endpoint)."""
        try:
            allowed = await self._allowed(member, tool)
        except Exception:
            log.exception("credential policy check of %s failed; refusing", tool)
            return "policy_check_failed"
        return None if allowed else "operation_denied"
