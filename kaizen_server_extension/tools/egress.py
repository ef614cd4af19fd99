"""Egress to external OpenAPI sources: the one door every request to a source goes through.

Fetching a source's schema and calling one of its operations both end in :meth:`Egress.send`,
and nothing else in Kaizen opens a connection to a source. What it enforces (docs/openapi-
sources.md, "Egress"):

* **The registered origin only** (R-343): the caller names an :class:`Origin` (``https``, a
  host and a port, fixed when the source was registered) and a path that is already templated;
  a path that could name another host (``//host``, a scheme, a backslash) is refused, and the
  URL actually sent is checked to be on that origin. Redirects are never followed (R-380).
* **The signed egress policy** (R-379): before anything is resolved, the deployment's signed
  policy (``tools/egress_policy.py``, :class:`EgressCeiling`) must be in force and list the
  origin exactly; without one every request is refused. Enabling sources is not network
  authority.
* **The egress policy** (R-381): the port must be allowed, the host is resolved once per
  request and *every* address it resolves to must be globally routable or inside a network
  listed both in the server's settings and in the signed policy (loopback, private,
  link-local, multicast, reserved and unspecified addresses are protected); the connection
  is then pinned to the first of them, with TLS still verifying the registered host name,
  so a second DNS answer cannot move it elsewhere.
* **Fixed headers** (R-343, R-382): ``Accept``, ``User-Agent`` and, with a body,
  ``Content-Type``; for a schema revalidation ``If-None-Match``. No header, host, cookie or URL
  ever comes from a model's arguments or the member's request, no identity of the member or of
  the server is forwarded, cookies a source sets are never stored, and the environment's
  proxies and ``.netrc`` are ignored.
* **Bounds**: a timeout on every request and a byte bound on every response body.

The credential seam (issue 19, item 3): :meth:`Egress.send` takes an optional
``credential`` — any object with ``apply(headers)`` and ``apply_query(params)``
(:class:`RequestCredential`) — which adds what a resolved credential needs to that one
outgoing request after the fixed headers are set and before it is sent (a query-string key
only under the query-auth ceiling, R-384, replacing a same-named parameter). Sources
are registered uncredentialed; the credential quarantine attaches a resolved
``credential_ref`` here and nowhere else, so the value never passes through the model, the
tool arguments or the result.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
from collections import OrderedDict
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import httpx

from kaizen_server_extension._version import __version__
from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.tools.mtls import (
    CarriesClientCertificate,
    ClientCertificate,
    load_client_certificate,
)

if TYPE_CHECKING:
    from kaizen_server_extension.tools.egress_policy import EgressCeiling, SignedEgressPolicy

log = logging.getLogger("kaizen.tools.egress")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

USER_AGENT = f"kaizen-openapi-sources/{__version__}"
#: Pinned clients kept for reuse (one per host, port and pinned address: a kept-alive TLS
#: connection is never shared between two host names).
MAX_CLIENTS = 64
_READ_CHUNK = 64 * 1024


class EgressRefused(MemberSafeError):
    """The egress policy refused the request before anything was sent."""

    def __init__(self, message: str, *, code: str = "egress_refused") -> None:
        super().__init__(message, code=code)


class EgressFailed(Exception):
    """The request failed in transport. ``sent`` says whether it may have reached the source
    (then a write's outcome is unknown)."""

    def __init__(self, kind: str, *, sent: bool) -> None:
        super().__init__(kind)
        self.kind = kind
        self.sent = sent


class _UrlQueryWithheld(logging.Filter):
    """httpx logs every request's URL at INFO. A source's query string may carry a credential
    under the query-auth ceiling (R-384), so a logged URL never shows its query: an operator
    who turns httpx's INFO lines on still gets no credential in the log (R-391)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(isinstance(a, httpx.URL) and a.query for a in args):
            record.args = tuple(a.copy_with(query=None) if isinstance(a, httpx.URL) else a
                                for a in args)
        return True


_HTTPX_LOG_FILTER = _UrlQueryWithheld()
if not any(isinstance(f, _UrlQueryWithheld) for f in logging.getLogger("httpx").filters):
    logging.getLogger("httpx").addFilter(_HTTPX_LOG_FILTER)


class RequestCredential(Protocol):
    """What a resolved credential adds to one outgoing request (the seam of issue 19, item 3):
    its headers, and for a query-string API key (only under the query-auth ceiling, R-384)
    its query parameter. One that also has ``client_certificate()`` (``tools/mtls.py``)
    presents a client certificate on that request's own TLS connection."""

    def apply(self, headers: MutableMapping[str, str]) -> None: ...

    def apply_query(self, params: MutableMapping[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class Origin:
    """``https://host:port``: where a source's requests may go, fixed at registration."""

    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError("not an https URL with a host")
        return cls(parts.hostname.lower(), parts.port or 443)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}" if self.port == 443 else f"https://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class OutgoingRequest:
    """One request on an origin; ``path`` is absolute on it (``/v1/items/42``), already
    percent-encoded; ``query`` pairs are encoded by the client."""

    method: str
    path: str
    query: Sequence[tuple[str, str]] = ()
    json_body: Any = None
    has_body: bool = False
    accept: str = "application/json, text/plain;q=0.9, */*;q=0.1"
    if_none_match: str | None = None


@dataclass(frozen=True, slots=True)
class EgressResponse:
    status: int
    content_type: str
    etag: str | None
    body: bytes
    #: The body was longer than the bound: ``body`` holds the first ``max_bytes``.
    truncated: bool


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """The administrator's network ceiling for sources (settings ``KAIZEN_OPENAPI_EGRESS_*``)."""

    networks: tuple[IPNetwork, ...] = ()
    ports: frozenset[int] = frozenset({443})
    ca_file: str = ""
    timeout_s: float = 30.0

    @classmethod
    def build(cls, networks: Iterable[str], ports: Iterable[int], *, ca_file: str = "",
              timeout_s: float = 30.0) -> EgressPolicy:
        return cls(tuple(ipaddress.ip_network(n) for n in networks), frozenset(ports),
                   ca_file, timeout_s)

    def check_port(self, origin: Origin) -> None:
        if origin.port not in self.ports:
            raise EgressRefused(f"Port {origin.port} is not allowed for external sources "
                                "on this server.", code="egress_port_refused")

    def address_allowed(self, address: IPAddress) -> bool:
        """Inside a listed network, or (none listed containing it) globally routable."""
        if any(address in network for network in self.networks):
            return True
        return address.is_global and not address.is_multicast

    def check_literal(self, origin: Origin) -> None:
        """Refuse an origin whose host is an address outside the policy (without resolving)."""
        try:
            address = ipaddress.ip_address(origin.host)
        except ValueError:
            return
        if not self.address_allowed(address):
            raise EgressRefused("That address is protected: external sources cannot be "
                                "reached there.", code="egress_address_refused")


def _checked_path(path: str) -> str:
    """A path that stays on the origin it is appended to, else refused."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path \
            or any(ord(ch) < 33 or ord(ch) == 127 for ch in path) or "#" in path \
            or "?" in path:
        raise EgressRefused("The request path would leave the source's origin.",
                            code="egress_path_refused")
    return path


class Egress:
    """The pinned, bounded HTTPS client for sources (see the module docstring)."""

    def __init__(self, policy: EgressPolicy, ceiling: EgressCeiling) -> None:
        self._policy = policy
        # The signed egress policy: required, so no Egress exists without one.
        self._ceiling = ceiling
        self._clients: OrderedDict[tuple[str, int, str], httpx.AsyncClient] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        self._ssl = self._ssl_context(policy.ca_file)

    @property
    def policy(self) -> EgressPolicy:
        return self._policy

    @staticmethod
    def _ssl_context(ca_file: str) -> ssl.SSLContext:
        context = ssl.create_default_context()
        if ca_file:
            context.load_verify_locations(cafile=ca_file)
        return context

    @property
    def ceiling(self) -> EgressCeiling:
        return self._ceiling

    @property
    def tls(self) -> ssl.SSLContext:
        """The TLS context sources are verified with (the system's CAs and
        ``KAIZEN_OPENAPI_CA_FILE``'s); MCP HTTP servers under the policy use it too."""
        return self._ssl

    async def resolve(self, origin: Origin) -> IPAddress:
        """The address the request is pinned to: the signed policy must be in force and list
        the origin (R-379), the port must be allowed, and every address the host resolves to
        must be allowed by both policies (one protected answer refuses the host)."""
        signed = self._ceiling.check(origin)
        self._policy.check_port(origin)
        try:
            return self._allowed([ipaddress.ip_address(origin.host)], signed)
        except ValueError:
            pass
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(origin.host, origin.port, type=socket.SOCK_STREAM)
        except OSError:
            raise EgressFailed("name_resolution", sent=False) from None
        addresses = []
        for info in infos:
            raw = info[4][0]
            address = ipaddress.ip_address(raw.split("%", 1)[0] if isinstance(raw, str) else raw)
            if address not in addresses:
                addresses.append(address)
        return self._allowed(addresses, signed)

    def _allowed(self, addresses: Sequence[IPAddress],
                 signed: SignedEgressPolicy) -> IPAddress:
        if not addresses or not all(self._policy.address_allowed(a)
                                    and signed.address_allowed(a) for a in addresses):
            raise EgressRefused("That host resolves to a protected address: external sources "
                                "cannot be reached there.", code="egress_address_refused")
        return addresses[0]

    def _client(self, origin: Origin, address: IPAddress) -> httpx.AsyncClient:
        key = (origin.host, origin.port, str(address))
        client = self._clients.get(key)
        if client is not None:
            self._clients.move_to_end(key)
            return client
        # No cookie is ever kept: a source's Set-Cookie must not reach its next request,
        # which may be another member's.
        jar = CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
        client = httpx.AsyncClient(
            verify=self._ssl, follow_redirects=False, trust_env=False,
            cookies=httpx.Cookies(jar),
            timeout=httpx.Timeout(self._policy.timeout_s),
            limits=httpx.Limits(max_connections=8, max_keepalive_connections=4))
        self._clients[key] = client
        while len(self._clients) > MAX_CLIENTS:
            _, old = self._clients.popitem(last=False)
            closing = asyncio.get_running_loop().create_task(old.aclose())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        return client

    def _certificate_client(self, material: ClientCertificate) -> httpx.AsyncClient:
        context = self._ssl_context(self._policy.ca_file)
        load_client_certificate(context, material)
        jar = CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
        return httpx.AsyncClient(
            verify=context, follow_redirects=False, trust_env=False,
            cookies=httpx.Cookies(jar), timeout=httpx.Timeout(self._policy.timeout_s),
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=0))

    async def send(self, origin: Origin, request: OutgoingRequest, *, max_bytes: int,
                   credential: RequestCredential | None = None) -> EgressResponse:
        """Send ``request`` to ``origin`` and read at most ``max_bytes`` of its body.

        Raises :class:`EgressRefused` when the policy refuses it (nothing was sent) and
        :class:`EgressFailed` on a transport failure. A redirect is returned as it is (its
        status), never followed."""
        path = _checked_path(request.path)
        address = await self.resolve(origin)
        host = f"[{address}]" if address.version == 6 else str(address)
        query = list(request.query)
        if credential is not None:
            injected: dict[str, Any] = {}
            credential.apply_query(injected)
            # The credential's parameter replaces any same-named one, never joins it.
            query = [(k, v) for k, v in query if k not in injected]
            query.extend((k, str(v)) for k, v in injected.items())
        url = httpx.URL(f"https://{host}:{origin.port}{path}", params=query or None)
        if url.host.strip("[]") != str(address) or url.port != origin.port \
                or url.scheme != "https":
            raise EgressRefused("The request would leave the source's origin.",
                                code="egress_path_refused")
        headers: dict[str, str] = {
            "Host": origin.host if origin.port == 443 else f"{origin.host}:{origin.port}",
            "Accept": request.accept,
            "User-Agent": USER_AGENT,
        }
        if request.if_none_match:
            headers["If-None-Match"] = request.if_none_match
        content: bytes | None = None
        if request.has_body:
            import json

            content = json.dumps(request.json_body, ensure_ascii=False).encode()
            headers["Content-Type"] = "application/json"
        if credential is not None:
            credential.apply(headers)
        material = credential.client_certificate() \
            if isinstance(credential, CarriesClientCertificate) else None
        if material is None:
            client, own = self._client(origin, address), False
        else:
            # A client certificate is this request's own: a fresh TLS context and client,
            # never pooled, so no later request rides on its connection.
            client, own = self._certificate_client(material), True
        try:
            built = client.build_request(request.method, url, headers=headers,
                                         content=content,
                                         extensions={"sni_hostname": origin.host})
            # httpx adds its own defaults (Accept-Encoding, Connection): none identifies
            # anyone.
            try:
                response = await client.send(built, stream=True)
            except httpx.ConnectError:
                raise EgressFailed("connect", sent=False) from None
            except httpx.ConnectTimeout:
                raise EgressFailed("connect_timeout", sent=False) from None
            except (httpx.HTTPError, OSError) as exc:
                # OSError: a TLS alert after the handshake (a server refusing the client's
                # certificate under TLS 1.3) reaches us unwrapped; the request may have gone.
                raise EgressFailed(type(exc).__name__, sent=True) from None
            try:
                body, truncated = await _bounded_body(response, max_bytes)
            except (httpx.HTTPError, OSError) as exc:
                raise EgressFailed(type(exc).__name__, sent=True) from None
            finally:
                await response.aclose()
        finally:
            if own:
                await client.aclose()
        return EgressResponse(
            status=response.status_code,
            content_type=response.headers.get("content-type", "")[:200],
            etag=_etag(response.headers),
            body=body, truncated=truncated)

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            await client.aclose()


async def _bounded_body(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes(_READ_CHUNK):
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            return b"".join(chunks)[:max_bytes], True
    return b"".join(chunks), False


def _etag(headers: Mapping[str, str]) -> str | None:
    value = headers.get("etag")
    if value is None or len(value) > 512 or any(ord(ch) < 32 for ch in value):
        return None
    return value


__all__ = ["Egress", "EgressFailed", "EgressPolicy", "EgressRefused", "EgressResponse",
           "Origin", "OutgoingRequest", "RequestCredential"]
