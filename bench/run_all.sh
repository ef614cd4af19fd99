#!/usr/bin/env bash
# Run every benchmark; each prints one JSON object per line on stdout.
#   bench/run_all.sh [--db sqlite|postgresql|both]      (default: both)
# Extra arguments are passed to every bench; KAIZEN_BENCH_DATABASE_URL picks the PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
for bench in pipeline_overhead tool_search search runtime_overhead turns_throughput e2e_overhead accept_latency bad_input run_code notebook takeover local_model mcp_call; do
    "$PYTHON" "bench/$bench.py" "$@"
done
