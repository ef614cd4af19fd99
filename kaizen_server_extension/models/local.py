"""The local model gateway: a GGUF model run in the server process with llama-cpp-python.

Same contract as :class:`~kaizen_server_extension.models.client.ModelGateway`:
``stream_step(snapshot, model=...)`` yields text as the model writes it, complete tool calls,
and ends with :class:`StepFinished` carrying token usage. Steps with advertised tools are
constrained to an answer-or-one-tool JSON reply (see :mod:`.constrained`); steps without
tools generate plain text.

Threading: each model has one dedicated worker thread. Generations queue on it in arrival
order and run one at a time (a llama context is not re-entrant, and two concurrent decodes
would only halve each other's speed), and the event loop never waits on a token: the worker
hands each piece of text to the loop with ``call_soon_threadsafe``. Leaving the stream early
(cancel, inactivity budget, closed generator) stops the generation at its next token, or
before it starts when it is still queued.

Failures surface as content-free :class:`ModelStepError` codes, as for any provider.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

from kaizen_server_extension.models import errors
from kaizen_server_extension.models.constrained import (
    ANSWER_OPENER,
    ARGUMENTS_OPENER,
    NO_TOOL,
    ConstrainedReply,
    answer_closed,
    arguments_grammar,
    arguments_schema,
    call_reply,
    decided_tool,
    decision_choices,
    decision_grammar,
    long_text_split,
    long_text_value,
    render_messages,
    string_end,
)
from kaizen_server_extension.models.payload import advertised_tools
from kaizen_server_extension.protocol.model import (
    ModelStepError,
    StepEvent,
    StepFinished,
    StepSnapshot,
    TextDelta,
    ToolCallEmitted,
    Usage,
)
from kaizen_server_extension.protocol.tools import AdvertisedTool

log = logging.getLogger(__name__)

LOCAL_MODEL_NAME = "local"
#: Content-free code for a model file or runtime that cannot be loaded (deterministic).
LOCAL_MODEL_UNAVAILABLE = errors.MISCONFIGURED


def default_threads(cpus: int | None = None) -> int:
    """Generation threads: the cores available to this process but one, between 1 and 4."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    return max(1, min(4, cpus - 1))


@dataclass(frozen=True, slots=True)
class LocalModelConfig:
    """How the local model runs. Every field has a ``KAIZEN_LOCAL_MODEL_*`` variable."""

    model_path: Path
    model_name: str = LOCAL_MODEL_NAME
    n_ctx: int = 8192
    #: One core is left to the server, its kernels and the rest of the machine: ggml's
    #: threads wait on each other at every layer, so a thread that has to share its core
    #: stalls them all. Measured on a loaded 2-core machine: 2 threads 124 s, 1 thread 12.5 s
    #: for the same 33-token prompt and 48-token answer.
    n_threads: int = field(default_factory=lambda: default_threads())
    #: A step that runs away (a 0.5B model repeating itself inside a tool call's JSON) must
    #: end well inside the turn's 120 s inactivity budget, which streamed tool-call arguments
    #: do not reset: constrained generation runs at about 6 tokens/s on one core here, so 512
    #: tokens is ~85 s at worst, and the turn then re-steps or says what failed. A real answer
    #: of this model is far shorter (a run_code call is ~70 tokens). KAIZEN_LOCAL_MODEL_MAX_TOKENS.
    max_tokens: int = 512
    temperature: float = 0.2
    top_p: float = 0.9
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    #: Logit bonus for deciding ``none`` (answer without a tool). Measured on 14 probe
    #: requests with 16 tools: 0 → 13/14 right, 1.5 → 14/14, 3 → 12/14 (too shy of tools).
    answer_bias: float = 1.5
    #: Write a call's long text argument (run_code's code) first and without a grammar,
    #: keeping it only when the whole call satisfies the tool's schema (else the call is
    #: written again under the grammar). Measured on a loaded 2-core machine for a run_code
    #: call: 12.3 tokens/s free, 5.4 under the grammar.
    #: KAIZEN_LOCAL_MODEL_FREE_ARGUMENTS=0 always uses the grammar.
    free_arguments: bool = True
    #: The n-th generation of this process samples with ``seed + n``: runs replay exactly,
    #: while a pre-commit retry of the same step still draws a fresh sample.
    seed: int = 42

    def __post_init__(self) -> None:
        if self.n_ctx < 256 or self.max_tokens < 1 or self.n_threads < 1:
            raise ValueError("local model n_ctx, max_tokens and threads must be positive")
        if not 0 <= self.temperature <= 5 or not 0 < self.top_p <= 1:
            raise ValueError("local model temperature/top_p out of range")

    @classmethod
    def from_env(cls, model_path: Path, environ: Mapping[str, str] | None = None
                 ) -> LocalModelConfig:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        conversions: dict[str, tuple[str, Callable[[str], Any]]] = {
            "KAIZEN_LOCAL_MODEL_CTX": ("n_ctx", int),
            "KAIZEN_LOCAL_MODEL_THREADS": ("n_threads", int),
            "KAIZEN_LOCAL_MODEL_MAX_TOKENS": ("max_tokens", int),
            "KAIZEN_LOCAL_MODEL_TEMPERATURE": ("temperature", float),
            "KAIZEN_LOCAL_MODEL_TOP_P": ("top_p", float),
            "KAIZEN_LOCAL_MODEL_SEED": ("seed", int),
            "KAIZEN_LOCAL_MODEL_ANSWER_BIAS": ("answer_bias", float),
        }
        free = env.get("KAIZEN_LOCAL_MODEL_FREE_ARGUMENTS", "").strip()
        if free:
            if free not in ("0", "1"):
                raise ValueError("KAIZEN_LOCAL_MODEL_FREE_ARGUMENTS must be 0 or 1")
            values["free_arguments"] = free == "1"
        for variable, (name, convert) in conversions.items():
            raw = env.get(variable, "").strip()
            if raw:
                try:
                    values[name] = convert(raw)
                except ValueError:
                    raise ValueError(f"{variable} must be a number") from None
        return cls(model_path=model_path, **values)


@dataclass(eq=False)
class _Job:
    """One queued generation; the worker reports through ``emit``."""

    prompt_messages: list[dict[str, str]]
    plan: StepPlan | None
    seed: int
    emit: Callable[[tuple[str, Any]], None]
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, slots=True)
class GenerationStats:
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None


LlamaFactory = Callable[[LocalModelConfig], Any]


def _default_factory(config: LocalModelConfig) -> Any:
    from llama_cpp import Llama  # the optional "local" extra

    return Llama(model_path=str(config.model_path), n_ctx=config.n_ctx,
                 n_threads=config.n_threads, n_threads_batch=config.n_threads,
                 seed=config.seed, verbose=False)


class LocalModelGateway:
    """Streams model steps from a GGUF model loaded in this process (lazily, on first use)."""

    def __init__(self, config: LocalModelConfig, *, factory: LlamaFactory | None = None) -> None:
        self.config = config
        self._factory = factory or _default_factory
        # One thread per model: its queue is the generation queue.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="kaizen-local-model")
        self._llm: Any = None
        self._load_failed = False
        self._generations = 0
        self._jobs: set[_Job] = set()
        self._closed = False

    # --- lifecycle -------------------------------------------------------------------------

    async def warm(self, prefix: StepSnapshot | None = None) -> None:
        """Load the model now instead of on the first step, and evaluate ``prefix`` (a new
        conversation's system prompt and tools): llama.cpp keeps what it evaluated last and
        reuses the common start of the next prompt, so the first question reads only its
        own words. A step arriving meanwhile queues behind this on the model's thread."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._ensure_loaded)
        if prefix is None or self._closed:
            return
        messages = render_messages(prefix, constrained=bool(prefix.tools))
        started = loop.time()
        tokens = await loop.run_in_executor(self._executor, self._prefill, messages)
        log.info("local model: %d prompt tokens of a new conversation evaluated at start-up "
                 "in %.1f s", tokens, loop.time() - started)

    async def aclose(self) -> None:
        self._closed = True
        for job in list(self._jobs):
            job.cancelled.set()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._unload)
        except RuntimeError:
            pass  # already shut down
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> LocalModelGateway:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- the contract ----------------------------------------------------------------------

    async def stream_step(
        self, snapshot: StepSnapshot, *, model: str | None = None
    ) -> AsyncIterator[StepEvent]:
        """Generate one step; the last event is always :class:`StepFinished`.

        ``model`` is accepted for the contract and ignored: this gateway has one model."""
        del model
        if self._closed:
            raise errors.step_error(errors.UNAVAILABLE)
        plan = plan_step(snapshot)  # raises for a required tool the catalog lacks
        reply = ConstrainedReply(plan.tools, snapshot.step) if plan is not None else None
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def emit(item: tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop closed under us: nobody is listening
                job.cancelled.set()

        job = _Job(render_messages(snapshot, constrained=plan is not None), plan,
                   self.config.seed + self._generations, emit)
        self._generations += 1
        self._jobs.add(job)
        try:
            self._executor.submit(self._run, job)
        except RuntimeError:
            self._jobs.discard(job)
            raise errors.step_error(errors.UNAVAILABLE) from None
        try:
            while True:
                kind, payload = await queue.get()
                if kind == "text":
                    if reply is None:
                        yield TextDelta(payload)
                    elif text := reply.feed(payload):
                        yield TextDelta(text)
                elif kind == "error":
                    raise errors.step_error(payload)
                elif kind == "done":
                    stats: GenerationStats = payload
                    # What a small model pays for is the prompt: one line per step, so an
                    # operator (and bench/local_model.py) sees each step's prompt size.
                    log.info("local model step %d: %d prompt tokens, %d completion tokens, "
                             "%d tools", snapshot.step, stats.prompt_tokens,
                             stats.completion_tokens, len(plan.tools) if plan else 0)
                    call = reply.finish() if reply is not None else None
                    if call is not None:
                        yield ToolCallEmitted(call)
                    yield StepFinished(
                        usage=Usage(prompt_tokens=stats.prompt_tokens,
                                    completion_tokens=stats.completion_tokens),
                        finish_reason="tool_calls" if call is not None
                        else stats.finish_reason,
                        model=self.config.model_name)
                    return
        finally:
            job.cancelled.set()  # stops the worker at its next token (or before it starts)
            self._jobs.discard(job)

    # --- the worker thread -------------------------------------------------------------------

    def _ensure_loaded(self) -> Any:
        if self._llm is None:
            if self._load_failed:
                raise _LoadFailed
            try:
                self._llm = self._factory(self.config)
            except Exception as exc:
                self._load_failed = True
                log.error("the local model %s could not be loaded: %s",
                          self.config.model_path, type(exc).__name__)
                raise _LoadFailed from None
            log.info("local model loaded: %s", self.config.model_path.name)
        return self._llm

    def _prefill(self, messages: list[dict[str, str]]) -> int:
        llm = self._ensure_loaded()
        prompt = format_prompt(llm, messages)
        for _chunk in completion_stream(llm, prompt.tokens, self.config, seed=self.config.seed,
                                        stop=prompt.stop, max_tokens=1, temperature=0.0):
            pass
        return len(prompt.tokens)

    def _unload(self) -> None:
        llm, self._llm = self._llm, None
        close = getattr(llm, "close", None)
        if close is not None:
            close()

    def _run(self, job: _Job) -> None:
        if job.cancelled.is_set():
            return
        try:
            llm = self._ensure_loaded()
            stats = generate(llm, job.prompt_messages, job.plan, self.config, seed=job.seed,
                             on_text=lambda text: job.emit(("text", text)),
                             cancelled=job.cancelled)
        except _LoadFailed:
            job.emit(("error", LOCAL_MODEL_UNAVAILABLE))
        except ModelStepError as exc:
            job.emit(("error", exc.code))
        except Exception as exc:
            log.warning("local generation failed: %s", type(exc).__name__)
            job.emit(("error", errors.STREAM_ERROR))
        else:
            job.emit(("done", stats))


class _LoadFailed(Exception):
    pass


# --- generation (worker thread; also used directly by the benchmark) ---------------------------


@dataclass(frozen=True, slots=True)
class Prompt:
    tokens: list[int]
    stop: list[str]
    stopping_criteria: Any


def format_prompt(llm: Any, messages: list[dict[str, str]]) -> Prompt:
    """Render ``messages`` with the model's own chat template and tokenize the result."""
    formatter = _formatter(llm)
    result = formatter(messages=messages)
    tokens = llm.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special,
                          special=True)
    stop = result.stop if isinstance(result.stop, list) else [result.stop] if result.stop else []
    return Prompt(list(tokens), [s for s in stop if s], result.stopping_criteria)


def _formatter(llm: Any) -> Any:
    cached = getattr(llm, "_kaizen_formatter", None)
    if cached is not None:
        return cached
    from llama_cpp import llama_chat_format

    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        template = _CHATML
    eos_id, bos_id = llm.token_eos(), llm.token_bos()
    eos = llm._model.token_get_text(eos_id) if eos_id != -1 else ""
    bos = llm._model.token_get_text(bos_id) if bos_id != -1 else ""
    formatter = llama_chat_format.Jinja2ChatFormatter(
        template=template, eos_token=eos, bos_token=bos, stop_token_ids=[eos_id])
    llm._kaizen_formatter = formatter
    return formatter


_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """How a step with tools is generated: the decision, then arguments or a free answer."""

    tools: tuple[AdvertisedTool, ...]
    choices: tuple[str, ...]


def plan_step(snapshot: StepSnapshot) -> StepPlan | None:
    """None for a step without tools (plain text); raises ``ModelStepError`` for a required
    tool the catalog lacks, like the HTTP gateway."""
    tools = advertised_tools(snapshot)
    if not tools:
        return None
    return StepPlan(tools, decision_choices(snapshot))


@lru_cache(maxsize=128)
def _grammar(gbnf: str) -> Any:
    from llama_cpp import LlamaGrammar

    return LlamaGrammar.from_string(gbnf, verbose=False)


@lru_cache(maxsize=128)
def _arguments_gbnf(schema_json: str) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    return arguments_grammar(json_schema_to_gbnf(schema_json))


@lru_cache(maxsize=128)
def _object_gbnf(schema_json: str) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    return str(json_schema_to_gbnf(schema_json))


def grammar_for(gbnf: str) -> Any:
    """A compiled llama.cpp grammar (cached by text)."""
    return _grammar(gbnf)


def tool_arguments_gbnf(tool: AdvertisedTool) -> str:
    # Property order matters: the grammar writes properties in the schema's order.
    return _arguments_gbnf(json.dumps(arguments_schema(tool)))


def completion_stream(llm: Any, tokens: list[int], config: LocalModelConfig, *, seed: int,
                      stop: list[str], stopping_criteria: Any = None, gbnf: str | None = None,
                      max_tokens: int | None = None, temperature: float | None = None,
                      logit_bias: dict[int, float] | None = None) -> Iterator[Any]:
    """llama-cpp-python's own streaming completion (the benchmark's baseline calls exactly
    this)."""
    return llm.create_completion(
        tokens, max_tokens=max_tokens or config.max_tokens,
        temperature=config.temperature if temperature is None else temperature,
        top_p=config.top_p, top_k=config.top_k, min_p=config.min_p,
        repeat_penalty=config.repeat_penalty, stop=stop, stopping_criteria=stopping_criteria,
        stream=True, seed=seed, logit_bias=logit_bias,
        grammar=grammar_for(gbnf) if gbnf is not None else None)


class _Run:
    """Streams one completion, counting tokens and honouring cancellation."""

    def __init__(self, on_text: Callable[[str], None],
                 cancelled: threading.Event | None) -> None:
        self.on_text = on_text
        self.cancelled = cancelled
        self.tokens = 0
        self.finish_reason: str | None = None

    def stream(self, chunks: Iterator[Any], *,
               until: Callable[[str], bool] | None = None) -> str:
        """Pass text on; stop early when ``until(text so far)`` says so. Returns the text."""
        text: list[str] = []
        try:
            for chunk in chunks:
                if self.cancelled is not None and self.cancelled.is_set():
                    self.finish_reason = "cancelled"
                    break
                choice = chunk["choices"][0]
                piece = choice.get("text") or ""
                if piece:
                    self.tokens += 1
                    text.append(piece)
                    self.on_text(piece)
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
                if until is not None and until("".join(text)):
                    self.finish_reason = "stop"
                    break
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        return "".join(text)


def generate(llm: Any, messages: list[dict[str, str]], plan: StepPlan | None,
             config: LocalModelConfig, *, seed: int, on_text: Callable[[str], None],
             cancelled: threading.Event | None = None) -> GenerationStats:
    """Run one step to the end (or until ``cancelled``), passing raw text to ``on_text``:
    plain text without a plan, else the constrained reply (see :mod:`.constrained`)."""
    prompt = format_prompt(llm, messages)
    if len(prompt.tokens) + 1 >= config.n_ctx:
        raise errors.step_error(errors.INVALID_REQUEST)  # the context cannot hold it
    run = _Run(on_text, cancelled)
    stream = partial(completion_stream, llm, config=config, seed=seed, stop=prompt.stop,
                     stopping_criteria=prompt.stopping_criteria)
    if plan is None:
        run.stream(stream(prompt.tokens))
    else:
        # 1. The decision: a few tokens under a tiny grammar, greedy (the most likely
        #    choice; sampling noise belongs in the wording, not in whether to call a tool).
        bias = None
        if NO_TOOL in plan.choices and config.answer_bias:
            bias = {_tokens(llm, NO_TOOL)[0]: config.answer_bias}
        decision = run.stream(stream(prompt.tokens, gbnf=decision_grammar(plan.choices),
                                     max_tokens=32, temperature=0.0, logit_bias=bias))
        name = decided_tool(decision)
        tool = next((t for t in plan.tools if t.name == name), None)
        if run.finish_reason == "cancelled" or (tool is None and name != NO_TOOL):
            pass  # cut short: an empty step, which the controller retries
        elif tool is not None:
            # 2. The arguments under the grammar of that tool's schema. A grammar over this
            #    vocabulary costs more than half of each token's time, so a tool whose first
            #    argument is long text (run_code's code) gets it written without one, then
            #    each other argument under its own; kept when the whole satisfies the schema,
            #    else written again under the full grammar. Together they write at
            #    most max_tokens, so a runaway step is as short as with the grammar alone.
            tokens = prompt.tokens + _tokens(llm, decision)
            split = long_text_split(tool) if config.free_arguments else None
            spent = run.tokens
            reply = _long_text_first(llm, stream, tokens, tool, split, run,
                                    max_tokens=max(1, config.max_tokens // 2)) \
                if split is not None else None
            if reply is not None:
                on_text(reply)
            elif run.finish_reason != "cancelled":
                left = max(1, config.max_tokens - (run.tokens - spent))
                run.stream(stream(tokens, gbnf=tool_arguments_gbnf(tool), max_tokens=left))
        else:
            # 3. The answer: free generation inside the JSON string, stopped when it closes.
            on_text(ANSWER_OPENER)
            tokens = prompt.tokens + _tokens(llm, decision + ANSWER_OPENER)
            run.stream(stream(tokens), until=answer_closed)
    return GenerationStats(len(prompt.tokens), run.tokens, run.finish_reason)


#: Tokens each other argument of a long-text call may take (run_code's are a word or two).
OTHER_ARGUMENT_MAX_TOKENS = 48


def _long_text_first(llm: Any, stream: Callable[..., Iterator[Any]], tokens: list[int],
                     tool: AdvertisedTool, split: tuple[str, tuple[tuple[str, Any], ...]],
                     run: _Run, *, max_tokens: int) -> str | None:
    """The call's arguments, the long text first and freely, then each other argument under
    the grammar of its own schema; as reply text, or None (see ``generate``)."""
    name, others = split
    quiet = _Run(lambda _text: None, run.cancelled)
    # The model writes the key itself: forcing it changed what it wrote after (a 0.5B model
    # then wrote one-line code ending in a top-level return).
    key = re.compile(r'\s*"' + re.escape(name) + r'"\s*:\s*"')

    def written_out(text: str) -> bool:
        opened = key.match(text)
        if opened is None:
            return len(text) > len(name) + 8  # another key first: give up early
        return string_end(text[opened.end():]) is not None

    body = quiet.stream(stream(tokens + _tokens(llm, ARGUMENTS_OPENER), max_tokens=max_tokens),
                        until=written_out)
    opened = key.match(body)
    text = long_text_value(body[opened.end():]) if opened is not None else None
    arguments: dict[str, Any] = {name: text}
    written = ARGUMENTS_OPENER
    if opened is not None and text is not None:
        written += body[:opened.end() + (string_end(body[opened.end():]) or 0) + 1]
    for other, schema in others:
        if text is None or quiet.finish_reason == "cancelled":
            break
        written += f", {json.dumps(other)}: "
        value = quiet.stream(stream(tokens + _tokens(llm, written),
                                    gbnf=_object_gbnf(json.dumps(schema)),
                                    max_tokens=OTHER_ARGUMENT_MAX_TOKENS))
        try:
            arguments[other] = json.loads(value, strict=False)
        except ValueError:
            text = None
            break
        written += json.dumps(arguments[other], ensure_ascii=False)
    run.tokens += quiet.tokens
    if quiet.finish_reason == "cancelled":
        run.finish_reason = "cancelled"
        return None
    reply = call_reply(tool, arguments) if text is not None else None
    if reply is None:
        log.info("local model: %s arguments written with the long text free did not "
                 "validate (%d tokens); writing them under the grammar", tool.name,
                 quiet.tokens)
        return None
    run.finish_reason = "stop"
    return reply


def _tokens(llm: Any, text: str) -> list[int]:
    return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))


# --- wiring -------------------------------------------------------------------------------------


def local_gateway_from_env(environ: Mapping[str, str] | None = None,
                           ) -> LocalModelGateway | None:
    """The local gateway when a model file is configured and llama-cpp-python is installed;
    None otherwise. Raises ``ValueError`` (naming the setting) for a configured path that does
    not exist or a malformed ``KAIZEN_LOCAL_MODEL_*`` value."""
    from kaizen_server_extension.local_model import (
        LOCAL_MODEL_PATH_ENV,
        configured_model_path,
        llama_cpp_available,
    )

    env = os.environ if environ is None else environ
    path = configured_model_path(env)
    if path is None:
        return None
    if not path.is_file():
        raise ValueError(f"{LOCAL_MODEL_PATH_ENV}={path} is not a file")
    if not llama_cpp_available():
        log.warning("a local model is at %s but llama-cpp-python is not installed "
                    "(pip install 'kaizen-jupyter[local]')", path)
        return None
    return LocalModelGateway(LocalModelConfig.from_env(path, env))

