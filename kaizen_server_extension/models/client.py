"""The model gateway: one streamed Chat Completions exchange per model step."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from types import TracebackType
from typing import Any

from kaizen_server_extension.models import errors
from kaizen_server_extension.models.assembly import StepAssembler, ToolArgumentsDelta
from kaizen_server_extension.models.config import GatewayConfig
from kaizen_server_extension.models.content_tools import ContentToolCalls
from kaizen_server_extension.models.payload import RESERVED_KEYS, advertised_tools, build_payload
from kaizen_server_extension.models.sse import DONE, iter_sse_data
from kaizen_server_extension.models.transport import ModelTransport, Reply
from kaizen_server_extension.protocol.model import StepEvent, StepSnapshot

log = logging.getLogger(__name__)


class ModelGateway:
    """Streams model steps from an OpenAI-compatible endpoint.

    Failures surface only as :class:`ModelStepError` with a content-free code; the original
    exception is deliberately not chained, so neither provider text nor request details
    can reach a log line or trace through ``__cause__``.
    """

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self._transport = ModelTransport(config)

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def warm(self, prefix: StepSnapshot | None = None) -> None:
        """Load the HTTP transport (aiohttp) now, off the event loop, rather than on the
        member's first question; ``prefix`` is for in-process models and is not sent."""
        await self._transport.warm()

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
        # ASCII-escaped JSON (a UTF-8 encoder fails on an unpaired surrogate from an earlier
        # answer or tool result): any text reaches the model.
        body = json.dumps(payload).encode("ascii")
        async with self._transport.exchange(
                "POST", self.config.chat_completions_url, body=body,
                headers={**self._headers(), "Content-Type": "application/json"}) as reply:
            if reply.status >= 300:
                error_body = _safe_json(await reply.body())
                log.info("model step %s failed: HTTP %s", snapshot.step, reply.status)
                raise errors.classify_status(reply.status, error_body) from None
            if reply.content_type.startswith("application/json"):
                events = assembler.feed_completion(_parse_json(await reply.body()))
                for event in events:
                    for filtered in content_calls.feed(event):
                        yield filtered
                return
            async for streamed in _stream_events(reply, assembler):
                if isinstance(streamed, ToolArgumentsDelta):
                    yield streamed  # an observer's live fragment, never a call
                    continue
                for filtered in content_calls.feed(streamed):
                    yield filtered

    async def list_models(self) -> list[str]:
        """Model ids the provider offers (``GET /models``)."""
        async with self._transport.exchange("GET", self.config.models_url, body=None,
                                            headers=self._headers()) as reply:
            raw = await reply.body()
        if reply.status >= 300:
            raise errors.classify_status(reply.status, _safe_json(raw))
        body = _parse_json(raw)
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
    reply: Reply, assembler: StepAssembler
) -> AsyncIterator[StepEvent | ToolArgumentsDelta]:
    saw_done = False
    async with aclosing(reply.lines()) as lines, aclosing(iter_sse_data(lines)) as events:
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
        await reply.drain()
    for event in assembler.finish():
        yield event


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
