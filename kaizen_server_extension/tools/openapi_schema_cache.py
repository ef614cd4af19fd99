"""The schema cache of external OpenAPI sources (R-326, R-327, R-332).

Keyed by schema URL, it holds compiled documents only — operations and their input schemas,
never a response, a credential or anything about a member (R-326) — so two members who
registered the same URL share one entry without sharing anything of theirs.

* **Fresh** for ``fresh_s`` after a fetch or a revalidation: served without a request.
* Then **revalidated** with the entry's ETag (``If-None-Match``); a ``304`` keeps the compiled
  document and restarts its freshness.
* **Single flight**: concurrent readers of one URL share one refresh, whoever asked first.
* **Bounded stale fallback**: when a refresh fails (unreachable, an error status, a document
  that no longer parses) an entry no older than ``fresh_s + stale_s`` is still served and the
  failure is logged; past that, or with no entry, the source gives nothing (fail closed). An
  egress refusal is never answered from the cache: the policy, not the cache, decides where
  requests may go.
* Parsing and compiling run in a worker thread, off the event loop (R-332), and at most
  ``concurrency`` documents are fetched at once (R-401).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.tools.egress import (
    Egress,
    EgressFailed,
    EgressRefused,
    Origin,
    OutgoingRequest,
)
from kaizen_server_extension.tools.openapi_compiler import (
    MAX_DOCUMENT_BYTES,
    CompiledDocument,
    DocumentRejected,
    compile_document,
)

log = logging.getLogger("kaizen.tools.openapi")

MAX_ENTRIES = 256
FETCH_CONCURRENCY = 4
_ACCEPT = "application/json, application/yaml;q=0.9, text/yaml;q=0.9, */*;q=0.1"


class SchemaUnavailable(MemberSafeError):
    """The source's schema cannot be had (and no cached copy may stand in)."""

    def __init__(self, message: str, *, code: str = "openapi_schema_unavailable") -> None:
        super().__init__(message, code=code)


@dataclass(slots=True)
class _Entry:
    document: CompiledDocument
    etag: str | None
    checked_at: float


class SchemaCache:
    def __init__(self, egress: Egress, *, fresh_s: float, stale_s: float,
                 max_entries: int = MAX_ENTRIES, concurrency: int = FETCH_CONCURRENCY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._egress = egress
        self._fresh_s = fresh_s
        self._stale_s = stale_s
        self._max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[CompiledDocument]] = {}
        self._fetches = asyncio.Semaphore(concurrency)

    async def get(self, schema_url: str) -> CompiledDocument:
        """The compiled document of ``schema_url`` (see the module docstring); raises
        :class:`SchemaUnavailable` or :class:`EgressRefused`."""
        entry = self._entries.get(schema_url)
        if entry is not None and self._clock() - entry.checked_at <= self._fresh_s:
            self._entries.move_to_end(schema_url)
            return entry.document
        flight = self._inflight.get(schema_url)
        if flight is None:
            flight = asyncio.ensure_future(self._refresh(schema_url))
            self._inflight[schema_url] = flight
            flight.add_done_callback(lambda _: self._inflight.pop(schema_url, None))
        # One reader giving up (its own timeout) must not cancel the others' refresh.
        return await asyncio.shield(flight)

    async def _refresh(self, schema_url: str) -> CompiledDocument:
        entry = self._entries.get(schema_url)
        try:
            return await self._fetch(schema_url, entry)
        except EgressRefused:
            raise
        except (EgressFailed, DocumentRejected, _BadStatus) as exc:
            reason = _reason(exc)
            if entry is not None and \
                    self._clock() - entry.checked_at <= self._fresh_s + self._stale_s:
                log.warning("OpenAPI schema %s: refresh failed (%s); serving the cached copy",
                            _safe(schema_url), reason)
                return entry.document
            log.warning("OpenAPI schema %s: unavailable (%s)", _safe(schema_url), reason)
            message = (str(exc) if isinstance(exc, DocumentRejected)
                       else "The source's OpenAPI document could not be fetched.")
            code = exc.code if isinstance(exc, DocumentRejected) \
                else "openapi_schema_unavailable"
            raise SchemaUnavailable(message, code=code) from None

    async def _fetch(self, schema_url: str, entry: _Entry | None) -> CompiledDocument:
        parts = urlsplit(schema_url)
        request = OutgoingRequest("GET", parts.path or "/", accept=_ACCEPT,
                                  if_none_match=entry.etag if entry is not None else None)
        async with self._fetches:
            response = await self._egress.send(Origin.of(schema_url), request,
                                               max_bytes=MAX_DOCUMENT_BYTES)
        if response.status == 304 and entry is not None:
            entry.checked_at = self._clock()
            self._entries.move_to_end(schema_url)
            return entry.document
        if response.status != 200:
            raise _BadStatus(response.status)
        if response.truncated:
            raise DocumentRejected("schema_too_large", "The source's OpenAPI document is "
                                   f"larger than {MAX_DOCUMENT_BYTES} bytes.")
        document = await asyncio.to_thread(compile_document, response.body)
        self._entries[schema_url] = _Entry(document, response.etag, self._clock())
        self._entries.move_to_end(schema_url)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
        return document


class _BadStatus(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"status {status}")
        self.status = status


def _reason(exc: BaseException) -> str:
    if isinstance(exc, EgressFailed):
        return f"transport: {exc.kind}"
    if isinstance(exc, DocumentRejected):
        return exc.code
    return str(exc)


def _safe(url: str) -> str:
    """The URL for a log line (registered URLs carry no credentials; bounded anyway)."""
    return url[:300]


__all__ = ["SchemaCache", "SchemaUnavailable"]
