"""Where a credential may go: a destination is one origin and one way of presenting it.

A credential is never a free-floating secret: it is entered for, sealed to and sent only to
one destination — an id, the exact origin (``scheme://host[:port]``) requests go to, and the
scheme that says how the value rides on a request (a bearer token, a named header, HTTP
Basic, a cookie, a client certificate for mutual TLS, or — for sources that allow it — a
query parameter). The administrator declares static destinations
(``KAIZEN_CREDENTIAL_DESTINATIONS``); a source module may add its own through
:class:`DestinationDirectory` (an External OpenAPI source's security scheme,
docs/credentials.md, "Sources").

Each destination has an admin policy selector, ``credentials__<id>``, in the ordinary tool
policy tree (docs/tool-policies.md): denying it to a member (or to everyone) revokes every form
already rendered for it and stops every brokered request to it from the next one on (R-389).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import urlsplit

from kaizen_server_extension.credentials.call_binding import CallBinding
from kaizen_server_extension.policy.credential_arguments import RESERVED_CREDENTIAL_HEADERS

SchemeKind = Literal["bearer", "header", "basic", "cookie", "query", "mtls"]
SCHEME_KINDS: tuple[str, ...] = ("bearer", "header", "basic", "cookie", "query", "mtls")
DESTINATION_ID_RE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
#: A header, cookie or query name a scheme may set.
PARAMETER_NAME_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
#: Headers a scheme may never set: the ones that route, frame or identify the request.
RESERVED_HEADERS = RESERVED_CREDENTIAL_HEADERS
POLICY_PREFIX = "credentials__"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class DestinationInvalid(ValueError):
    """A destination declaration that cannot be used; the message is safe to print."""


@dataclass(frozen=True, slots=True)
class Scheme:
    kind: SchemeKind
    #: The header, cookie or query parameter name (``header``, ``cookie``, ``query``).
    name: str = ""

    def fields(self) -> tuple[str, ...]:
        """The secret fields a member enters for this scheme (:meth:`optional` ones may be
        left empty)."""
        if self.kind == "basic":
            return ("username", "password")
        if self.kind == "mtls":
            # PEM on one line: a browser's field drops the line breaks, and the form refuses
            # control characters; tools/mtls.py puts them back. The passphrase is only for
            # an encrypted private key.
            return ("certificate", "private_key", "passphrase")
        return ("value",)

    def optional(self, field_name: str) -> bool:
        """Whether the member may leave ``field_name`` empty."""
        return self.kind == "mtls" and field_name == "passphrase"

    def form_fields(self) -> list[dict[str, object]]:
        """The form's schema, free of any value: each field's name and whether it is
        required."""
        return [{"name": name, "required": not self.optional(name)} for name in self.fields()]

    def describe(self) -> str:
        return {"bearer": "a bearer token (Authorization: Bearer …)",
                "basic": "a user name and password (HTTP Basic)",
                "header": f"an API key sent in the {self.name} header",
                "cookie": f"a session value sent as the {self.name} cookie",
                "query": f"an API key sent as the {self.name} query parameter",
                "mtls": "a client certificate and its private key, with the key's "
                        "passphrase if it is encrypted (mutual TLS)",
                }[self.kind]


@dataclass(frozen=True, slots=True)
class Destination:
    id: str
    origin: str
    scheme: Scheme
    label: str = ""
    enabled: bool = True
    #: Who declared it: ``settings`` or a source module's name.
    provider: str = "settings"
    #: The declaring source's own version (its URLs, say): a change is a new destination.
    revision: str = ""
    #: The CA bundle (a file the administrator names) that verifies the destination's server
    #: certificate when the broker connects itself; empty: the default trust store.
    ca_file: str = ""

    @property
    def policy_name(self) -> str:
        return policy_name(self.id)

    def fingerprint(self) -> str:
        """What a form is bound to besides the destination id: a changed origin, scheme or
        provider is a different destination, and forms for the old one no longer open
        (R-390)."""
        shape = {"id": self.id, "origin": self.origin, "kind": self.scheme.kind,
                 "name": self.scheme.name, "provider": self.provider,
                 "revision": self.revision}
        text = json.dumps(shape, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def public(self) -> dict[str, object]:
        return {"id": self.id, "origin": self.origin, "label": self.label or self.id,
                "scheme": {"kind": self.scheme.kind, "name": self.scheme.name or None},
                "fields": self.scheme.form_fields(),
                "enabled": self.enabled, "provider": self.provider}


def policy_name(destination_id: str) -> str:
    return f"{POLICY_PREFIX}{destination_id}"


def origin_of(url: str, *, allow_loopback_http: bool = True) -> str:
    """The canonical origin of ``url`` (lower-case scheme and host, explicit non-default
    port kept). Raises :class:`DestinationInvalid` for anything that is not a bare HTTPS
    origin: user information, a path, query or fragment (R-380). Plain HTTP is allowed only
    to a loopback host, for development."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        raise DestinationInvalid("the origin is not a valid URL") from None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if not host:
        raise DestinationInvalid("the origin has no host")
    if "@" in parts.netloc:
        raise DestinationInvalid("the origin may not contain user information")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise DestinationInvalid("the origin may not have a path, query or fragment")
    if scheme != "https" and not (scheme == "http" and allow_loopback_http
                                  and host in LOOPBACK_HOSTS):
        raise DestinationInvalid("the origin must be https:// (http only to a loopback host)")
    shown_host = f"[{host}]" if ":" in host else host
    default = {"https": 443, "http": 80}[scheme]
    return f"{scheme}://{shown_host}" + (f":{port}" if port and port != default else "")


def make_scheme(kind: str, name: str = "") -> Scheme:
    if kind not in SCHEME_KINDS:
        raise DestinationInvalid(f"unknown scheme kind {kind[:20]!r}")
    if kind in ("header", "cookie", "query"):
        if not PARAMETER_NAME_RE.fullmatch(name):
            raise DestinationInvalid(f"a {kind} scheme needs a valid name")
        if kind == "header" and name.lower() in RESERVED_HEADERS:
            raise DestinationInvalid(f"the {name} header cannot carry a credential")
    elif name:
        raise DestinationInvalid(f"a {kind} scheme takes no name")
    return Scheme(kind, name)  # type: ignore[arg-type]


class DestinationDirectory(Protocol):
    """Destinations a source module declares (an External OpenAPI source's security scheme):
    looked up live, so a source that was disabled, changed or hidden answers so at once."""

    #: The ``Destination.provider`` of every destination this directory answers for.
    provider: str

    async def lookup(self, destination_id: str, member: str) -> Destination | None:
        """The destination as ``member`` may see it (a source of theirs), else None."""
        ...

    async def listing(self, member: str) -> list[Destination]:
        """The destinations ``member`` may see (their own and their workroom's sources)."""
        ...

    async def refusal(self, member: str, destination: Destination) -> str | None:
        """Why ``member`` may not use ``destination`` now by the source's own rules (its
        visibility, enabled state, API base, admin tree), else None."""
        ...

    async def bind_call(self, member: str, destination: Destination, tool: str,
                        arguments: Mapping[str, object]) -> CallBinding | str:
        """The binding of a form for one call of ``tool`` with ``arguments`` through
        ``destination`` (R-387), or the refusal code (``call_unknown``,
        ``call_arguments_invalid``)."""
        ...

    async def call_refusal(self, member: str, destination: Destination,
                           binding: CallBinding) -> str | None:
        """Why the call a form was bound to is no longer the same call now (the source's
        document or API base changed: ``operation_changed``, R-390), else None."""
        ...


class StaticDestinations:
    """The administrator's ``KAIZEN_CREDENTIAL_DESTINATIONS``, fixed for the process, plus
    any directory a source module attaches (looked up after them)."""

    def __init__(self, destinations: Iterable[Destination] = ()) -> None:
        self._static: dict[str, Destination] = {d.id: d for d in destinations}
        self._attached: list[DestinationDirectory] = []

    def attach(self, directory: DestinationDirectory) -> None:
        self._attached.append(directory)

    def get(self, destination_id: str) -> Destination | None:
        """A static destination (settings), else None."""
        return self._static.get(destination_id)

    async def lookup(self, destination_id: str, member: str) -> Destination | None:
        found = self._static.get(destination_id)
        if found is not None:
            return found
        for directory in self._attached:
            found = await directory.lookup(destination_id, member)
            if found is not None:
                return found
        return None

    async def listing(self, member: str) -> list[Destination]:
        out = list(self._static.values())
        for directory in self._attached:
            out.extend(d for d in await directory.listing(member) if d.id not in self._static)
        return out

    async def provider_refusal(self, member: str, destination: Destination) -> str | None:
        """The refusal of the directory that declared ``destination``, if any."""
        for directory in self._attached:
            if directory.provider == destination.provider:
                return await directory.refusal(member, destination)
        return None

    async def bind_call(self, member: str, destination: Destination, tool: str,
                        arguments: Mapping[str, object]) -> CallBinding | str:
        """A form bound to one call, through the directory that declared ``destination``. A
        static destination has no operations of its own: its forms are per destination."""
        for directory in self._attached:
            if directory.provider == destination.provider:
                return await directory.bind_call(member, destination, tool, arguments)
        return "call_unknown"

    async def call_refusal(self, member: str, destination: Destination,
                           binding: CallBinding) -> str | None:
        for directory in self._attached:
            if directory.provider == destination.provider:
                return await directory.call_refusal(member, destination, binding)
        return "call_unknown"

    def policy_name_known(self, name: str) -> bool:
        return name.startswith(POLICY_PREFIX) and self.get(name[len(POLICY_PREFIX):]) is not None


def destination_from_settings(entry: Mapping[str, object]) -> Destination:
    """One validated ``KAIZEN_CREDENTIAL_DESTINATIONS`` entry as a destination."""
    scheme = entry.get("scheme") or {}
    assert isinstance(scheme, Mapping)
    try:
        destination = Destination(
            id=str(entry["id"]), origin=origin_of(str(entry["origin"])),
            scheme=make_scheme(str(scheme.get("kind", "")), str(scheme.get("name", "") or "")),
            label=str(entry.get("label", "") or ""), enabled=bool(entry.get("enabled", True)),
            ca_file=str(entry.get("ca_file", "") or ""))
        # A client certificate is a TLS thing: plain HTTP (even to a loopback host) could
        # never present it.
        if destination.scheme.kind == "mtls" and not destination.origin.startswith("https:"):
            raise DestinationInvalid("a mutual-TLS destination must be https://")
        if destination.ca_file and not Path(destination.ca_file).is_file():
            raise DestinationInvalid("its ca_file is not a readable file")
        return destination
    except DestinationInvalid as exc:
        raise DestinationInvalid(f"destination {str(entry.get('id'))[:32]!r}: {exc}") from None
