"""The HTTP client of one streamable-HTTP MCP session: the one place Kaizen reaches an MCP
server over the network (docs/mcp.md, "Egress").

Every session — a run's shared one, a credentialed call's own, a discovery listing — gets a
client built here, so the same rules hold for each:

* no environment proxies or ``.netrc`` (``trust_env`` off), no redirects of the client's
  own (the SDK follows one only within the server's origin), no cookies kept between
  sessions (a client lives for one session);
* a credential, when the broker hands one over, is applied to this client's headers only
  (``credential.apply``), so it rides on this session's requests and no other;
* **under the deployment's signed egress policy** (:class:`McpEgressGate`, built when
  ``KAIZEN_OPENAPI_EGRESS_POLICY_FILE`` or ``_KEY`` is set): before anything is resolved or
  sent, the server's URL must be ``https`` and its origin listed in the policy in force, the
  port allowed and every address the host resolves to allowed by both the signed policy and
  ``KAIZEN_OPENAPI_EGRESS_NETWORKS`` — the external OpenAPI sources' own door
  (``tools/egress.py``, R-379, R-381), asked the same question. The connection is then pinned
  to the address that was checked (TLS still verifies the server's host name), so a second
  DNS answer cannot move it, and a request to any other origin is refused by the transport.
  No policy, an invalid, expired or not-yet-valid one, or an origin it does not list: the
  session is refused (fail closed) and nothing is sent;
* responses are watched for ``401``/``403`` (:class:`AuthWatch`), so a listing the server
  refused for want of a credential is told apart from a server that is down.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kaizen_server_extension.tools.egress import EgressFailed, EgressRefused, IPAddress, Origin

if TYPE_CHECKING:
    import httpx2

    from kaizen_server_extension.tools.egress import Egress, RequestCredential

#: Connect/write bound of one MCP HTTP request (the read bound is the SDK's stream timeout).
MAX_CONNECT_S = 30.0


class McpEgressRefused(EgressRefused):
    """The signed egress policy refused the MCP server: nothing was resolved or sent."""


@dataclass(slots=True)
class AuthWatch:
    """The HTTP statuses of one session that said "not without a credential"."""

    statuses: list[int] = field(default_factory=list)

    async def __call__(self, response: httpx2.Response) -> None:
        if response.status_code in (401, 403):
            self.statuses.append(response.status_code)

    @property
    def refused(self) -> bool:
        return bool(self.statuses)


class McpEgressGate:
    """The signed egress policy as MCP HTTP servers answer to it (see the module docstring).
    ``pin`` is the one question; it raises :class:`McpEgressRefused` or returns the checked
    address and the TLS context the connection uses."""

    def __init__(self, egress: Egress) -> None:
        self._egress = egress

    async def pin(self, url: str) -> tuple[Origin, IPAddress]:
        parts = urlsplit(url)
        if parts.scheme != "https":
            # The policy lists https origins only: a plain-http server cannot be in it.
            raise McpEgressRefused(
                "This MCP server is not reached over https, so this server's signed egress "
                "policy cannot allow it. An administrator must serve it over https and add "
                "its origin to the policy.", code="egress_origin_not_in_policy")
        origin = Origin.of(url)
        try:
            address = await self._egress.resolve(origin)
        except EgressRefused as refused:
            raise McpEgressRefused(str(refused), code=refused.code) from None
        except EgressFailed:
            raise  # the name did not resolve: the server is unreachable, nothing was sent
        return origin, address

    @property
    def tls(self) -> ssl.SSLContext:
        return self._egress.tls


def _pinned_transport(origin: Origin, address: IPAddress, verify: ssl.SSLContext) -> Any:
    import httpx2

    host = str(address)

    class PinnedTransport(httpx2.AsyncBaseTransport):
        """Every request goes to ``origin`` at the checked ``address``, or is refused."""

        def __init__(self) -> None:
            self._inner = httpx2.AsyncHTTPTransport(verify=verify, retries=0)

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            url = request.url
            if url.scheme != "https" or (url.host or "").lower() != origin.host \
                    or (url.port or 443) != origin.port:
                raise McpEgressRefused("An MCP request would leave the server's origin; it "
                                       "was not sent.", code="egress_path_refused")
            # The Host header keeps the name; TLS verifies the name (SNI), not the address.
            request.url = url.copy_with(host=host)
            request.extensions = {**request.extensions, "sni_hostname": origin.host}
            return await self._inner.handle_async_request(request)

        async def aclose(self) -> None:
            await self._inner.aclose()

    return PinnedTransport()


async def session_client(url: str, *, timeout_s: float, gate: McpEgressGate | None,
                         credential: RequestCredential | None = None,
                         watch: Callable[[httpx2.Response], Awaitable[None]] | None = None,
                         ) -> httpx2.AsyncClient:
    """The client of one MCP HTTP session to ``url`` (see the module docstring). Raises
    :class:`McpEgressRefused` when the signed policy refuses it (nothing sent)."""
    import httpx2
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT

    transport = None
    if gate is not None:
        origin, address = await gate.pin(url)
        transport = _pinned_transport(origin, address, gate.tls)
    headers: dict[str, str] = {}
    if credential is not None:
        credential.apply(headers)
    return httpx2.AsyncClient(
        headers=headers, trust_env=False, follow_redirects=False, transport=transport,
        event_hooks={"response": [watch]} if watch is not None else None,
        timeout=httpx2.Timeout(min(timeout_s, MAX_CONNECT_S),
                               read=max(timeout_s, MCP_DEFAULT_SSE_READ_TIMEOUT)))


__all__ = ["AuthWatch", "McpEgressGate", "McpEgressRefused", "session_client"]
