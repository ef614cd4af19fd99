"""One MCP tool call as Kaizen makes it, against the same call on a bare SDK session.

Within a run, Kaizen keeps one session per server (``tools/mcp_sources.py: RunSessions``):
the first call connects (for stdio, starts the server), the next ones reuse it. A call
without a run's sessions opens one of its own (``McpSources.call``). Figures, over
streamable HTTP to the SDK's own server on loopback (``tests/support/mcp_server.py``) and
over stdio, each against ``call_tool`` on one bare ``Client`` kept open (``baseline``):

* ``mode: "run_session"``: ``RunSessions.call`` after the first call (the bounded body and
  the session's task hop included);
* ``mode: "one_shot"``: ``McpSources.call`` (connect, handshake, call, close).

No store is involved (``--db`` is ignored): the pipeline's own cost is pipeline_overhead.py's.

    .venv/bin/python bench/mcp_call.py [--n N]
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from benchkit import emit, parse_args, ratio, run_main, summary, time_calls

from kaizen_server_extension.tools.mcp_sources import McpServer, McpSources, RunSessions

BENCH = "mcp_call"
SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "support" / "mcp_server.py"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _http_server(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _port()
    process = subprocess.Popen([sys.executable, str(SCRIPT), "http", "--port", str(port),
                                "--log", str(log)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the MCP server did not start")


async def _figures(transport: str, server: McpServer, n: int, one_shot_n: int) -> None:
    from mcp import Client

    sources = McpSources([server], stdio_commands=[sys.executable])
    target = sources._target(server)
    async with Client(target, cache=None) as client:
        async def kept(i: int) -> object:
            return await client.call_tool("lookup", {"q": f"w{i}"})

        base = await time_calls(kept, n, warmup=3)

    base_p50 = summary(base)["p50_us"]
    sessions = RunSessions(sources)

    async def in_run(i: int) -> object:
        return await sessions.call(server, "lookup", {"q": f"w{i}"})

    async def one_shot(i: int) -> object:
        return await sources.call(server, "lookup", {"q": f"w{i}"})

    try:
        for mode, call, count in (("run_session", in_run, n),
                                  ("one_shot", one_shot, one_shot_n)):
            samples = await time_calls(call, count, warmup=2)
            p50 = summary(samples)["p50_us"]
            emit({"bench": BENCH, "transport": transport, "mode": mode, **summary(samples),
                  "baseline_p50_us": base_p50, "ratio": ratio(p50, base_p50), "n": count})
    finally:
        sessions.close()


def main() -> None:
    args = parse_args(__doc__ or BENCH, default_n=30)

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "calls.jsonl"
            process, url = _http_server(log)
            try:
                await _figures("http", McpServer(id="bench", transport="http", url=url),
                               args.n, args.n)
            finally:
                process.terminate()
                process.wait(10)
            stdio = McpServer(id="bench", transport="stdio", command=sys.executable,
                              args=(str(SCRIPT), "stdio", "--log", str(log)), timeout_s=120)
            await _figures("stdio", stdio, args.n, max(3, args.n // 10))

    run_main(run)


if __name__ == "__main__":
    main()
