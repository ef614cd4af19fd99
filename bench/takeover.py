"""Crash recovery through real servers: kill -9 mid-tool, then how long until the room's run
is recovered (issue 21, item 2).

Figures (one JSON line each):

* ``db: "postgresql"``: two replicas on one schema (the second in a PID namespace of its own,
  as in another container, so the crash is seen only through the database's liveness lock).
  Each trial posts a message whose turn sits in a 30 s run_code call, kills -9 the replica
  holding the run, and times kill → the run's terminal as the survivor sees it over REST;
  the crashed replica is then restarted for the next trial. ``baseline_s`` is the lease the
  run holds (``KAIZEN_RUN_LEASE_SECONDS``, 60 s): what a crash cost before the liveness lock.
* ``db: "sqlite"``: one server, killed mid-tool and started again on the same file.
  ``resumed_after_ready_s`` is ready → the run's terminal (the target: at once), and
  ``baseline_s`` the restart itself (process start → ready).

Every trial also checks the guarantees of docs/architecture.md: exactly one terminal, the
dangling call rebuilt once, no run resumed, the model never asked the crashed step again.
``violations`` counts trials that broke one (it must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kaizen_server_extension.store.engine import sqlite_url_for  # noqa: E402
from kaizen_server_extension.testing.fake_openai import FakeOpenAI  # noqa: E402
from tests.support.server import ServerProcess, own_pid_namespace, start_server  # noqa: E402

BENCH = "takeover"
LEASE_S = 60.0
TERMINAL = {"completed", "failed", "cancelled", "refused"}
SCRIPTS: list[dict[str, Any]] = [
    {"match": "sleepy tool", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": "import time; time.sleep(30)", "language": "python",
            "artifact_targets": []}}]},
        {"text": "The program finished."}]},
]
T = TypeVar("T")


def emit(**fields: Any) -> None:
    print(json.dumps({"bench": BENCH, **fields}), flush=True)


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(share * len(ordered) + 0.5) - 1))]


def _wait_for(check: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value is not None:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def _journal(client: httpx.Client, room: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        page = client.get(f"conversations/{room}/journal",
                          params={"after": after, "limit": 1000}).json()
        if not page["events"]:
            return events
        events.extend(page["events"])
        after = page["next"]


def _wait_terminal(client: httpx.Client, run_id: str, what: str) -> None:
    _wait_for(lambda: True if client.get(f"runs/{run_id}").json()["status"] in TERMINAL
              else None, LEASE_S * 2, what)


def _kill_9(server: ServerProcess) -> None:
    orphans = psutil.Process(server.process.pid).children(recursive=True)
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(10)
    for child in orphans:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(orphans, timeout=5)


def _holder_pid(schema: str, dsn: str, run_id: str) -> int | None:
    """The pid in the run's lease owner (``host:pid:nonce[:live]``)."""
    import asyncpg

    async def query() -> str | None:
        conn = await asyncpg.connect(dsn)
        try:
            owner: str | None = await conn.fetchval(
                f'SELECT lease_owner FROM "{schema}".runs WHERE id = $1', run_id)
            return owner
        finally:
            await conn.close()

    owner = asyncio.run(query())
    return int(owner.split(":")[1]) if owner else None


def _pids_of(server: ServerProcess) -> set[int]:
    process = psutil.Process(server.process.pid)
    return {process.pid, *(c.pid for c in process.children(recursive=True)), 1, 2} \
        if process.name() == "unshare" else {process.pid}


def _start_trial(client: httpx.Client, trial: int) -> tuple[str, str]:
    room = client.post("conversations", json={"agent_id": "general"}).json()["id"]
    accepted = client.post(f"conversations/{room}/messages",
                           json={"text": f"sleepy tool please ({trial})",
                                 "idempotency_key": f"takeover-{trial}"}).json()
    run_id = str(accepted["run_id"])
    _wait_for(lambda: True if any(e["type"] == "tool.requested" and e["run_id"] == run_id
                                  for e in _journal(client, room)) else None,
              60, "the tool call to be in flight")
    return room, run_id


def _guarantees_hold(client: httpx.Client, room: str, run_id: str, fake: FakeOpenAI,
                     trial: int) -> bool:
    mine = [e for e in _journal(client, room) if e["run_id"] == run_id]
    terminals = [e for e in mine if e["type"] == "run.terminal"]
    settled = [e for e in mine if e["type"] == "tool.settled"]
    asked = sum(1 for r in fake.requests()
                if f"sleepy tool please ({trial})" in json.dumps(r.get("messages", [])[-1:]))
    return (len(terminals) == 1 and len(settled) == 1 and settled[0]["data"].get("rebuilt")
            is True and not any(e["type"] == "run.resumed" for e in mine) and asked == 1)


@contextmanager
def _fake_model() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(SCRIPTS) as fake:
        yield fake


def bench_postgresql(pg_url: str, trials: int) -> None:
    try:
        import asyncpg

        dsn = pg_url.replace("postgresql+asyncpg://", "postgresql://", 1)

        async def ping() -> None:
            conn = await asyncpg.connect(dsn, timeout=3)
            await conn.close()

        asyncio.run(ping())
    except Exception as exc:  # any failure to connect means "skip"
        emit(db="postgresql", skipped=f"PostgreSQL unreachable: {type(exc).__name__}")
        return
    schema = "kzbench_" + uuid.uuid4().hex[:12]

    async def drop_schema() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    recovered: list[float] = []
    violations = 0
    with _fake_model() as fake, tempfile.TemporaryDirectory() as tmp:
        env = {"KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model",
               "KAIZEN_RUN_LEASE_SECONDS": str(LEASE_S), "KAIZEN_KERNEL_POOL_SIZE": "1"}
        wrappers = {"a": (), "b": own_pid_namespace() or ()}
        servers: dict[str, ServerProcess] = {}

        def start(name: str) -> ServerProcess:
            return start_server(Path(tmp) / f"replica-{name}-{time.monotonic_ns()}", pg_url,
                                schema, extra_env=env, wrapper=wrappers[name])

        try:
            for name in wrappers:  # one after the other: the first migrates the schema
                servers[name] = start(name)
            for trial in range(trials):
                with servers["a"].client("alice") as client:
                    room, run_id = _start_trial(client, trial)
                pid = _holder_pid(schema, dsn, run_id)
                crashed = next(n for n, s in servers.items() if pid in _pids_of(s))
                survivor = servers["b" if crashed == "a" else "a"]
                _kill_9(servers[crashed])
                killed_at = time.monotonic()
                with survivor.client("alice") as client:
                    _wait_terminal(client, run_id, "the survivor to recover the run")
                    recovered.append(time.monotonic() - killed_at)
                    violations += not _guarantees_hold(client, room, run_id, fake, trial)
                servers[crashed] = start(crashed)
        finally:
            for server in servers.values():
                server.stop()
            asyncio.run(drop_schema())
    emit(db="postgresql", n=len(recovered), figure="kill_9_to_recovered",
         p50_s=round(statistics.median(recovered), 3), p95_s=round(_percentile(recovered, .95), 3),
         max_s=round(max(recovered), 3), target_s=5.0,
         meets_target=_percentile(recovered, .95) <= 5.0, baseline_s=LEASE_S,
         ratio=round(statistics.median(recovered) / LEASE_S, 4), violations=violations)


def bench_sqlite(trials: int) -> None:
    resumed: list[float] = []
    restarts: list[float] = []
    violations = 0
    with _fake_model() as fake, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        database = root / "kaizen.sqlite"
        url = sqlite_url_for(database)
        env = {"KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model",
               "KAIZEN_RUN_LEASE_SECONDS": str(LEASE_S), "KAIZEN_KERNEL_POOL_SIZE": "1"}
        server = start_server(root / "server", url, extra_env=env)
        try:
            for trial in range(trials):
                with server.client("alice") as client:
                    room, run_id = _start_trial(client, trial)
                _kill_9(server)
                started = time.monotonic()
                server = start_server(root / "server", url, extra_env=env)
                ready = time.monotonic()
                restarts.append(ready - started)
                with server.client("alice") as client:
                    _wait_terminal(client, run_id, "the restarted server to recover the run")
                    resumed.append(time.monotonic() - ready)
                    violations += not _guarantees_hold(client, room, run_id, fake, trial)
        finally:
            server.stop()
    emit(db="sqlite", n=len(resumed), figure="restart_to_recovered",
         resumed_after_ready_p50_s=round(statistics.median(resumed), 3),
         resumed_after_ready_max_s=round(max(resumed), 3),
         baseline_s=round(statistics.median(restarts), 3),
         ratio=round(statistics.median(resumed) / statistics.median(restarts), 4),
         violations=violations)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--n", type=int, default=20, help="kill -9 trials per store")
    parser.add_argument("--pg-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/test")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")
    if args.db in ("sqlite", "both"):
        bench_sqlite(args.n)
    if args.db in ("postgresql", "both"):
        bench_postgresql(args.pg_url, args.n)


if __name__ == "__main__":
    main()
