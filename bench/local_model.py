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
* ``data_task`` (issue 13): the analyst's first question end to end over REST on a real
  server with the local model (its ``compact`` prompt profile): a CSV is written to the
  server's root, attached with ``POST jupyter-files``, and the member asks "Load data.csv with
  pandas and tell me the sum of column b"; ``--data-runs`` turns (default 5), each in a new
  room. A turn succeeds when the committed answer holds the right sum; ``honest`` counts the
  turns that instead said plainly that they failed (never a repair instruction: ``echoes``
  must be 0). ``p50_s``/``max_s`` are message-to-terminal seconds (target: first answer within
  20 s), ``first_step_prompt_tokens`` what the server logged for each run's first step
  (``local model step 1: N prompt tokens``), ``full_profile_prompt_tokens`` the same first
  step rendered with every General tool (the ``full`` profile, ≈ what the local model read
  before). Baseline: the same llama call with a bare minimal prompt (system + question, no
  tools), ``baseline_s`` its median seconds for a short answer and ``baseline_prompt_tokens``
  its prompt.

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
    default_threads,
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


DATA_QUESTION = "Load data.csv with pandas and tell me the sum of column b."
DATA_ROWS = [(1, 1234), (2, 5678), (3, 91011), (4, 1213), (5, 40404)]
DATA_SUM = sum(b for _, b in DATA_ROWS)  # 139540: not a number a model guesses
TERMINAL = ("completed", "failed", "answer_unavailable", "cancelled")


def _first_step_prompt(model: Path, profile_name: str) -> int:
    """Tokens of the local model's first-step prompt for the data question under a prompt
    profile, rendered exactly as the gateway renders it (vocabulary only, no weights)."""
    from kaizen_plugins.agents import GENERAL
    from llama_cpp import Llama

    from kaizen_server_extension.lanes.context import attachment_note
    from kaizen_server_extension.models import profiles
    from kaizen_server_extension.policy.grounding import compose_system_prompt
    from kaizen_server_extension.tools.catalog import freeze_catalog
    from kaizen_server_extension.tools.registry import ToolRegistry, build_plugin_manager

    profile = {"full": profiles.FULL, "compact": profiles.COMPACT}[profile_name]
    pm, first_party = build_plugin_manager()
    registry = ToolRegistry.from_plugin_manager(pm, first_party)
    catalog = freeze_catalog(registry.descriptors(), agent_ceiling=set(GENERAL.tool_ceiling),
                             room_shared=False, roster_is_only_initiator=True,
                             discovery_enabled=False, member_request=DATA_QUESTION,
                             direct=profile.direct_tools, earned=("run_code",),
                             description_chars=profile.description_chars)
    note = attachment_note({"attachments": [{"filename": "data.csv",
                                             "media_type": "text/csv", "size": 60}]})
    snapshot = StepSnapshot(step=1, messages=(
        ChatMessage("system", compose_system_prompt(GENERAL.persona,
                                                    compact=profile.compact_prompt)),
        ChatMessage("user", DATA_QUESTION + note)), tools=catalog.first_step)
    llm = Llama(model_path=str(model), vocab_only=True, verbose=False)
    return len(format_prompt(llm, render_messages(snapshot, constrained=True)).tokens)


def bench_bare_baseline(model: Path, n: int, threads: int) -> tuple[float, int]:
    """Median seconds of the same llama call with a bare minimal prompt, and its tokens."""
    from llama_cpp import Llama

    config = LocalModelConfig(model, max_tokens=48, n_threads=threads, seed=7)
    llm = Llama(model_path=str(model), n_ctx=config.n_ctx, n_threads=threads,
                n_threads_batch=threads, seed=config.seed, verbose=False)
    prompt = format_prompt(llm, [{"role": "system", "content": "You are a helpful assistant."},
                                 {"role": "user", "content": DATA_QUESTION}])
    seconds: list[float] = []
    for _ in range(n):
        llm.reset()
        start = time.perf_counter()
        for _chunk in completion_stream(llm, prompt.tokens, config, seed=config.seed,
                                        stop=prompt.stop,
                                        stopping_criteria=prompt.stopping_criteria):
            pass
        seconds.append(time.perf_counter() - start)
    llm.close()
    return statistics.median(seconds), len(prompt.tokens)


def bench_data_task(model: Path, runs: int, threads: int) -> None:
    import re

    from kaizen_server_extension.protocol.model_facing import echoes
    from kaizen_server_extension.store.engine import sqlite_url_for
    from tests.support.server import start_server

    baseline_s, baseline_tokens = bench_bare_baseline(model, max(1, runs), threads)
    full_tokens = _first_step_prompt(model, "full")
    repair = ("The run failed with ModuleNotFoundError. Fix the code and run it again; do "
              "not resend the same code unchanged.")
    with tempfile.TemporaryDirectory(prefix="kzbench-data-") as tmp:
        root = Path(tmp)
        (root / "data.csv").write_text("a,b\n" + "".join(f"{a},{b}\n" for a, b in DATA_ROWS))
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
            "KAIZEN_LOCAL_MODEL_PATH": str(model), "KAIZEN_LOCAL_MODEL_SEED": "1234",
            "KAIZEN_LOCAL_MODEL_THREADS": str(threads), "KAIZEN_KERNEL_POOL_SIZE": "1"})
        seconds: list[float] = []
        outcomes: list[str] = []
        prompt_tokens: list[int | None] = []
        successes = honest = echoed = 0
        try:
            with server.client("alice") as alice:
                alice.put("members/me/settings", json={"approval_mode": "never_ask"})
                for _ in range(runs):
                    room = alice.post("conversations", json={"agent_id": "general"}).json()["id"]
                    attached = alice.post("jupyter-files", json={"path": "data.csv"}).json()
                    start = time.perf_counter()
                    accepted = alice.post(f"conversations/{room}/messages", json={
                        "text": DATA_QUESTION,
                        "attachments": [attached["artifact"]["id"]]}).json()
                    while True:
                        run = alice.get(f"runs/{accepted['run_id']}").json()
                        if run["status"] in TERMINAL:
                            break
                        time.sleep(0.05)
                    seconds.append(time.perf_counter() - start)
                    outcomes.append(f"{run['status']}/{run['outcome']}")
                    events = alice.get(f"conversations/{room}/journal",
                                       params={"limit": 1000}).json()["events"]
                    mine = [e for e in events if e.get("run_id") == accepted["run_id"]]
                    answer = " ".join(str(e["data"].get("text", "")) for e in mine
                                      if e["type"] == "answer.committed")
                    message = " ".join(str(e["data"].get("message", "")) for e in mine
                                       if e["type"] == "run.terminal")
                    said = f"{answer} {message}"
                    digits = re.sub(r"(?<=\d)[,\s_'](?=\d)", "", answer)
                    if echoes(said, [repair]) or "Fix the code" in said:
                        echoed += 1
                    elif str(DATA_SUM) in digits:
                        successes += 1
                    elif run["status"] != "completed" and message:
                        honest += 1
                    found = re.search(
                        rf"local model step 1: (\d+) prompt tokens.*run={accepted['run_id']}",
                        server.log())
                    prompt_tokens.append(int(found.group(1)) if found else None)
        finally:
            server.stop()
    emit("data_task", n=runs, successes=successes, honest=honest, echoes=echoed,
         p50_s=round(statistics.median(seconds), 2), max_s=round(max(seconds), 2),
         target_s=20.0, meets_target=statistics.median(seconds) <= 20.0,
         first_step_prompt_tokens=prompt_tokens,
         full_profile_prompt_tokens=full_tokens,
         baseline_s=round(baseline_s, 2), baseline_prompt_tokens=baseline_tokens,
         ratio=round(statistics.median(seconds) / baseline_s, 2), outcomes=outcomes,
         threads=threads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=default_threads(),
                        help="generation threads (default: the server's default)")
    parser.add_argument("--db", default="sqlite", help="ignored (no store)")
    parser.add_argument("--skip-turn", action="store_true")
    parser.add_argument("--data-runs", type=int, default=5,
                        help="turns of the data task (0 skips it)")
    parser.add_argument("--only-data", action="store_true",
                        help="run only the data task")
    args = parser.parse_args(argv)
    model = configured_model_path()
    if model is None or not model.is_file() or not llama_cpp_available():
        print(json.dumps({"bench": BENCH, "skipped": "no local model or llama-cpp-python "
                          "(kaizen-local-model setup)"}), flush=True)
        return 0
    if not args.only_data:
        asyncio.run(bench_stream(model, args.n, args.max_tokens, args.threads))
        if not args.skip_turn:
            bench_tool_turn(model, max(1, args.n // 2))
    if args.data_runs > 0:
        bench_data_task(model, args.data_runs, args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
