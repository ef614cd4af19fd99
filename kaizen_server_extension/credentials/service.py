"""The server's credential quarantine, wired from the settings; and the pipeline's port to it.

``CredentialService`` is built once at start-up when ``KAIZEN_CREDENTIALS_ENABLED`` is on. A
tool is *credential-backed* when its descriptor names a destination
(``extra["credential_destination"]``, see :func:`credential_backed`); the pipeline then calls
:meth:`CredentialService.open_for_call` immediately before execution, which swaps the call's
``credential_ref`` argument for a :class:`~kaizen_server_extension.credentials.broker.BrokerHandle`
(R-443), and scrubs the tool's result with it afterwards (R-396). An External OpenAPI call
made without a ``credential_ref`` pauses for the member's form instead
(:meth:`CredentialService.open_for_paused_call`, ``credentials/paused_calls.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kaizen_server_extension.credentials.broker import (
    BrokerHandle,
    CredentialBroker,
    CredentialRefused,
    live_policy,
)
from kaizen_server_extension.credentials.call_binding import (
    CallIdentity,
    call_arguments_digest,
)
from kaizen_server_extension.credentials.crypto import CredentialKeys, Vault, parse_key
from kaizen_server_extension.credentials.destinations import (
    StaticDestinations,
    destination_from_settings,
)
from kaizen_server_extension.credentials.forms import FORM_TTL_S, CredentialForms
from kaizen_server_extension.credentials.paused_calls import PausedCalls
from kaizen_server_extension.policy.credential_arguments import (
    CREDENTIAL_REF_ARGUMENT,
    CREDENTIAL_REF_RE,
)
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.store.credentials import CredentialRecords
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.tools.ports import (
    CREDENTIAL_DESTINATION_KEY,
    CREDENTIAL_HANDLE_ARGUMENT,
    PausedCallFacts,
)
from kaizen_server_extension.tools.types import RegisteredTool, ToolDescriptor

#: The descriptor key that makes a tool credential-backed; its value is a destination id.
DESTINATION_KEY = CREDENTIAL_DESTINATION_KEY
#: The keyword a credential-backed tool's implementation receives its handle under.
HANDLE_ARGUMENT = CREDENTIAL_HANDLE_ARGUMENT
#: The descriptor key of the schema document digest an External OpenAPI tool was discovered
#: from (``tools/openapi_sources.py``): what a form bound to one call compares (R-390).
SCHEMA_DIGEST_KEY = "openapi_schema_digest"


def credential_backed(registered: RegisteredTool, destination_id: str) -> RegisteredTool:
    """``registered`` as a credential-backed tool of ``destination_id``: its input schema
    gains a required opaque ``credential_ref`` (the only credential the model may name,
    R-350) and its implementation receives ``credential=<BrokerHandle>`` instead."""
    descriptor = registered.descriptor
    schema = dict(descriptor.input_schema)
    properties = dict(schema.get("properties") or {})
    properties[CREDENTIAL_REF_ARGUMENT] = {
        "type": "string", "pattern": CREDENTIAL_REF_RE.pattern,
        "description": "The opaque reference of a credential the member entered for this "
                       "tool's destination (never a credential itself)."}
    schema["properties"] = properties
    schema["required"] = sorted({*schema.get("required", ()), CREDENTIAL_REF_ARGUMENT})
    extra = {**descriptor.extra, DESTINATION_KEY: destination_id}
    return dataclasses.replace(registered, descriptor=dataclasses.replace(
        descriptor, input_schema=schema, extra=extra))


def destination_of(descriptor: ToolDescriptor) -> str | None:
    value = descriptor.extra.get(DESTINATION_KEY)
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True, slots=True)
class CallCredential:
    """One call's credential: the arguments the tool gets and the scrubber of its result."""

    arguments: Mapping[str, Any]
    handle: BrokerHandle

    def scrub(self, body: object) -> object:
        return self.handle.scrub(body)

    def close(self) -> None:
        self.handle.close()


def _effect(descriptor: ToolDescriptor) -> str:
    return {Capability.READ: "read", Capability.WRITE: "write"}.get(descriptor.capability,
                                                                    "sensitive")


class CredentialService:
    def __init__(self, store: Store, *, key_text: str, remember_enabled: bool,
                 destinations: StaticDestinations,
                 allowed: Callable[[str, str], Awaitable[bool]],
                 form_ttl_s: int = FORM_TTL_S) -> None:
        keys = CredentialKeys.from_master(parse_key(key_text))
        self.records = CredentialRecords(store)
        self.destinations = destinations
        self.broker = CredentialBroker(self.records, Vault(keys.vault), destinations,
                                       live_policy(allowed))
        self.forms = CredentialForms(store, self.broker, keys.form,
                                     remember_enabled=remember_enabled, ttl_s=form_ttl_s)
        self.paused = PausedCalls(store, self.forms, self.broker)

    @classmethod
    def from_settings(cls, store: Store, settings: Any,
                      allowed: Callable[[str, str], Awaitable[bool]]) -> CredentialService:
        destinations = StaticDestinations(
            destination_from_settings(d.model_dump())
            for d in settings.KAIZEN_CREDENTIAL_DESTINATIONS)
        return cls(store, key_text=settings.KAIZEN_CREDENTIAL_KEY.get_secret_value(),
                   remember_enabled=settings.KAIZEN_CREDENTIAL_REMEMBER_ENABLED,
                   destinations=destinations, allowed=allowed,
                   form_ttl_s=settings.KAIZEN_CREDENTIAL_FORM_SECONDS)

    def __repr__(self) -> str:
        return "CredentialService(<values withheld>)"

    def policy_name_known(self, name: str) -> bool:
        return self.destinations.policy_name_known(name)

    async def listing_credential(self, member: str, destination_id: str,
                                 operation: str) -> BrokerHandle | None:
        """A read handle on ``member``'s newest remembered credential for the destination,
        for listing an MCP server's tools (docs/mcp.md, "Credentials"); None without one."""
        return await self.broker.listing_handle(member, destination_id, operation=operation)

    async def open_for_call(self, bundle: AuthorityBundle, descriptor: ToolDescriptor,
                            arguments: Mapping[str, Any]) -> CallCredential:
        """The call's arguments with its ``credential_ref`` swapped for a handle; raises
        :class:`CredentialRefused` (nothing sent) when the reference cannot be used."""
        destination = destination_of(descriptor)
        if destination is None:
            raise CredentialRefused("This tool declares no credential destination.",
                                    "destination_unknown")
        effect = _effect(descriptor)
        # This exact call, for a credential a form bound to one call.
        schema_digest = descriptor.extra.get(SCHEMA_DIGEST_KEY)
        call = CallIdentity(descriptor.name, call_arguments_digest(arguments),
                            schema_digest if isinstance(schema_digest, str) else "", effect)
        handle = await self.broker.handle(
            bundle.member, arguments.get(CREDENTIAL_REF_ARGUMENT), destination,
            operation=descriptor.name, effect=effect, run_id=bundle.run_id, call=call)
        passed = {k: v for k, v in arguments.items() if k != CREDENTIAL_REF_ARGUMENT}
        passed[HANDLE_ARGUMENT] = handle
        return CallCredential(passed, handle)

    async def open_for_paused_call(self, bundle: AuthorityBundle, descriptor: ToolDescriptor,
                                   arguments: Mapping[str, Any],
                                   facts: PausedCallFacts) -> CallCredential:
        """See :class:`~kaizen_server_extension.tools.ports.CredentialPort`. Only an External
        OpenAPI operation pauses (its form can bind the call); any other credential-backed
        tool without a reference is refused as before."""
        destination = destination_of(descriptor)
        schema_digest = descriptor.extra.get(SCHEMA_DIGEST_KEY)
        if destination is None or not isinstance(schema_digest, str) or not schema_digest \
                or CREDENTIAL_REF_ARGUMENT in arguments:
            return await self.open_for_call(bundle, descriptor, arguments)
        effect = _effect(descriptor)
        plain = dict(arguments)
        resumed = await self.paused.resume_or_pause(bundle, facts, descriptor, destination,
                                                    effect, schema_digest, plain)
        handle = await self.broker.handle(
            bundle.member, resumed.credential_ref, destination, operation=descriptor.name,
            effect=effect, run_id=bundle.run_id, call=resumed.call)
        return CallCredential({**plain, HANDLE_ARGUMENT: handle}, handle)

    async def approval_resumes(self, bundle: AuthorityBundle, facts: PausedCallFacts,
                               approval_id: str) -> bool:
        return await self.paused.approval_resumes(bundle, facts, approval_id)

    async def paused_under(self, bundle: AuthorityBundle, facts: PausedCallFacts) -> str | None:
        return await self.paused.paused_under(bundle, facts)


class Unavailable:
    """The port when credentials are off: every credential-backed call is refused."""

    async def open_for_call(self, bundle: AuthorityBundle, descriptor: ToolDescriptor,
                            arguments: Mapping[str, Any]) -> CallCredential:
        raise CredentialRefused("Credentials are not enabled on this server, so this tool "
                                "cannot run.", "credentials_disabled")

    async def open_for_paused_call(self, bundle: AuthorityBundle, descriptor: ToolDescriptor,
                                   arguments: Mapping[str, Any],
                                   facts: PausedCallFacts) -> CallCredential:
        return await self.open_for_call(bundle, descriptor, arguments)

    async def approval_resumes(self, bundle: AuthorityBundle, facts: PausedCallFacts,
                               approval_id: str) -> bool:
        return False

    async def paused_under(self, bundle: AuthorityBundle, facts: PausedCallFacts) -> str | None:
        return None
