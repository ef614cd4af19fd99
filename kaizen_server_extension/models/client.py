"""The model gateway: one streamed Chat Completions exchange per model step."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import httpx

from kaizen_server_extension.models import errors
from kaizen_server_extension.models.assembly import StepAssembler, ToolArgumentsDelta
from kaizen_server_extension.models.config import GatewayConfig
from kaizen_server_extension.models.content_tools import ContentToolCalls
from kaizen_server_extension.models.payload import RESERVED_KEYS, advertised_tools, build_payload
from kaizen_server_extension.models.sse import DONE, iter_sse_data
from kaizen_server_extension.protocol.model import StepEvent, StepSnapshot

log = logging.getLogger(__name__)

#: What is read (and ignored) after ``[DONE]`` while the response runs to its end.
MAX_EVENTS_AFTER_DONE = 8
DRAIN_AFTER_DONE_S = 0.05


class ModelGateway:
    """Streams model steps from an OpenAI-compatible endpoint.

    Failures surface only as :class:`ModelStepError` with a content-free code; the original
    exception is deliberately not chained, so neither provider text nor request details
    can reach a log line or trace through ``__cause__``.
    """

    def __init__(self, config: GatewayConfig, *, client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(
                connect=config.connect_timeout,
                read=config.read_timeout,
                write=config.read_timeout,
                pool=config.connect_timeout,
            )
        )

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> ModelGateway:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def stream_step(
        self, snapshot: StepSnapshot, *, model: str | None = None
    ) -> AsyncIterator[StepEvent]:
        """Send ``snapshot`` and yield its events; the last one is always ``StepFinished``.

        An exchange with neither text nor tool call is *not* an error here: the controller
        decides about empty steps from what it received (R-008).
        """
        async for event in self._step_events(snapshot, model, live_arguments=False):
            if not isinstance(event, ToolArgumentsDelta):
                yield event

    def stream_step_with_arguments(
        self, snapshot: StepSnapshot, *, model: str | None = None
    ) -> AsyncIterator[StepEvent | ToolArgumentsDelta]:
        """:meth:`stream_step` plus each streamed tool-argument fragment as it arrives, for
        the trusted artifact checkpoint observer (lanes.artifact_stream), which consumes them.
        Complete calls are still emitted only once the exchange has completed."""
        return self._step_events(snapshot, model, live_arguments=True)

    async def _step_events(
        self, snapshot: StepSnapshot, model: str | None, *, live_arguments: bool
    ) -> AsyncIterator[StepEvent | ToolArgumentsDelta]:
        chosen_model = model or self.config.model
        payload = self._payload(snapshot, chosen_model)
        assembler = StepAssembler(step=snapshot.step, requested_model=chosen_model,
                                  live_arguments=live_arguments)
        # JSON tool calls sent as content count only when no native tool_calls came.
        content_calls = ContentToolCalls(advertised_tools(snapshot), step=snapshot.step)
        try:
            # ASCII-escaped JSON (httpx's json= writes UTF-8, which an unpaired surrogate from
            # an earlier answer or tool result cannot be encoded in): any text reaches the model.
            async with self._client.stream(
                "POST", self.config.chat_completions_url, content=json.dumps(payload),
                headers={**self._headers(), "Content-Type": "application/json"}
            ) as response:
                if response.status_code >= 300:
                    body = await _read_error_body(response)
                    log.info("model step %s failed: HTTP %s", snapshot.step, response.status_code)
                    raise errors.classify_status(response.status_code, body) from None
                content_type = response.headers.get("content-type", "")
                if content_type.startswith("application/json"):
                    events = assembler.feed_completion(_parse_json(await response.aread()))
                    for event in events:
                        for filtered in content_calls.feed(event):
                            yield filtered
                    return
                async for streamed in _stream_events(response, assembler):
                    if isinstance(streamed, ToolArgumentsDelta):
                        yield streamed  # an observer's live fragment, never a call
                        continue
                    for filtered in content_calls.feed(streamed):
                        yield filtered
        except (httpx.RequestError, httpx.InvalidURL) as exc:
            log.info("model step %s failed: %s", snapshot.step, type(exc).__name__)
            raise errors.classify_transport(exc) from None

    async def list_models(self) -> list[str]:
        """Model ids the provider offers (``GET /models``)."""
        try:
            response = await self._client.get(self.config.models_url, headers=self._headers())
        except (httpx.RequestError, httpx.InvalidURL) as exc:
            raise errors.classify_transport(exc) from None
        if response.status_code >= 300:
            raise errors.classify_status(response.status_code, _safe_json(response.content))
        body = _parse_json(response.content)
        entries = body.get("data") if isinstance(body, dict) else None
        if not isinstance(entries, list):
            raise errors.step_error(errors.MALFORMED_RESPONSE)
        return [e["id"] for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]

    def _payload(self, snapshot: StepSnapshot, model: str) -> dict[str, Any]:
        extras = {k: v for k, v in self.config.extra_params.items() if k not in RESERVED_KEYS}
        return {**extras, **build_payload(snapshot, model)}

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream, application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers


async def _stream_events(
    response: httpx.Response, assembler: StepAssembler
) -> AsyncIterator[StepEvent | ToolArgumentsDelta]:
    saw_done = False
    events = iter_sse_data(response.aiter_lines())
    async for data in events:
        if data.strip() == DONE:
            saw_done = True
            break
        for event in assembler.feed_chunk(_parse_json(data)):
            yield event
    # Without [DONE], only a finish_reason proves the provider meant to stop here; some
    # servers omit [DONE], but a stream that just ends without either was cut short.
    if not saw_done and assembler.finish_reason is None:
        raise errors.step_error(errors.STREAM_INTERRUPTED)
    if saw_done:
        await _read_to_end(events)
    for event in assembler.finish():
        yield event


async def _read_to_end(events: AsyncIterator[str]) -> None:
    """Read what follows ``[DONE]`` (normally only the end of the body, already received)
    so the connection goes back to the pool: a response closed mid-body is dropped, and the
    next step would connect anew. Whatever comes is ignored; a server that does not end the
    body promptly, or breaks the connection now, is cut off as before: the step is whole."""
    with contextlib.suppress(TimeoutError, httpx.TransportError):
        async with asyncio.timeout(DRAIN_AFTER_DONE_S):
            seen = 0
            async for _ in events:
                seen += 1
                if seen > MAX_EVENTS_AFTER_DONE:
                    return


async def _read_error_body(response: httpx.Response) -> Any:
    try:
        return _safe_json(await response.aread())
    except httpx.RequestError:
        return None


def _parse_json(raw: bytes | str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise errors.step_error(errors.MALFORMED_RESPONSE) from None


def _safe_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None
