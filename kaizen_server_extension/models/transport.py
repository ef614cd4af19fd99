"""The model gateway's HTTP transport: one kept-alive aiohttp session per gateway.

aiohttp rather than httpx for this one exchange: a streamed Chat Completions request costs
about 0.45 ms of CPU through aiohttp (its C HTTP parser) against about 1.9 ms through
``httpx.AsyncClient`` on the development machine, and the model exchange happens at every
step of every turn (bench/README.md, issue 16). Everything else that speaks HTTP keeps
httpx. aiohttp is imported on the first model request, not at start-up.

Failures leave this module only as :class:`ModelStepError` with a content-free code
(:func:`classify_transport`); the original exception is not chained.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kaizen_server_extension.models import errors
from kaizen_server_extension.models.config import GatewayConfig
from kaizen_server_extension.protocol.model import ModelStepError

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)

#: A single SSE line longer than this is not a provider we can trust to stream sanely.
MAX_LINE_BYTES = 16 * 1024 * 1024
#: What is read (and ignored) after ``[DONE]`` while the response runs to its end.
MAX_BYTES_AFTER_DONE = 64 * 1024
DRAIN_AFTER_DONE_S = 0.05


@dataclass(slots=True)
class Reply:
    """An answer whose status and headers arrived; its body is read through the methods."""

    status: int
    content_type: str
    _response: aiohttp.ClientResponse

    async def body(self) -> bytes:
        return await self._response.read()

    async def lines(self) -> AsyncGenerator[str, None]:
        """The body's lines (``\\n`` or ``\\r\\n`` ended), decoded as UTF-8."""
        pending = b""
        async for chunk in self._response.content.iter_any():
            pending += chunk
            if b"\n" not in chunk:
                if len(pending) > MAX_LINE_BYTES:
                    raise errors.step_error(errors.MALFORMED_RESPONSE)
                continue
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if pending:
            yield pending.rstrip(b"\r").decode("utf-8", "replace")

    async def drain(self) -> None:
        """Read what follows the end of the stream (normally only the end of the chunked
        body, already received) so the connection goes back to the pool: a response closed
        mid-body is dropped, and the next step would connect anew. Bounded in bytes and
        time; whatever comes is ignored."""
        import aiohttp

        content = self._response.content
        seen = 0
        try:
            async with asyncio.timeout(DRAIN_AFTER_DONE_S):
                while seen <= MAX_BYTES_AFTER_DONE:
                    chunk = await content.readany()
                    if not chunk:
                        return
                    seen += len(chunk)
        except (TimeoutError, OSError, aiohttp.ClientError):
            return


class ModelTransport:
    """POSTs to the provider over one connection pool, created in the running loop on the
    first request (an aiohttp session belongs to the loop it was made in)."""

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._session: aiohttp.ClientSession | None = None
        # As httpx did, the environment's proxy settings (HTTPS_PROXY, NO_PROXY, ...) apply
        # to the provider; read once here, not per request as aiohttp's trust_env would (a
        # thread hand-off per request).
        self._proxy = _env_proxy_for(config.base_url)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def warm(self) -> None:
        """Import aiohttp and load the CA bundle in a worker thread (0.1 to 0.2 s), then open
        the session."""
        await asyncio.get_running_loop().run_in_executor(None, _prepare)
        self._open()

    def _open(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=_ssl_context(), limit=100),
                timeout=aiohttp.ClientTimeout(total=None,
                                              connect=self._config.connect_timeout,
                                              sock_read=self._config.read_timeout),
                # No cookies: a provider's Set-Cookie never comes back with a later step.
                cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    def exchange(self, method: str, url: str, *, body: bytes | None,
                 headers: Mapping[str, str]) -> _Exchange:
        """``async with transport.exchange(...) as reply:`` — the connection is released
        (to the pool when the body was read to its end) when the block ends."""
        return _Exchange(self, method, url, body, headers)


class _Exchange:
    def __init__(self, transport: ModelTransport, method: str, url: str, body: bytes | None,
                 headers: Mapping[str, str]) -> None:
        self._transport = transport
        self._request = (method, url, body, dict(headers))
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> Reply:
        method, url, body, headers = self._request
        try:
            session = self._transport._open()
            self._response = await session.request(method, url, data=body, headers=headers,
                                                   allow_redirects=False,
                                                   proxy=self._transport._proxy)
        except Exception as exc:
            raise _failed(exc) from None
        response = self._response
        return Reply(response.status, response.headers.get("Content-Type", ""), response)

    async def __aexit__(self, exc_type: object, exc: BaseException | None,
                        tb: object) -> bool:
        if self._response is not None:
            self._response.release()
        # A transport failure while the body was read becomes a content-free step error.
        if exc is not None and not isinstance(exc, ModelStepError | asyncio.CancelledError) \
                and isinstance(exc, Exception) and _is_transport_error(exc):
            raise _failed(exc) from None
        return False


def _failed(exc: Exception) -> ModelStepError:
    error = classify_transport(exc)
    if error is not exc:  # the exception's type only: its text may hold provider details
        log.info("model request failed: %s (%s)", type(exc).__name__, error.code)
    return error


def classify_transport(exc: BaseException) -> ModelStepError:
    """A failure below HTTP: refused connection, timeout, cut stream, unusable URL."""
    import aiohttp

    if isinstance(exc, ModelStepError):
        return exc
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return errors.step_error(errors.MISCONFIGURED)
    if isinstance(exc, TimeoutError):  # aiohttp's connect and read timeouts are these too
        return errors.step_error(errors.TIMEOUT)
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ClientProxyConnectionError
                  | aiohttp.ClientHttpProxyError):
        return errors.step_error(errors.CONNECT_FAILED)
    return errors.step_error(errors.STREAM_INTERRUPTED)


def _is_transport_error(exc: Exception) -> bool:
    import aiohttp

    return isinstance(exc, aiohttp.ClientError | OSError | TimeoutError)


def _prepare() -> None:
    import aiohttp  # noqa: F401

    _ssl_context()


def _env_proxy_for(url: str) -> str | None:
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(url)
    if parts.hostname is None or proxy_bypass(parts.hostname):
        return None
    return getproxies().get(parts.scheme)


_SSL_CONTEXT: ssl.SSLContext | None = None


def _ssl_context() -> ssl.SSLContext:
    """The CA bundle httpx would have used: ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` when the
    environment names one, else certifi's."""
    global _SSL_CONTEXT
    if _SSL_CONTEXT is None:
        cafile = os.environ.get("SSL_CERT_FILE")
        capath = os.environ.get("SSL_CERT_DIR")
        if cafile or capath:
            _SSL_CONTEXT = ssl.create_default_context(cafile=cafile or None,
                                                      capath=capath or None)
        else:
            import certifi

            _SSL_CONTEXT = ssl.create_default_context(cafile=certifi.where())
    return _SSL_CONTEXT
