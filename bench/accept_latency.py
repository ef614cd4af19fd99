"""Accept latency under a burst: ``POST conversations/{id}/messages`` answered while many
senders post at once, through real servers (issue 21, item 3).

On PostgreSQL two server replicas share one schema (started one after the other: the first
migrates it) and the scripted OpenAI-compatible server on loopback; on SQLite one server
(the embedded store is one machine's). Every sender has its own keep-alive connection, opened
before the clock starts, and the posts alternate between the replicas. Figures, one JSON line
each:

* ``figure: "one_room"``: ``--n`` messages (default 100) posted at once into one room;
* ``figure: "rooms"``: ``--spread-n`` messages (default 50) posted at once over ``--rooms``
  rooms (default 10), round robin.

Per figure: ``p50_ms``, ``p95_ms``, ``max_ms`` of each post (sent → 202 read, as the sender
sees it), ``target_p95_ms`` 50 and ``meets_target``; ``turns_per_s`` = messages / (the last
``run.terminal`` - the first send), each turn a one-step text answer. The baseline is the
same burst of authenticated ``GET members/me`` (no store work) on the same connections in the
same run: ``baseline_p50_ms``, ``baseline_p95_ms``, and ``ratio`` = ``p95_ms /
baseline_p95_ms``. ``server_cpu_ms_per_post`` is the CPU the server processes used (the
scheduler's per-thread count, bench/benchkit.py) between the first send and the last answer
of the posts' burst, per post, and ``baseline_cpu_ms_per_get`` the same for the baseline
burst: on a machine shared with other work these do not grow with the wait for a core, so
``cpu_ratio`` (their quotient) is the comparable figure. The turns that start during the
burst are in the posts' CPU (their admissions and steps run on the same servers). Every
figure checks what the burst must not break (docs/architecture.md): each input accepted once
with its own gap-free position, admitted in position order, one terminal each (completed),
never two runs of a room active (admissions and terminals alternate in the journal);
``violations`` counts the broken ones (it must be 0). Each server serves one warm-up turn
before anything is measured.

    .venv/bin/python bench/accept_latency.py [--db sqlite|postgresql|both] [--n 100]
        [--spread-n 50] [--rooms 10] [--trials 3] [--profile PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import pstats
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH_DIR))

from benchkit import (  # noqa: E402
    emit,
    parse_args,
    process_cpu_s,
    quantile,
    reachable_databases,
)
from e2e_overhead import profiled  # noqa: E402

from kaizen_server_extension.store.engine import sqlite_url_for  # noqa: E402
from kaizen_server_extension.testing.fake_openai import FakeOpenAI  # noqa: E402
from tests.support.server import (  # noqa: E402
    ServerProcess,
    member_token,
    start_server,
)

BENCH = "accept_latency"
TARGET_P95_MS = 50.0
MEMBER = "alice"
TEXT = "accept bench message"
SCRIPTS: list[dict[str, Any]] = [{"match": TEXT, "responses": [{"text": "Accepted."}]}]
SETTLE_TIMEOUT_S = 300.0




@contextmanager
def replicas(db: str, pg_url: str, fake: FakeOpenAI,
             cprofile: str | None = None) -> Iterator[list[ServerProcess]]:
    """Two replicas on one fresh PostgreSQL schema, or one server on a fresh SQLite file.
    With ``cprofile`` the first server can profile its loop (KAIZEN_PROFILE, see
    :class:`LoopProfile`)."""
    with tempfile.TemporaryDirectory(prefix="kaizen-accept-bench-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        url, schema = sqlite_url_for(root / "kaizen.db"), None
        if db == "postgresql":
            url, schema = pg_url, "kzbench_" + uuid.uuid4().hex[:12]
            stack.callback(lambda: asyncio.run(_drop_schema(pg_url, schema)))
        env = {"KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model",
               "KAIZEN_LOG_LEVEL": "WARNING"}
        servers: list[ServerProcess] = []

        def stop_all() -> None:
            for server in servers:
                server.stop()

        stack.callback(stop_all)
        # One after the other: the first migrates the schema.
        for name in ("a", "b") if db == "postgresql" else ("a",):
            profiling = {"KAIZEN_PROFILE": str(root / "loop.prof")} if cprofile and not servers \
                else {}
            servers.append(start_server(root / f"replica-{name}", url, schema,
                                        extra_env={**env, **profiling}))
        for server in servers:
            _warm_up(server)
        _warm_up_burst(servers)
        yield servers


def _warm_up(server: ServerProcess) -> None:
    """One turn on ``server`` before anything is measured: a server that has served turns
    has imported and compiled what a turn needs (the first admission does that once), and
    a deployment's servers have."""
    with server.client(MEMBER) as client:
        room = client.post("conversations", json={"agent_id": "general"})
        room.raise_for_status()
        room_id = str(room.json()["id"])
        client.post(f"conversations/{room_id}/messages",
                    json={"text": f"{TEXT} warm-up"}).raise_for_status()
        _settled(client, {room_id: 1})


def _warm_up_burst(servers: list[ServerProcess], n: int = 24) -> None:
    """A small burst into one room before anything is measured: each server's pooled
    database connections have then prepared the acceptance statements a burst uses, as a
    serving deployment's have (the first use of a statement on a connection plans it)."""
    with servers[0].client(MEMBER) as client:
        room = client.post("conversations", json={"agent_id": "general"})
        room.raise_for_status()
        room_id = str(room.json()["id"])
        posts: list[Request] = [("POST", f"conversations/{room_id}/messages",
                                 {"text": f"{TEXT} warm-up {i}"}) for i in range(n)]
        asyncio.run(_bursts(servers, "raw", posts))
        _settled(client, {room_id: n})


async def _drop_schema(pg_url: str, schema: str) -> None:
    from kaizen_server_extension.store import create_engine

    engine = create_engine(pg_url)
    try:
        async with engine.begin() as conn:
            await conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await engine.dispose()


Request = tuple[str, str, dict[str, Any] | None]


def server_cpu_s(servers: list[ServerProcess]) -> float:
    """CPU seconds the server processes have used so far (bench/benchkit.py)."""
    return sum(process_cpu_s(server.process.pid) for server in servers)


class Senders:
    """One keep-alive connection per sender, each bound to one replica (round robin).

    ``client="raw"`` (the default) writes each request's bytes, built before the clock
    starts, on an asyncio stream and reads the answer back; ``"httpx"`` sends it through an
    ``httpx.AsyncClient`` per sender. httpx costs its process ≈ 1 to 2 ms of CPU per request on
    this machine, so a burst of 100 from one process waits ≈ 0.1 to 0.2 s for its own client
    before the servers matter: the raw sender keeps the instrument out of the figure. Both
    measure the same span (sent → the whole answer read) for the posts and the baseline.
    """

    def __init__(self, servers: list[ServerProcess], count: int, client: str) -> None:
        self.servers = servers
        self.client = client
        self.bases = [servers[i % len(servers)].base_url + "kaizen/api/"
                      for i in range(count)]
        self.headers = {"Authorization": f"token {member_token(MEMBER)}"}
        self.clients: list[httpx.AsyncClient] = []
        self.streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def open(self) -> None:
        if self.client == "httpx":
            self.clients = [httpx.AsyncClient(
                base_url=base, headers=self.headers, timeout=60,
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
                for base in self.bases]
            return
        for base in self.bases:
            url = httpx.URL(base)
            self.streams.append(await asyncio.open_connection(url.host, url.port))

    async def close(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients))
        for _, writer in self.streams:
            writer.close()
            await writer.wait_closed()

    def _raw_request(self, i: int, method: str, path: str,
                     body: dict[str, Any] | None) -> bytes:
        url = httpx.URL(self.bases[i]).join(path)
        payload = json.dumps(body).encode() if body is not None else b""
        head = [f"{method} {url.raw_path.decode()} HTTP/1.1", f"Host: {url.host}:{url.port}",
                *(f"{k}: {v}" for k, v in self.headers.items()),
                f"Content-Length: {len(payload)}"]
        if body is not None:
            head.append("Content-Type: application/json")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + payload

    async def _raw(self, i: int, request: bytes) -> tuple[int, bytes]:
        reader, writer = self.streams[i]
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = next(int(line.split(":", 1)[1]) for line in lines[1:]
                      if line.lower().startswith("content-length:"))
        return status, await reader.readexactly(length)

    async def burst(self, requests: list[Request],
                    ) -> tuple[list[float], list[dict[str, Any]], float, float]:
        """Send request i on connection i, all at once; each one's latency (ms), its JSON
        answer, the wall-clock time of the first send, and the servers' CPU seconds from the
        first send to the last answer."""
        start = asyncio.Event()
        raw = [self._raw_request(i, *r) for i, r in enumerate(requests)] \
            if self.client == "raw" else []

        async def one(i: int) -> tuple[float, dict[str, Any]]:
            method, path, body = requests[i]
            await start.wait()
            sent = time.perf_counter()
            if raw:
                status, content = await self._raw(i, raw[i])
            else:
                response = await self.clients[i].request(method, path, json=body)
                status, content = response.status_code, response.content
            elapsed = (time.perf_counter() - sent) * 1000
            if status not in (200, 202):
                raise RuntimeError(f"{method} {path}: {status} {content[:300]!r}")
            return elapsed, dict(json.loads(content))

        tasks = [asyncio.create_task(one(i)) for i in range(len(requests))]
        await asyncio.sleep(0)  # every sender waits at the gate
        cpu_before = server_cpu_s(self.servers)
        first_sent = time.time()
        start.set()
        done = await asyncio.gather(*tasks)
        cpu = server_cpu_s(self.servers) - cpu_before
        return [d[0] for d in done], [d[1] for d in done], first_sent, cpu


def _journal(client: httpx.Client, room: str, after: int = 0) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        page = client.get(f"conversations/{room}/journal",
                          params={"after": after, "limit": 1000})
        page.raise_for_status()
        batch = page.json()["events"]
        if not batch:
            return events
        events.extend(batch)
        after = page.json()["next"]


def _settled(client: httpx.Client, rooms: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    """Each room's journal once its runs (``rooms[room]`` of them) have all settled. Read on
    from where the last look ended, so the polling costs the servers little while the turns
    run."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    for room, expected in rooms.items():
        events: list[dict[str, Any]] = []
        while True:
            events += _journal(client, room, events[-1]["seq"] if events else 0)
            if sum(e["type"] == "run.terminal" for e in events) >= expected:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"room {room}: runs did not settle")
            time.sleep(0.1)
    time.sleep(0.3)  # anything extra (a second run of an input) would show up now
    return {room: _journal(client, room) for room in rooms}


def _violations(accepted: list[dict[str, Any]],
                journals: dict[str, list[dict[str, Any]]]) -> int:
    """How many of the burst's guarantees a room broke (0 when all held)."""
    broken = 0
    for room, events in journals.items():
        mine = [a for a in accepted if a["conversation_id"] == room]
        position_of = {a["run_id"]: a["position"] for a in mine}
        admitted = [e["run_id"] for e in events if e["type"] == "run.admitted"]
        terminals = [e for e in events if e["type"] == "run.terminal"]
        lifecycle = [(e["type"], e["run_id"]) for e in events
                     if e["type"] in ("run.admitted", "run.terminal")]
        seqs = [e["seq"] for e in events]
        checks = [
            len(position_of) == len(mine),  # one run per input
            sorted(position_of.values()) == list(range(1, len(mine) + 1)),  # gap-free
            sorted(admitted) == sorted(position_of),  # each admitted once
            [position_of[r] for r in admitted] == sorted(position_of.values()),  # FIFO
            sorted(e["run_id"] for e in terminals) == sorted(position_of),  # one terminal
            all(e["data"]["status"] == "completed" for e in terminals),
            lifecycle == [(k, r) for r in admitted for k in ("run.admitted", "run.terminal")],
            seqs == list(range(1, len(seqs) + 1)),  # the journal gap-free
        ]
        broken += checks.count(False)
    return broken


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["at"]).timestamp()


@dataclass
class Bursts:
    """One trial: the baseline burst's latencies and CPU, then the posts'."""

    bare: list[float]
    bare_cpu_s: float
    took: list[float]
    accepted: list[dict[str, Any]]
    first_sent: float
    cpu_s: float


class LoopProfile:
    """``--cprofile PATH``: the first server's cProfile of its event loop thread
    (kaizen_server_extension/profiling.py, started and written by signals) over the baseline
    burst and, separately, over the posts' burst: ``PATH.<db>.get.prof`` and
    ``PATH.<db>.post.prof``, summaries on stderr. Its timer is the thread's CPU time, so the
    two compare on a busy machine."""

    def __init__(self, server: ServerProcess, path: str, db: str) -> None:
        self.server, self.path, self.db = server, path, db

    @contextlib.asynccontextmanager
    async def over(self, burst: str) -> AsyncIterator[None]:
        self._start()
        await asyncio.sleep(0.2)
        try:
            yield
        finally:
            await asyncio.to_thread(self._write, burst)

    @property
    def _written(self) -> Path:
        return Path(self.server.env["KAIZEN_PROFILE"])

    def _start(self) -> None:
        self._written.unlink(missing_ok=True)
        self.server.process.send_signal(signal.SIGUSR1)

    def _write(self, burst: str) -> None:
        self.server.process.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not self._written.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the file appears before it is complete
        out = Path(f"{self.path}.{self.db}.{burst}.prof")
        shutil.copyfile(self._written, out)
        text = io.StringIO()
        stats = pstats.Stats(str(out), stream=text)
        total_ms = 1000 * stats.total_tt  # type: ignore[attr-defined]
        print(f"== {burst} burst: {total_ms:.1f} ms of loop CPU", file=text)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats("kaizen_server_extension", 30)
        print(text.getvalue(), file=sys.stderr)


async def _bursts(servers: list[ServerProcess], client: str, posts: list[Request],
                  profile: LoopProfile | None = None) -> Bursts:
    """On fresh connections: a burst of ``GET members/me`` that opens them, the baseline
    burst, then the posts."""
    senders = Senders(servers, len(posts), client)

    def over(burst: str) -> contextlib.AbstractAsyncContextManager[None]:
        return profile.over(burst) if profile else contextlib.nullcontext()

    try:
        await senders.open()
        me: list[Request] = [("GET", "members/me", None)] * len(posts)
        await senders.burst(me)
        async with over("get"):
            bare, _, _, bare_cpu = await senders.burst(me)
        async with over("post"):
            took, accepted, first_sent, cpu = await senders.burst(posts)
        return Bursts(bare, bare_cpu, took, accepted, first_sent, cpu)
    finally:
        await senders.close()


def figure(db: str, servers: list[ServerProcess], name: str, messages: int, rooms: int,
           trials: int, client: str, profile: str | None = None,
           cprofile: str | None = None) -> None:
    latencies: list[float] = []
    baseline: list[float] = []
    rates: list[float] = []
    trial_p95: list[float] = []
    cpu_s = bare_cpu_s = 0.0
    violations = 0
    with servers[0].client(MEMBER) as sync:
        for trial_no in range(trials):
            room_ids = []
            for _ in range(rooms):
                created = sync.post("conversations", json={"agent_id": "general"})
                created.raise_for_status()
                room_ids.append(str(created.json()["id"]))

            posts: list[Request] = [
                ("POST", f"conversations/{room_ids[i % rooms]}/messages",
                 {"text": f"{TEXT} {i}"}) for i in range(messages)]
            # py-spy (``--profile``) sees the first trial's bursts, not the settling after.
            with profiled(servers[0].process.pid, profile if trial_no == 0 else None,
                          f"{db}.{name}"):
                loop_profile = LoopProfile(servers[0], cprofile, f"{db}.{name}") \
                    if cprofile and trial_no == 0 else None
                trial = asyncio.run(_bursts(servers, client, posts, loop_profile))
            took, accepted = trial.took, trial.accepted
            cpu_s += trial.cpu_s
            bare_cpu_s += trial.bare_cpu_s
            for i, answer in enumerate(accepted):
                answer["conversation_id"] = room_ids[i % rooms]
            expected = {r: sum(1 for i in range(messages) if i % rooms == k)
                        for k, r in enumerate(room_ids)}
            journals = _settled(sync, expected)
            last = max(_at(e) for events in journals.values() for e in events
                       if e["type"] == "run.terminal")
            rates.append(messages / (last - trial.first_sent))
            violations += _violations(accepted, journals)
            latencies.extend(took)
            trial_p95.append(round(quantile(took, 95), 1))
            baseline.extend(trial.bare)
    p95, bare_p95 = quantile(latencies, 95), quantile(baseline, 95)
    emit({
        "bench": BENCH, "figure": name, "db": db, "replicas": len(servers), "client": client,
        "messages": messages, "rooms": rooms, "trials": trials, "n": len(latencies),
        "p50_ms": round(statistics.median(latencies), 2), "p95_ms": round(p95, 2),
        "max_ms": round(max(latencies), 2), "trial_p95_ms": trial_p95,
        "target_p95_ms": TARGET_P95_MS,
        "meets_target": p95 <= TARGET_P95_MS,
        "turns_per_s": round(statistics.median(rates), 2),
        "baseline_p50_ms": round(statistics.median(baseline), 2),
        "baseline_p95_ms": round(bare_p95, 2),
        "ratio": round(p95 / bare_p95, 2) if bare_p95 > 0 else None,
        "server_cpu_ms_per_post": round(1000 * cpu_s / len(latencies), 2),
        "baseline_cpu_ms_per_get": round(1000 * bare_cpu_s / len(baseline), 2),
        "cpu_ratio": round(cpu_s / bare_cpu_s, 2) if bare_cpu_s > 0 else None,
        "violations": violations,
    })


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spread-n", type=int, default=50,
                        help="messages of the spread burst (default 50)")
    parser.add_argument("--rooms", type=int, default=10,
                        help="rooms the spread burst goes to (default 10)")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="how the senders send (default raw; see Senders)")
    parser.add_argument("--trials", type=int, default=3,
                        help="bursts per figure, each into fresh rooms (default 3)")
    parser.add_argument("--profile", metavar="PATH",
                        help="py-spy the first server during the first one_room trial's bursts "
                             "(baseline and posts): PATH.<db>.one_room.txt, summary on "
                             "stderr (bench/pyspy_summary.py)")
    parser.add_argument("--cprofile", metavar="PATH",
                        help="the first server's cProfile of its loop thread (CPU time) over "
                             "the first one_room trial's baseline and posts bursts: "
                             "PATH.<db>.one_room.get.prof and .post.prof, summaries on stderr")


def main() -> None:
    args = parse_args(__doc__ or BENCH, default_n=100, extra=_extra)
    for db in asyncio.run(reachable_databases(BENCH, args)):
        with FakeOpenAI(SCRIPTS) as fake, \
                replicas(db, args.pg_url, fake, args.cprofile) as servers:
            figure(db, servers, "one_room", args.n, 1, args.trials, args.client, args.profile,
                   args.cprofile)
            figure(db, servers, "rooms", args.spread_n, args.rooms, args.trials, args.client)


if __name__ == "__main__":
    main()
