"""A fake OpenAI-compatible Chat Completions server that replays scenario files over HTTP.

Endpoints
---------
``POST /v1/chat/completions``  streaming (SSE, ``stream: true``) or one JSON completion.
``GET  /v1/models``            the configured model ids (``fake-model`` by default).
``GET  /_fake/requests``       ``{"requests": [body, ...]}``: every completion request, in order.
``POST /_fake/reset``          forget recorded requests and attempt counters.
``POST /_fake/scenario``       load a scenario (the JSON body); also resets.

Scenario format
---------------
A scenario is a JSON list of *scripts* (``{"scripts": [...]}`` is accepted too)::

    [
      {"name": "weather", "match": "weather in Paris",
       "responses": [
         {"thinking": "Let me look it up.",
          "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
         {"text": "It is sunny in Paris.", "usage": {"prompt_tokens": 40, "completion_tokens": 7}}
       ]},
      {"responses": [{"text": "Fallback answer."}]}
    ]

*Script choice.* The first script whose ``match`` is a (case-sensitive) substring of the
**last user message** wins; a script without ``match`` matches everything, so put it last.
No matching script answers 500 ``{"error": {"code": "no_script_matched", ...}}``.

*Slot choice.* ``responses[k]`` answers the request in which ``k`` assistant messages follow
the last user message: the first model step of a turn is slot 0, the step after one tool
round is slot 1, and so on. The slot depends only on the request, so concurrent
conversations (different ``match``) each follow their own sequence, and a retry re-sending
the same payload lands on the same slot. A slot past the end answers 500
``scenario_exhausted``.

*Attempts.* A slot may be ``{"attempts": [r0, r1, ...]}``: the i-th request hitting that
slot gets ``r_i`` and the last one repeats forever. ``{"fail_times": N, "error": E, ...}``
is shorthand for ``{"attempts": [{"error": E}] * N + [{...the remaining keys...}]}``: the
first N hits fail, later ones succeed. Hit counters are per (script, slot) and are cleared
by ``/_fake/reset`` and ``/_fake/scenario``.

*Response keys* (all optional; a response with no text and no tool calls is empty):

``text``            str (split into word chunks, one SSE event each) or list of str chunks.
``thinking``        like ``text``; streamed first as ``delta.reasoning_content``.
``thinking_field``  ``"reasoning_content"`` (default) or ``"reasoning"``.
``tool_calls``      list of ``{"name", "arguments": object | raw string, "id"?,
                    "fragments"?: int (argument pieces, default 3)}``.
``usage``           ``{"prompt_tokens", "completion_tokens", "cost"?}``; missing counts are
                    estimated as characters / 4. Sent when the request asks
                    ``stream_options.include_usage`` (always in non-streaming answers).
``empty``           true: explicitly nothing (no text, no tool calls); just ``finish_reason``.
``finish_reason``   default ``"tool_calls"`` with tool calls, else ``"stop"``.
``model``           model id reported back (default: the requested one).
``error``           ``{"status": int, "body"?: object | str, "headers"?: {..}}``: answer
                    with this HTTP error instead (default body: an OpenAI-style error).
``stream_error``    an object sent as ``data: {"error": ...}`` after the content chunks,
                    after which the stream ends (as routers do with HTTP 200 streams).
``delay_ms``        wait before the first byte (headers included).
``chunk_delay_ms``  wait between SSE events.
``cut_after_chunks`` drop the connection after N SSE ``data`` events (the initial role
                    chunk counts). In a non-streaming answer any value drops it at once.
``no_done``         true: end the stream without ``data: [DONE]``.
``non_streaming``   true: answer with one JSON completion even when ``stream`` was asked
                    (as some OpenAI-compatible servers do).

Streaming order: role chunk, thinking chunks, text chunks, tool-call fragments (each call:
one chunk with id and name, then its argument pieces), finish chunk, usage chunk,
``[DONE]``.

Run by hand: ``python -m kaizen_server_extension.testing.fake_openai --scenario FILE
--port 0`` (or ``kaizen-fake-openai``) prints ``{"port": N}`` on stdout once listening;
``--api-key KEY`` makes it answer 401 unless ``Authorization: Bearer KEY`` is sent, and
``--models a,b`` makes it answer 404 ``model_not_found`` for any other model id.

In tests use :class:`FakeOpenAI` (same options as keyword arguments): it serves on an
ephemeral loopback port from a background thread and offers ``base_url`` (ends in ``/v1``),
``requests()``, ``load(scenario)``, ``reset()`` and ``close()``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import tornado.httpserver
import tornado.iostream
import tornado.netutil
import tornado.web

DEFAULT_MODEL = "fake-model"


class ScenarioError(ValueError):
    """The scenario JSON does not follow the documented format."""


# --- Scenario model --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    status: int
    body: Any
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class ToolCallSpec:
    call_id: str | None
    name: str
    arguments: str
    fragments: int


@dataclass(frozen=True, slots=True)
class ResponseSpec:
    text_chunks: tuple[str, ...] = ()
    thinking_chunks: tuple[str, ...] = ()
    thinking_field: str = "reasoning_content"
    tool_calls: tuple[ToolCallSpec, ...] = ()
    usage: Mapping[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    model: str | None = None
    error: ErrorSpec | None = None
    stream_error: Mapping[str, Any] | None = None
    delay_ms: int = 0
    chunk_delay_ms: int = 0
    cut_after_chunks: int | None = None
    no_done: bool = False
    non_streaming: bool = False


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    match: str | None
    slots: tuple[tuple[ResponseSpec, ...], ...]  # per slot: the attempts, last repeats

    def matches(self, last_user_message: str) -> bool:
        return self.match is None or self.match in last_user_message


_RESPONSE_KEYS = frozenset(
    {
        "text", "thinking", "thinking_field", "tool_calls", "usage", "empty", "finish_reason",
        "model", "error", "stream_error", "delay_ms", "chunk_delay_ms", "cut_after_chunks",
        "no_done", "non_streaming",
    }
)  # fmt: skip
_TOOL_CALL_KEYS = frozenset({"id", "name", "arguments", "fragments"})
_ERROR_KEYS = frozenset({"status", "body", "headers"})
_SCRIPT_KEYS = frozenset({"name", "match", "responses"})


def parse_scenario(raw: Any) -> tuple[Script, ...]:
    """Validate a scenario strictly (unknown keys are typos, so they are errors)."""
    if isinstance(raw, Mapping) and set(raw) == {"scripts"}:
        raw = raw["scripts"]
    if not isinstance(raw, list):
        raise ScenarioError("scenario: expected a list of scripts")
    return tuple(_parse_script(item, f"scripts[{i}]") for i, item in enumerate(raw))


def load_scenario_file(path: str | Path) -> tuple[Script, ...]:
    return parse_scenario(json.loads(Path(path).read_text(encoding="utf-8")))


def _parse_script(raw: Any, where: str) -> Script:
    obj = _object(raw, where, _SCRIPT_KEYS)
    match = obj.get("match")
    if match is not None and not isinstance(match, str):
        raise ScenarioError(f"{where}.match: expected a string")
    responses = obj.get("responses")
    if not isinstance(responses, list) or not responses:
        raise ScenarioError(f"{where}.responses: expected a non-empty list")
    name = obj.get("name", where)
    if not isinstance(name, str):
        raise ScenarioError(f"{where}.name: expected a string")
    slots = tuple(_parse_slot(r, f"{where}.responses[{k}]") for k, r in enumerate(responses))
    return Script(name=name, match=match, slots=slots)


def _parse_slot(raw: Any, where: str) -> tuple[ResponseSpec, ...]:
    if isinstance(raw, Mapping) and "attempts" in raw:
        _object(raw, where, frozenset({"attempts"}))
        attempts = raw["attempts"]
        if not isinstance(attempts, list) or not attempts:
            raise ScenarioError(f"{where}.attempts: expected a non-empty list")
        return tuple(_parse_response(a, f"{where}.attempts[{i}]") for i, a in enumerate(attempts))
    if isinstance(raw, Mapping) and "fail_times" in raw:
        times = raw["fail_times"]
        if not isinstance(times, int) or isinstance(times, bool) or times < 1:
            raise ScenarioError(f"{where}.fail_times: expected a positive integer")
        if "error" not in raw:
            raise ScenarioError(f"{where}: fail_times needs an error")
        failure = _parse_response({"error": raw["error"]}, where)
        rest = {k: v for k, v in raw.items() if k not in ("fail_times", "error")}
        return (failure,) * times + (_parse_response(rest, where),)
    return (_parse_response(raw, where),)


def _parse_response(raw: Any, where: str) -> ResponseSpec:
    obj = _object(raw, where, _RESPONSE_KEYS)
    if obj.get("empty") and ("text" in obj or "tool_calls" in obj):
        raise ScenarioError(f"{where}: 'empty' excludes 'text' and 'tool_calls'")
    thinking_field = obj.get("thinking_field", "reasoning_content")
    if thinking_field not in ("reasoning_content", "reasoning"):
        raise ScenarioError(f"{where}.thinking_field: 'reasoning_content' or 'reasoning'")
    tool_calls = obj.get("tool_calls", [])
    if not isinstance(tool_calls, list):
        raise ScenarioError(f"{where}.tool_calls: expected a list")
    usage = obj.get("usage", {})
    if not isinstance(usage, Mapping):
        raise ScenarioError(f"{where}.usage: expected an object")
    stream_error = obj.get("stream_error")
    if stream_error is not None and not isinstance(stream_error, Mapping):
        raise ScenarioError(f"{where}.stream_error: expected an object")
    finish_reason = obj.get("finish_reason")
    model = obj.get("model")
    for key, value in (("finish_reason", finish_reason), ("model", model)):
        if value is not None and not isinstance(value, str):
            raise ScenarioError(f"{where}.{key}: expected a string")
    cut = obj.get("cut_after_chunks")
    return ResponseSpec(
        text_chunks=_chunks(obj.get("text"), f"{where}.text"),
        thinking_chunks=_chunks(obj.get("thinking"), f"{where}.thinking"),
        thinking_field=thinking_field,
        tool_calls=tuple(
            _parse_tool_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(tool_calls)
        ),
        usage=dict(usage),
        finish_reason=finish_reason,
        model=model,
        error=_parse_error(obj["error"], f"{where}.error") if "error" in obj else None,
        stream_error=stream_error,
        delay_ms=_non_negative(obj.get("delay_ms", 0), f"{where}.delay_ms"),
        chunk_delay_ms=_non_negative(obj.get("chunk_delay_ms", 0), f"{where}.chunk_delay_ms"),
        cut_after_chunks=None if cut is None else _non_negative(cut, f"{where}.cut_after_chunks"),
        no_done=bool(obj.get("no_done", False)),
        non_streaming=bool(obj.get("non_streaming", False)),
    )


def _parse_tool_call(raw: Any, where: str) -> ToolCallSpec:
    obj = _object(raw, where, _TOOL_CALL_KEYS)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ScenarioError(f"{where}.name: expected a non-empty string")
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    call_id = obj.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise ScenarioError(f"{where}.id: expected a string")
    fragments = obj.get("fragments", 3)
    if not isinstance(fragments, int) or isinstance(fragments, bool) or fragments < 1:
        raise ScenarioError(f"{where}.fragments: expected a positive integer")
    return ToolCallSpec(call_id=call_id, name=name, arguments=arguments, fragments=fragments)


def _parse_error(raw: Any, where: str) -> ErrorSpec:
    obj = _object(raw, where, _ERROR_KEYS)
    status = obj.get("status", 500)
    if not isinstance(status, int) or not 400 <= status <= 599:
        raise ScenarioError(f"{where}.status: expected an HTTP error status")
    headers = obj.get("headers", {})
    if not isinstance(headers, Mapping):
        raise ScenarioError(f"{where}.headers: expected an object")
    body = obj.get(
        "body",
        {"error": {"message": "fake provider error", "type": "server_error", "code": None}},
    )
    return ErrorSpec(status=status, body=body, headers={str(k): str(v) for k, v in headers.items()})


def _object(raw: Any, where: str, allowed: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: expected an object")
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}")
    return raw


def _chunks(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return tuple(re.findall(r"\s*\S+\s*|\s+", raw)) if raw else ()
    if isinstance(raw, list) and all(isinstance(c, str) for c in raw):
        return tuple(raw)
    raise ScenarioError(f"{where}: expected a string or a list of strings")


def _non_negative(raw: Any, where: str) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 0:
        raise ScenarioError(f"{where}: expected a non-negative integer")
    return raw


# --- Request routing -------------------------------------------------------------------


def last_user_message(messages: Sequence[Any]) -> tuple[str, int]:
    """The last user message's text and the number of assistant messages after it."""
    for position in range(len(messages) - 1, -1, -1):
        message = messages[position]
        if isinstance(message, Mapping) and message.get("role") == "user":
            later = messages[position + 1 :]
            return _text_of(message.get("content")), _count_assistant(later)
    return "", _count_assistant(messages)


def _count_assistant(messages: Sequence[Any]) -> int:
    return sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(
            part.get("text", "") for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )  # fmt: skip
    return ""


@dataclass(slots=True)
class FakeState:
    """Everything the server remembers; touched only from the server's event loop."""

    scripts: tuple[Script, ...] = ()
    api_key: str | None = None
    models: tuple[str, ...] | None = None  # None: accept any model id
    requests: list[Any] = field(default_factory=list)
    hits: dict[tuple[int, int], int] = field(default_factory=dict)
    completions_served: int = 0
    # The client end (host, port) of each connection a completion request came on.
    connections: set[tuple[str, int]] = field(default_factory=set)
    closing: asyncio.Event = field(default_factory=asyncio.Event)

    def reset(self) -> None:
        self.requests.clear()
        self.hits.clear()

    def choose(self, body: Mapping[str, Any]) -> ResponseSpec | dict[str, Any]:
        """The response for a request, or an error body saying why there is none."""
        messages = body.get("messages")
        user_text, slot = last_user_message(messages if isinstance(messages, list) else [])
        for script_index, script in enumerate(self.scripts):
            if not script.matches(user_text):
                continue
            if slot >= len(script.slots):
                return _fake_error(
                    "scenario_exhausted",
                    f"script {script.name!r} has {len(script.slots)} response(s); "
                    f"this request needs response index {slot}",
                )
            attempts = script.slots[slot]
            hit = self.hits.get((script_index, slot), 0)
            self.hits[(script_index, slot)] = hit + 1
            return attempts[min(hit, len(attempts) - 1)]
        return _fake_error(
            "no_script_matched",
            f"no script matched the last user message {user_text[:200]!r}",
        )


def _fake_error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"message": f"fake_openai: {message}", "type": "fake_openai", "code": code}}


# --- Wire format -----------------------------------------------------------------------


def _split(text: str, pieces: int) -> list[str]:
    size = max(1, math.ceil(len(text) / pieces))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def _usage(spec: ResponseSpec, body: Mapping[str, Any]) -> dict[str, Any]:
    messages = body.get("messages")
    prompt_chars = sum(
        len(_text_of(m.get("content"))) for m in (messages if isinstance(messages, list) else [])
        if isinstance(m, Mapping)
    )  # fmt: skip
    produced = "".join(spec.text_chunks + spec.thinking_chunks) + "".join(
        c.arguments for c in spec.tool_calls
    )
    usage: dict[str, Any] = {
        "prompt_tokens": math.ceil(prompt_chars / 4),
        "completion_tokens": _estimate_tokens(produced),
    }
    usage.update(spec.usage)
    usage["total_tokens"] = int(usage.get("prompt_tokens", 0)) + int(
        usage.get("completion_tokens", 0)
    )
    return usage


def _call_id(spec: ResponseSpec, index: int) -> str:
    call = spec.tool_calls[index]
    return call.call_id or f"call_fake_{index}"


def _finish_reason(spec: ResponseSpec) -> str:
    return spec.finish_reason or ("tool_calls" if spec.tool_calls else "stop")


def stream_events(
    spec: ResponseSpec, body: Mapping[str, Any], completion_id: str, model: str
) -> Iterator[dict[str, Any]]:
    """The ``data:`` payloads of a streamed answer, [DONE] excluded."""
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    yield chunk({"role": "assistant", "content": ""})
    for piece in spec.thinking_chunks:
        yield chunk({spec.thinking_field: piece})
    for piece in spec.text_chunks:
        yield chunk({"content": piece})
    for index, call in enumerate(spec.tool_calls):
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": _call_id(spec, index),
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                ]
            }
        )
        for piece in _split(call.arguments, call.fragments):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    if spec.stream_error is not None:
        yield {"error": dict(spec.stream_error)}
        return
    yield chunk({}, _finish_reason(spec))
    options = body.get("stream_options")
    if isinstance(options, Mapping) and options.get("include_usage"):
        yield {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": _usage(spec, body),
        }


def completion_body(
    spec: ResponseSpec, body: Mapping[str, Any], completion_id: str, model: str
) -> dict[str, Any]:
    """A whole non-streaming ``chat.completion``."""
    text = "".join(spec.text_chunks)
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if spec.thinking_chunks:
        message[spec.thinking_field] = "".join(spec.thinking_chunks)
    if spec.tool_calls:
        message["tool_calls"] = [
            {
                "id": _call_id(spec, index),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for index, call in enumerate(spec.tool_calls)
        ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(spec)}],
        "usage": _usage(spec, body),
    }


# --- HTTP handlers ---------------------------------------------------------------------


class _FakeHandler(tornado.web.RequestHandler):
    state: FakeState

    def initialize(self, state: FakeState) -> None:
        self.state = state

    def send_json(self, status: int, payload: Any) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload))

    async def pause(self, milliseconds: int) -> None:
        """Sleep, but wake at once when the server shuts down."""
        if milliseconds <= 0:
            return
        try:
            await asyncio.wait_for(self.state.closing.wait(), milliseconds / 1000)
        except TimeoutError:
            pass

    def drop_connection(self) -> None:
        self.detach().close()


class ChatCompletionsHandler(_FakeHandler):
    async def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"null")
        except ValueError:
            self.send_json(400, _fake_error("invalid_json", "request body is not JSON"))
            return
        if not isinstance(body, dict):
            self.send_json(400, _fake_error("invalid_json", "request body must be an object"))
            return
        self.state.requests.append(body)
        stream = getattr(self.request.connection, "stream", None)
        peer = stream.socket.getpeername() if stream is not None and stream.socket else None
        if peer is not None:
            self.state.connections.add((str(peer[0]), int(peer[1])))
        if self.state.api_key is not None and (
            self.request.headers.get("Authorization") != f"Bearer {self.state.api_key}"
        ):
            self.send_json(401, {"error": {
                "message": "Incorrect API key provided.", "type": "invalid_request_error",
                "param": None, "code": "invalid_api_key",
            }})  # fmt: skip
            return
        model = body.get("model")
        if self.state.models is not None and model not in self.state.models:
            self.send_json(404, {"error": {
                "message": f"The model {model!r} does not exist.",
                "type": "invalid_request_error", "param": "model", "code": "model_not_found",
            }})  # fmt: skip
            return
        chosen = self.state.choose(body)
        if isinstance(chosen, dict):
            self.send_json(500, chosen)
            return
        await self.answer(chosen, body, model if isinstance(model, str) else DEFAULT_MODEL)

    async def answer(self, spec: ResponseSpec, body: Mapping[str, Any], model: str) -> None:
        await self.pause(spec.delay_ms)
        if self.state.closing.is_set():
            return
        if spec.error is not None:
            self.send_error_spec(spec.error)
            return
        self.state.completions_served += 1
        completion_id = f"chatcmpl-fake-{self.state.completions_served}"
        reported_model = spec.model or model
        if spec.non_streaming or not body.get("stream"):
            if spec.cut_after_chunks is not None:
                self.drop_connection()
                return
            self.send_json(200, completion_body(spec, body, completion_id, reported_model))
            return
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        try:
            await self.stream(spec, body, completion_id, reported_model)
        except tornado.iostream.StreamClosedError:
            pass  # the client went away (e.g. its read timeout fired)

    async def stream(
        self, spec: ResponseSpec, body: Mapping[str, Any], completion_id: str, model: str
    ) -> None:
        for sent, event in enumerate(stream_events(spec, body, completion_id, model)):
            if spec.cut_after_chunks is not None and sent >= spec.cut_after_chunks:
                self.drop_connection()
                return
            if sent:
                await self.pause(spec.chunk_delay_ms)
            if self.state.closing.is_set():
                return
            self.write(f"data: {json.dumps(event)}\n\n")
            await self.flush()
        if spec.cut_after_chunks is not None:
            self.drop_connection()  # asked to cut after at least every chunk
            return
        if not spec.no_done and spec.stream_error is None:
            self.write("data: [DONE]\n\n")
        self.finish()

    def send_error_spec(self, error: ErrorSpec) -> None:
        self.set_status(error.status)
        for name, value in error.headers.items():
            self.set_header(name, value)
        if isinstance(error.body, str):
            self.set_header("Content-Type", "text/plain")
            self.finish(error.body)
        else:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(error.body))


class ModelsHandler(_FakeHandler):
    def get(self) -> None:
        ids = self.state.models or (DEFAULT_MODEL,)
        data = [{"id": i, "object": "model", "created": 0, "owned_by": "fake"} for i in ids]
        self.send_json(200, {"object": "list", "data": data})


class RequestsHandler(_FakeHandler):
    def get(self) -> None:
        self.send_json(200, {"requests": self.state.requests})


class ResetHandler(_FakeHandler):
    def post(self) -> None:
        self.state.reset()
        self.send_json(200, {"ok": True})


class ScenarioHandler(_FakeHandler):
    def post(self) -> None:
        try:
            scripts = parse_scenario(json.loads(self.request.body or b"null"))
        except (ValueError, ScenarioError) as exc:
            self.send_json(400, _fake_error("invalid_scenario", str(exc)))
            return
        self.state.scripts = scripts
        self.state.reset()
        self.send_json(200, {"ok": True, "scripts": len(scripts)})


def make_app(state: FakeState) -> tornado.web.Application:
    routes: list[tuple[str, type[_FakeHandler], dict[str, Any]]] = [
        (r"/v1/chat/completions", ChatCompletionsHandler, {"state": state}),
        (r"/v1/models", ModelsHandler, {"state": state}),
        (r"/_fake/requests", RequestsHandler, {"state": state}),
        (r"/_fake/reset", ResetHandler, {"state": state}),
        (r"/_fake/scenario", ScenarioHandler, {"state": state}),
    ]
    return tornado.web.Application(routes, log_function=lambda _handler: None)


async def serve(
    state: FakeState, *, host: str = "127.0.0.1", port: int = 0
) -> tuple[tornado.httpserver.HTTPServer, int]:
    """Start listening on the running loop; returns the server and the bound port."""
    server = tornado.httpserver.HTTPServer(make_app(state))
    sockets = tornado.netutil.bind_sockets(port, host, family=socket.AF_INET)
    server.add_sockets(sockets)
    return server, int(sockets[0].getsockname()[1])


async def shutdown(state: FakeState, server: tornado.httpserver.HTTPServer) -> None:
    state.closing.set()  # wakes handlers paused in delays
    server.stop()
    await server.close_all_connections()


# --- In-process helper for tests -------------------------------------------------------


class FakeOpenAI:
    """The fake server on an ephemeral loopback port, in a thread with its own loop.

    ``base_url`` ends in ``/v1``, ready for ``GatewayConfig(base_url=...)``.
    """

    def __init__(
        self,
        scenario: Any = None,
        *,
        api_key: str | None = None,
        models: Sequence[str] | None = None,
    ) -> None:
        scripts = parse_scenario(scenario) if scenario is not None else ()
        self._setup = (scripts, api_key, tuple(models) if models is not None else None)
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._state: FakeState | None = None
        self._failure: BaseException | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._run, name="fake-openai", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("fake OpenAI server did not start")
        if self._failure is not None:
            raise RuntimeError("fake OpenAI server failed to start") from self._failure
        self._http_client: httpx.Client | None = None

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    @property
    def _http(self) -> httpx.Client:
        # Created on first use: most tests never introspect, and a client costs an SSL context.
        if self._http_client is None:
            self._http_client = httpx.Client(base_url=self.root_url, timeout=10, trust_env=False)
        return self._http_client

    def requests(self) -> list[dict[str, Any]]:
        response = self._http.get("/_fake/requests")
        response.raise_for_status()
        requests: list[dict[str, Any]] = response.json()["requests"]
        return requests

    def offered(self, text: str) -> set[str]:
        """The tool names offered with the first request whose last user message contains
        ``text`` (what a turn's first model step was given to call)."""
        for body in self.requests():
            users = [msg for msg in body.get("messages") or [] if msg.get("role") == "user"]
            if users and text in str(users[-1].get("content")):
                return {t["function"]["name"] for t in body.get("tools") or []}
        raise AssertionError(f"the model was never asked about {text!r}")

    @property
    def connection_count(self) -> int:
        """How many client connections completion requests arrived on since start."""
        return len(self._state.connections) if self._state is not None else 0

    @property
    def request_count(self) -> int:
        """How many chat completion requests arrived since the last reset, read without a
        request of its own (a bench waits on it instead of polling the server under test)."""
        return len(self._state.requests) if self._state is not None else 0

    def load(self, scenario: Any) -> None:
        """Replace the scenario (validated locally first for a readable error)."""
        parse_scenario(scenario)
        # ASCII-escaped JSON, so any string survives the trip (an unpaired surrogate too).
        self._http.post("/_fake/scenario", content=json.dumps(scenario),
                        headers={"Content-Type": "application/json"}).raise_for_status()

    def reset(self) -> None:
        self._http.post("/_fake/reset").raise_for_status()

    def close(self) -> None:
        if self._http_client is not None:
            self._http_client.close()
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def __enter__(self) -> FakeOpenAI:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced to the constructor
            self._failure = exc
            self._started.set()

    async def _main(self) -> None:
        scripts, api_key, models = self._setup
        state = self._state = FakeState(scripts=scripts, api_key=api_key, models=models)
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server, self.port = await serve(state)
        self._started.set()
        await self._stop.wait()
        await shutdown(state, server)


# --- Command line ----------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kaizen-fake-openai", description="Replay a scenario as an OpenAI-compatible API."
    )
    parser.add_argument("--scenario", type=Path, help="scenario JSON file (see module docs)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--api-key", help="require 'Authorization: Bearer KEY'")
    parser.add_argument("--models", help="comma-separated model ids; others get 404")
    args = parser.parse_args(argv)
    try:
        scripts = load_scenario_file(args.scenario) if args.scenario else ()
    except (OSError, ValueError) as exc:
        print(f"kaizen-fake-openai: {exc}", file=sys.stderr)
        return 2
    models = tuple(m.strip() for m in args.models.split(",") if m.strip()) if args.models else None
    state = FakeState(scripts=scripts, api_key=args.api_key, models=models)
    asyncio.run(_serve_until_signalled(state, args.host, args.port))
    return 0


async def _serve_until_signalled(state: FakeState, host: str, port: int) -> None:
    server, bound = await serve(state, host=host, port=port)
    print(json.dumps({"port": bound}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await shutdown(state, server)


if __name__ == "__main__":
    sys.exit(main())
