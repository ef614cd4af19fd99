"""The embedded local model: our gateway against llama-cpp-python called directly, and a whole
one-tool turn through a real server.

Figures (one JSON line each):

* ``stream``: the same prompt and seed, a plain-text step (no tools), ``--n`` times each way
  with the KV cache cleared before every run: time to first token and decode tokens/s through
  ``LocalModelGateway.stream_step`` versus ``completion_stream`` (llama-cpp's own streaming
  ``create_completion``, which the gateway calls on its worker thread). ``ratio_tps`` is
  gateway/direct tokens per second and ``ratio_ttft`` direct/gateway first-token time: 1.0
  means the gateway costs nothing, the target is >= 0.95.
* ``tool_turn``: wall seconds from accepting a message to the run's terminal, through REST on a
  real Jupyter server whose only model is the local one, for a turn that calls
  ``list_available_agents`` and then answers.

Prints ``{"bench": "local_model", "skipped": ...}`` when the model or llama-cpp is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kaizen_server_extension.local_model import (  # noqa: E402
    configured_model_path,
    llama_cpp_available,
)
from kaizen_server_extension.models.constrained import render_messages  # noqa: E402
from kaizen_server_extension.models.local import (  # noqa: E402
    LocalModelConfig,
    LocalModelGateway,
    completion_stream,
    format_prompt,
)
from kaizen_server_extension.protocol.model import ChatMessage, StepSnapshot, TextDelta  # noqa: E402

BENCH = "local_model"
PROMPT = ("Explain in about a hundred words what a Jupyter kernel is and why a notebook "
          "needs one.")


def emit(figure: str, **fields: Any) -> None:
    print(json.dumps({"bench": BENCH, "figure": figure, **fields}), flush=True)


def _stats(samples: list[tuple[float, float]]) -> tuple[float, float]:
    """Median time to first token (s) and median decode tokens/s."""
    return (statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples))


async def bench_stream(model: Path, n: int, max_tokens: int, threads: int) -> None:
    # Greedy: both ways then write the very same tokens, whatever the seed.
    config = LocalModelConfig(model, max_tokens=max_tokens, n_threads=threads, seed=7,
                              temperature=0.0)
    from llama_cpp import Llama

    llm = Llama(model_path=str(model), n_ctx=config.n_ctx, n_threads=threads,
                n_threads_batch=threads, seed=config.seed, verbose=False)
    gateway = LocalModelGateway(config, factory=lambda _config: llm)
    snapshot = StepSnapshot(step=1, messages=(
        ChatMessage("system", "You are a helpful assistant."), ChatMessage("user", PROMPT)),
        tools=())
    prompt = format_prompt(llm, render_messages(snapshot, constrained=False))

    def direct() -> tuple[float, float, int]:
        llm.reset()
        start = time.perf_counter()
        first = 0.0
        tokens = 0
        for chunk in completion_stream(llm, prompt.tokens, config, seed=config.seed,
                                       stop=prompt.stop,
                                       stopping_criteria=prompt.stopping_criteria):
            if chunk["choices"][0].get("text"):
                tokens += 1
                if tokens == 1:
                    first = time.perf_counter() - start
        return first, time.perf_counter() - start, tokens

    async def through_gateway() -> tuple[float, float, int]:
        llm.reset()
        start = time.perf_counter()
        first = 0.0
        tokens = 0
        async for event in gateway.stream_step(snapshot):
            if isinstance(event, TextDelta):
                tokens += 1
                if tokens == 1:
                    first = time.perf_counter() - start
        return first, time.perf_counter() - start, tokens

    await through_gateway()  # load and warm up once
    direct_samples: list[tuple[float, float]] = []
    gateway_samples: list[tuple[float, float]] = []
    counts: list[int] = []
    for _ in range(n):  # interleaved, so load on the machine hits both alike
        first, total, tokens = direct()
        direct_samples.append((first, (tokens - 1) / max(total - first, 1e-9)))
        first, total, tokens = await through_gateway()
        gateway_samples.append((first, (tokens - 1) / max(total - first, 1e-9)))
        counts.append(tokens)
    await gateway.aclose()
    d_ttft, d_tps = _stats(direct_samples)
    g_ttft, g_tps = _stats(gateway_samples)
    emit("stream", n=n, threads=threads, prompt_tokens=len(prompt.tokens),
         completion_tokens=statistics.median(counts),
         ttft_s=round(g_ttft, 3), tokens_per_s=round(g_tps, 2),
         baseline_ttft_s=round(d_ttft, 3), baseline_tokens_per_s=round(d_tps, 2),
         ratio_tps=round(g_tps / d_tps, 3), ratio_ttft=round(d_ttft / g_ttft, 3))


def bench_tool_turn(model: Path, n: int) -> None:
    from kaizen_server_extension.store.engine import sqlite_url_for
    from tests.support.server import start_server

    text = "Which agents can I use here? Look them up with the list_available_agents tool."
    with tempfile.TemporaryDirectory(prefix="kzbench-local-") as tmp:
        root = Path(tmp)
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
            "KAIZEN_LOCAL_MODEL_PATH": str(model), "KAIZEN_LOCAL_MODEL_SEED": "1234"})
        try:
            with server.client("alice") as alice:
                seconds: list[float] = []
                outcomes: list[str] = []
                tool_calls: list[int] = []
                for _ in range(n):
                    room = alice.post("conversations", json={"agent_id": "general"}).json()["id"]
                    start = time.perf_counter()
                    accepted = alice.post(f"conversations/{room}/messages",
                                          json={"text": text}).json()
                    while True:
                        run = alice.get(f"runs/{accepted['run_id']}").json()
                        if run["status"] in ("completed", "failed", "answer_unavailable",
                                             "cancelled"):
                            break
                        time.sleep(0.05)
                    seconds.append(time.perf_counter() - start)
                    outcomes.append(f"{run['status']}/{run['outcome']}")
                    tool_calls.append(int(run.get("tool_calls") or 0))
        finally:
            server.stop()
    emit("tool_turn", n=n, p50_s=round(statistics.median(seconds), 2),
         max_s=round(max(seconds), 2), outcomes=outcomes, tool_calls=tool_calls)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--db", default="sqlite", help="ignored (no store)")
    parser.add_argument("--skip-turn", action="store_true")
    args = parser.parse_args(argv)
    model = configured_model_path()
    if model is None or not model.is_file() or not llama_cpp_available():
        print(json.dumps({"bench": BENCH, "skipped": "no local model or llama-cpp-python "
                          "(kaizen-local-model setup)"}), flush=True)
        return 0
    asyncio.run(bench_stream(model, args.n, args.max_tokens, args.threads))
    if not args.skip_turn:
        bench_tool_turn(model, max(1, args.n // 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
