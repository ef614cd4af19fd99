"""Each benchmark runs with a tiny ``--n`` on SQLite and prints well-formed JSON lines.

Only the shape is checked: timing assertions never go into tests (DESIGN.md: Benchmarks).
The benches run as subprocesses, three at a time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The module's one fixture runs every bench: its first test carries that whole wait.
pytestmark = pytest.mark.timeout(600)
CONCURRENT = 3
TIMEOUT_S = 90

COMMON = {"bench", "db", "n"}
PERCENTILES = {"p50_us", "p95_us", "baseline_p50_us", "ratio"}

#: bench → (extra arguments, number of lines printed, keys every line carries)
BENCHES: dict[str, tuple[list[str], int, set[str]]] = {
    "pipeline_overhead": (["--n", "5"], 4, COMMON | PERCENTILES | {"variant", "call",
                                                                   "overhead_p50_us"}),
    "tool_search": (["--n", "10", "--tools", "200"], 2, COMMON | {"figure", "tools"}),
    "runtime_overhead": (["--n", "3"], 3, COMMON | PERCENTILES | {"figure", "cpu_p50_us",
                                                                  "cpu_p95_us"}),
    "turns_throughput": (["--n", "1", "--rooms", "3"], 1, COMMON | {
        "rooms", "turns", "tool_calls_per_turn", "turns_per_s", "tool_calls_per_s",
        "elapsed_s", "completed", "baseline_turns_per_s", "ratio"}),
    # interrupt_to_usable prints a second line, for the jail, where bubblewrap is installed.
    "run_code": (["--n", "5"], 7 + (shutil.which("bwrap") is not None), COMMON),
    "notebook": (["--n", "2"], 2, COMMON | PERCENTILES | {"figure", "p50_ms"}),
    "takeover": (["--n", "1"], 1, COMMON | {"figure", "baseline_s", "ratio", "violations"}),
    "e2e_overhead": (["--n", "1", "--rooms", "3"], 2, {"bench", "db", "figure"}),
    "search": (["--n", "5", "--chunks", "200", "--docs", "4"], 2,
               COMMON | {"figure", "chunks", "ratio"}),
    "bad_input": (["--n", "20"], 1, COMMON | {"cases", "server_errors", "writes_on_error",
                                              "statuses", "reproductions",
                                              "reproduction_server_errors"}),
    "accept_latency": (["--n", "3", "--spread-n", "4", "--rooms", "2", "--trials", "1"], 2,
                       COMMON | {"figure", "p50_ms", "p95_ms", "max_ms", "baseline_p95_ms",
                                 "ratio", "turns_per_s", "violations"}),
}

FIGURE_KEYS: dict[tuple[str, str], set[str]] = {
    ("tool_search", "index_build"): {"build_ms", "freeze_ms"},
    ("tool_search", "query"): PERCENTILES | {"target_p50_us", "meets_target",
                                             "queries_with_matches"},
    ("runtime_overhead", "tool_call"): {"target_p50_us", "meets_target",
                                        "transactions_per_call", "statements_per_call"},
    ("notebook", "kernel_probe"): {"bytes_raw", "bytes_returned", "frames"},
    ("notebook", "attach_200_cells"): {"prompt_chars", "prompt_tokens", "notebook_bytes"},
    ("takeover", "restart_to_recovered"): {"resumed_after_ready_p50_s"},
    ("e2e_overhead", "overhead_per_tool_step"): {"n", "p50_ms", "p95_ms", "turn_p50_ms",
                                                 "baseline_replay_p50_ms", "ratio"},
    ("e2e_overhead", "turns_throughput"): {"rooms", "turns", "turns_per_s", "elapsed_s"},
    ("search", "index"): {"chunks_per_s", "baseline_chunks_per_s", "elapsed_s"},
    ("search", "search"): PERCENTILES | {"target_p50_us", "meets_target", "queries_with_hits"},
    ("run_code", "interrupt_to_usable"): {"jail", "p50_ms", "baseline_p50_ms", "ratio",
                                          "state_kept"},
}


@pytest.fixture(scope="module")
def outputs() -> Iterator[dict[str, subprocess.CompletedProcess[str]]]:
    """Every bench once, at most CONCURRENT at a time: several start servers and kernels,
    and all at once on two cores starves them past any sensible timeout."""
    done: dict[str, subprocess.CompletedProcess[str]] = {}
    names = list(BENCHES)
    running: list[subprocess.Popen[str]] = []
    try:
        for start in range(0, len(names), CONCURRENT):
            batch = names[start:start + CONCURRENT]
            running = [subprocess.Popen(
                [sys.executable, str(ROOT / "bench" / f"{name}.py"), "--db", "sqlite",
                 *BENCHES[name][0]],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            ) for name in batch]
            for name, proc in zip(batch, running, strict=True):
                out, err = proc.communicate(timeout=TIMEOUT_S)
                done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        yield done
    finally:
        for proc in running:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _lines(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines, "the bench printed nothing"
    parsed = []
    for line in lines:
        value = json.loads(line)  # every line is one JSON object
        assert isinstance(value, dict), line
        parsed.append(value)
    return parsed


@pytest.mark.parametrize("bench", sorted(BENCHES))
def test_bench_prints_one_json_object_per_figure(
    bench: str, outputs: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    _, expected_lines, keys = BENCHES[bench]
    figures = _lines(outputs[bench])
    assert len(figures) == expected_lines
    for figure in figures:
        assert figure["bench"] == bench
        assert figure["db"] in ("sqlite", "none")
        missing = keys - figure.keys()
        extra = FIGURE_KEYS.get((bench, str(figure.get("figure"))), set())
        missing |= extra - figure.keys()
        assert not missing, f"{bench} line lacks {sorted(missing)}: {figure}"
        assert "skipped" not in figure


def test_bad_input_bench_finds_no_server_error_and_no_write(
    outputs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    (figure,) = _lines(outputs["bad_input"])
    assert figure["cases"] == figure["reproductions"] + 20
    assert figure["server_errors"] == 0 and figure["writes_on_error"] == 0, figure


def test_pipeline_bench_covers_reads_and_writes_in_memory_and_on_the_store(
    outputs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    seen = {(f["variant"], f["db"], f["call"]) for f in _lines(outputs["pipeline_overhead"])}
    assert seen == {("memory", "none", "read"), ("memory", "none", "write"),
                    ("store", "sqlite", "read"), ("store", "sqlite", "write")}


def test_takeover_bench_keeps_the_crash_guarantees(
    outputs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    (figure,) = _lines(outputs["takeover"])
    assert figure["violations"] == 0 and figure["n"] == 1


def test_throughput_bench_completes_every_turn(
    outputs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    (figure,) = _lines(outputs["turns_throughput"])
    assert figure["completed"] == figure["turns"] == 3
