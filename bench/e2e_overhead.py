"""Per-step overhead of the whole server path, and turns/s through REST (issue 16).

A real server (SQLite, then PostgreSQL) with ``e2e_bench_plugin`` loaded (a no-op READ tool,
an agent whose ceiling is that tool) answers to the scripted OpenAI-compatible server on
loopback. A turn is 10 model steps that each ask for the no-op tool, then a text answer: 11
model requests. For each turn:

* Kaizen's time is ``run.admitted`` → ``run.terminal`` from the journal (server clock);
* the baseline is the same 11 request bodies, as the fake recorded them, replayed in order
  with a bare ``httpx`` client (streamed and read to the end), timed in this process;
* overhead per tool step = (Kaizen's time - the replay's) / 10.

Then ``turns_throughput``: ``--rooms`` rooms (spread over the test members) each get one
message at once (a turn of one tool step and an answer); turns/s = rooms / (last terminal -
first send).

    .venv/bin/python bench/e2e_overhead.py [--db sqlite|postgresql|both] [--n 10] [--rooms 50]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH_DIR))

from benchkit import emit, parse_args, process_cpu_s, quantile, reachable_databases  # noqa: E402
from e2e_bench_plugin import E2E_AGENT, NOOP_TOOL  # noqa: E402

from kaizen_server_extension.store.engine import sqlite_url_for  # noqa: E402
from kaizen_server_extension.testing.fake_openai import FakeOpenAI  # noqa: E402
from tests.support.server import MEMBERS, ServerProcess, start_server  # noqa: E402

BENCH = "e2e_overhead"
TOOL_STEPS = 10
TERMINAL = {"completed", "failed", "answer_unavailable", "cancelled"}
STEPS_TEXT = "bench e2e ten steps"
QUICK_TEXT = "bench e2e one step"
NOOP_CALL = {"tool_calls": [{"name": NOOP_TOOL, "arguments": {}}]}
SCRIPTS: list[dict[str, Any]] = [
    {"match": STEPS_TEXT, "responses": [NOOP_CALL] * TOOL_STEPS + [{"text": "Done."}]},
    {"match": QUICK_TEXT, "responses": [NOOP_CALL, {"text": "Done."}]},
]




@contextmanager
def served(db: str, pg_url: str, fake: FakeOpenAI,
           cprofile: str | None = None) -> Iterator[ServerProcess]:
    with tempfile.TemporaryDirectory(prefix="kaizen-e2e-bench-") as tmp:
        root = Path(tmp)
        schema = None
        url = sqlite_url_for(root / "kaizen.db")
        if db == "postgresql":
            url, schema = pg_url, "kz_bench_" + uuid.uuid4().hex[:10]
        server = start_server(root / "server", url, schema, extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model",
            "KAIZEN_PLUGINS": "e2e_bench_plugin", "PYTHONPATH": f"{BENCH_DIR}:{ROOT}",
            "AGENT_LOOP_MAX_CYCLES": str(TOOL_STEPS + 4), "KAIZEN_LOG_LEVEL": "WARNING",
            **({"KAIZEN_PROFILE": f"{cprofile}.{db}.prof"} if cprofile else {})})
        try:
            yield server
        finally:
            server.stop()
            if schema:
                asyncio.run(_drop_schema(pg_url, schema))


async def _drop_schema(pg_url: str, schema: str) -> None:
    from kaizen_server_extension.store import create_engine

    engine = create_engine(pg_url)
    try:
        async with engine.begin() as conn:
            await conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await engine.dispose()


def _room(client: httpx.Client) -> str:
    created = client.post("conversations", json={"agent_id": E2E_AGENT})
    created.raise_for_status()
    return str(created.json()["id"])


def _journal(client: httpx.Client, room: str) -> list[dict[str, Any]]:
    page = client.get(f"conversations/{room}/journal", params={"limit": 1000})
    page.raise_for_status()
    events: list[dict[str, Any]] = page.json()["events"]
    return events


def _wait_requests(fake: FakeOpenAI, count: int, timeout: float = 300) -> None:
    """Until the model has been asked ``count`` times. Read in this process, not by polling
    the server: a poll is a request served on the very loop the turn runs on."""
    deadline = time.monotonic() + timeout
    while fake.request_count < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the model saw {fake.request_count} of {count} requests")
        time.sleep(0.005)


def _wait_terminal(client: httpx.Client, room: str, timeout: float = 120,
                   poll_s: float = 0.02) -> list[dict[str, Any]]:
    """The room's journal once its run settled (callers first wait for the model's last
    request, so this polls once or twice)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = _journal(client, room)
        terminal = [e for e in events if e["type"] == "run.terminal"]
        if terminal:
            status = terminal[-1]["data"].get("status")
            if status != "completed":
                raise RuntimeError(f"bench turn ended {status}: {terminal[-1]['data']}")
            return events
        time.sleep(poll_s)
    raise RuntimeError("bench turn did not settle")




@contextmanager
def profiled(pid: int, path: str | None, db: str) -> Iterator[None]:
    """``py-spy record`` attached to the server while the block runs (``--profile``): the
    collapsed stacks go to ``PATH.<db>.txt`` and a summary (bench/pyspy_summary.py) is
    printed to stderr. py-spy is a development tool, not a dependency: without it the block
    runs unprofiled."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if path is None or not Path(spy).exists():
        if path is not None:
            print("py-spy not found: running unprofiled", file=sys.stderr)
        yield
        return
    out = f"{path}.{db}.txt"
    recorder = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "500", "--format",
                                 "raw", "--output", out, "--nonblocking"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the first measured turn
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(30)
        from pyspy_summary import summarize

        print(summarize(Path(out).read_text()), file=sys.stderr)


@contextmanager
def cprofiled(server: ServerProcess, path: str | None, db: str) -> Iterator[None]:
    """The server's own cProfile of its loop thread (KAIZEN_PROFILE, ``--cprofile``) over the
    block: started and written by signals; a summary goes to stderr."""
    if path is None:
        yield
        return
    out = Path(f"{path}.{db}.prof")
    out.unlink(missing_ok=True)
    server.process.send_signal(signal.SIGUSR1)
    time.sleep(0.2)
    try:
        yield
    finally:
        server.process.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        import io
        import pstats

        text = io.StringIO()
        stats = pstats.Stats(str(out), stream=text)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats("kaizen_server_extension", 40)
        print(text.getvalue(), file=sys.stderr)
        gc_path = Path(f"{out}.gc.json")
        if gc_path.exists():
            print("garbage collections while profiling:", gc_path.read_text(), file=sys.stderr)


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["at"]).timestamp()


def _replay_s(base_url: str, bodies: list[dict[str, Any]]) -> float:
    """The same requests with a bare client, in order, each stream read to its end."""
    with httpx.Client(base_url=base_url, timeout=30) as bare:
        start = time.perf_counter()
        for body in bodies:
            with bare.stream("POST", "/chat/completions", json=body) as response:
                response.raise_for_status()
                for _ in response.iter_bytes():
                    pass
        return time.perf_counter() - start


def per_step_overhead(db: str, server: ServerProcess, fake: FakeOpenAI, n: int,
                      profile: str | None = None, cprofile: str | None = None) -> None:
    kaizen_ms: list[float] = []
    replay_ms: list[float] = []
    overhead_ms: list[float] = []
    cpu_ms: list[float] = []
    pid = server.process.pid
    with server.client("alice") as alice, ExitStack() as spying:
        alice.put("members/me/settings", json={"approval_mode": "never_ask"}).raise_for_status()
        for i in range(n + 1):  # the first turn warms the server's caches and is not counted
            if i == 1:
                spying.enter_context(profiled(pid, profile, db))
                spying.enter_context(cprofiled(server, cprofile, db))
            httpx.post(fake.base_url.removesuffix("/v1") + "/_fake/reset").raise_for_status()
            room = _room(alice)
            cpu_before = process_cpu_s(pid)
            alice.post(f"conversations/{room}/messages",
                       json={"text": STEPS_TEXT}).raise_for_status()
            _wait_requests(fake, TOOL_STEPS + 1)
            events = _wait_terminal(alice, room)
            cpu_turn = process_cpu_s(pid) - cpu_before
            admitted = next(e for e in events if e["type"] == "run.admitted")
            terminal = next(e for e in events if e["type"] == "run.terminal")
            bodies = httpx.get(fake.base_url.removesuffix("/v1") + "/_fake/requests").json()[
                "requests"]
            if len(bodies) != TOOL_STEPS + 1:
                raise RuntimeError(f"expected {TOOL_STEPS + 1} model requests, saw {len(bodies)}")
            turn_s = _at(terminal) - _at(admitted)
            bare_s = _replay_s(fake.base_url, bodies)
            if i == 0:
                continue
            cpu_ms.append(cpu_turn * 1000)
            kaizen_ms.append(turn_s * 1000)
            replay_ms.append(bare_s * 1000)
            overhead_ms.append((turn_s - bare_s) * 1000 / TOOL_STEPS)
    emit({
        "bench": BENCH, "figure": "overhead_per_tool_step", "db": db, "n": n,
        "tool_steps_per_turn": TOOL_STEPS,
        "p50_ms": round(statistics.median(overhead_ms), 3),
        "p95_ms": round(quantile(overhead_ms, 95), 3),
        "turn_p50_ms": round(statistics.median(kaizen_ms), 2),
        "baseline_replay_p50_ms": round(statistics.median(replay_ms), 2),
        "ratio": round(statistics.median(kaizen_ms) / statistics.median(replay_ms), 3),
        # The server's own CPU time over a turn (message POST to terminal seen, its few
        # journal polls included) per tool step: what load on the machine does not move.
        "server_cpu_per_step_p50_ms": round(statistics.median(cpu_ms) / TOOL_STEPS, 3),
    })


def turns_throughput(db: str, server: ServerProcess, fake: FakeOpenAI, rooms: int) -> None:
    members = list(MEMBERS)
    clients = {m: server.client(m) for m in members}
    try:
        for client in clients.values():
            client.put("members/me/settings",
                       json={"approval_mode": "never_ask"}).raise_for_status()
        placed = [(members[i % len(members)], _room(clients[members[i % len(members)]]))
                  for i in range(rooms)]

        async def send_all() -> list[float]:
            async with httpx.AsyncClient(timeout=60) as http:
                async def one(member: str, room: str) -> float:
                    client = clients[member]
                    sent = time.time()
                    response = await http.post(
                        f"{client.base_url}conversations/{room}/messages",
                        headers=dict(client.headers), json={"text": QUICK_TEXT})
                    response.raise_for_status()
                    return sent
                return await asyncio.gather(*(one(m, r) for m, r in placed))

        fake.reset()
        first_sent = min(asyncio.run(send_all()))
        _wait_requests(fake, 2 * rooms)
        last_terminal = 0.0
        for member, room in placed:
            events = _wait_terminal(clients[member], room, timeout=300)
            last_terminal = max(last_terminal, _at(next(
                e for e in events if e["type"] == "run.terminal")))
        elapsed = last_terminal - first_sent
        emit({"bench": BENCH, "figure": "turns_throughput", "db": db, "rooms": rooms,
              "tool_steps_per_turn": 1, "turns": rooms, "elapsed_s": round(elapsed, 3),
              "turns_per_s": round(rooms / elapsed, 2)})
    finally:
        for client in clients.values():
            client.close()


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rooms", type=int, default=50,
                        help="rooms sent one message each at once (default 50)")
    parser.add_argument("--profile", metavar="PATH",
                        help="py-spy the server during the measured turns: PATH.<db>.txt")
    parser.add_argument("--cprofile", metavar="PATH",
                        help="the server's cProfile of its loop thread (CPU time) during the "
                        "measured turns: PATH.<db>.prof")
    parser.add_argument("--skip-throughput", action="store_true",
                        help="measure the per-step figure only")


def main() -> None:
    args = parse_args(__doc__ or BENCH, default_n=10, extra=_extra)
    for db in asyncio.run(reachable_databases(BENCH, args)):
        with FakeOpenAI(SCRIPTS) as fake, served(db, args.pg_url, fake, args.cprofile) as server:
            per_step_overhead(db, server, fake, args.n, args.profile, args.cprofile)
            if not args.skip_throughput:
                turns_throughput(db, server, fake, args.rooms)


if __name__ == "__main__":
    main()
