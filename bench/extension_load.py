"""Start-up: time to a ready server with the Kaizen extension against a bare ``jupyter server``
(issue 16, item 3), in the same run.

Each trial starts two processes one after the other, in alternating order, with the same
Python, environment and installed extensions:

* **bare**: ``python -m jupyter_server`` with Kaizen disabled
  (``--ServerApp.jpserver_extensions={'kaizen_server_extension': False}``), ready when
  ``GET /api/status`` answers 200;
* **kaizen**: the same command with Kaizen enabled on an embedded SQLite store that already
  exists (a warm-up start, not counted, migrates it), ready when ``GET kaizen/api/agents``
  answers 200 for a member.

Both start with their bytecode cached, as an installed Kaizen does (pip compiles a wheel's
modules; an editable install writes ``__pycache__`` on its first import): a warm-up start of
each, not counted, writes it under one cache prefix in the bench's temporary directory, even
where the environment says ``PYTHONDONTWRITEBYTECODE``. Without it every start would compile
Kaizen's sources again while the bare server's come compiled from site-packages.

``extra_s`` = kaizen p50 - bare p50 (target 1.0 s); ``ratio`` = kaizen p50 / bare p50; the
same as CPU seconds of the server process by readiness (``extra_cpu_s``).

A second figure, ``initialize_cpu``, takes what machine load moves least: each trial also runs
a process of each kind that only initializes the server (``ServerApp.initialize``: everything
before it listens, Kaizen's settings, store bootstrap, plugins, registry and routes included)
and prints its CPU seconds. With no event loop running, no background thread or timer does
more work the slower the machine is.

    .venv/bin/python bench/extension_load.py [--n 3]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH_DIR))

from benchkit import emit, parse_args, process_cpu_s  # noqa: E402

from kaizen_server_extension.store.engine import sqlite_url_for  # noqa: E402
from tests.support.server import (  # noqa: E402
    SERVER_TOKEN,
    free_port,
    member_token,
    server_env,
)

BENCH = "extension_load"
TARGET_EXTRA_S = 1.0
TIMEOUT_S = 180.0




@dataclass(frozen=True)
class _Server:
    """The command-line arguments, environment and readiness request of one kind of server."""

    args: list[str]
    env: dict[str, str]
    url: str
    headers: dict[str, str]


def _server(root: Path, port: int, *, kaizen: bool) -> _Server:
    env = server_env(root, sqlite_url_for(root / "kaizen.db"), None,
                     {"KAIZEN_LOG_LEVEL": "WARNING",
                      # The code of this work tree, whatever the environment installed.
                      "PYTHONPATH": f"{ROOT}:{ROOT / 'plugins'}",
                      "PYTHONPYCACHEPREFIX": str(root / "pycache")})
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    args = ["--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
            f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={SERVER_TOKEN}"]
    if kaizen:
        return _Server([*args, "--ServerApp.identity_provider_class="
                        "kaizen_server_extension.identity.KaizenTokenIdentityProvider",
                        "--ServerApp.jpserver_extensions={'kaizen_server_extension': True}"],
                       env, f"http://127.0.0.1:{port}/kaizen/api/agents",
                       {"Authorization": f"token {member_token('alice')}"})
    return _Server([*args, "--ServerApp.jpserver_extensions={'kaizen_server_extension': False}"],
                   env, f"http://127.0.0.1:{port}/api/status",
                   {"Authorization": f"token {SERVER_TOKEN}"})


def _start(root: Path, *, kaizen: bool) -> tuple[float, float]:
    """(seconds from spawning the server to its readiness answer, the server's CPU seconds
    by then); the server is stopped."""
    port = free_port()
    server = _server(root, port, kaizen=kaizen)
    log = (root / f"server-{'kaizen' if kaizen else 'bare'}-{port}.log").open("wb")
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "jupyter_server", *server.args],
                               env=server.env, cwd=root, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = started + TIMEOUT_S
        while time.perf_counter() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"server exited early; see {log.name}")
            try:
                response = httpx.get(server.url, headers=server.headers, timeout=2)
                if response.status_code == 200:
                    return time.perf_counter() - started, process_cpu_s(process.pid)
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"server not ready within {TIMEOUT_S} s; see {log.name}")
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()


#: Everything the server does before it listens (its own set-up, loading the extensions:
#: Kaizen's settings, store bootstrap, plugins, tool registry, routes), then the process's
#: CPU seconds so far.
_INITIALIZE = """
import sys, time
from jupyter_server.serverapp import ServerApp
ServerApp.instance().initialize(argv=sys.argv[1:], new_httpserver=False)
print(time.process_time())
"""


def _initialize_cpu(root: Path, *, kaizen: bool) -> float:
    """CPU seconds of a process that initializes the server and exits: no event loop, so no
    background thread or timer adds more the slower the machine is."""
    server = _server(root, free_port(), kaizen=kaizen)
    done = subprocess.run([sys.executable, "-c", _INITIALIZE, *server.args], env=server.env,
                          cwd=root, capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=True)
    return float(done.stdout.split()[-1])


def main() -> None:
    args = parse_args(__doc__ or BENCH, default_n=3)
    with tempfile.TemporaryDirectory(prefix="kaizen-load-bench-") as tmp:
        root = Path(tmp)
        # Not counted: the first migrates the store; both write their bytecode.
        _start(root, kaizen=True)
        _start(root, kaizen=False)
        bare: list[tuple[float, float]] = []
        kaizen: list[tuple[float, float]] = []
        initialized: dict[bool, list[float]] = {False: [], True: []}
        for trial in range(args.n):
            order = (False, True) if trial % 2 == 0 else (True, False)
            for with_kaizen in order:
                (kaizen if with_kaizen else bare).append(_start(root, kaizen=with_kaizen))
            for with_kaizen in order:
                initialized[with_kaizen].append(_initialize_cpu(root, kaizen=with_kaizen))
    bare_s, kaizen_s = (statistics.median(t for t, _ in runs) for runs in (bare, kaizen))
    bare_cpu, kaizen_cpu = (statistics.median(c for _, c in runs) for runs in (bare, kaizen))
    extra = kaizen_s - bare_s
    emit({"bench": BENCH, "db": "sqlite", "figure": "time_to_ready", "n": args.n,
          "kaizen_p50_s": round(kaizen_s, 3), "baseline_bare_p50_s": round(bare_s, 3),
          "extra_s": round(extra, 3), "ratio": round(kaizen_s / bare_s, 3),
          # CPU seconds of the server process by readiness.
          "kaizen_cpu_p50_s": round(kaizen_cpu, 3), "baseline_bare_cpu_p50_s": round(bare_cpu, 3),
          "extra_cpu_s": round(kaizen_cpu - bare_cpu, 3),
          "target_extra_s": TARGET_EXTRA_S, "meets_target": extra <= TARGET_EXTRA_S})
    init_bare, init_kaizen = (statistics.median(initialized[k]) for k in (False, True))
    emit({"bench": BENCH, "db": "sqlite", "figure": "initialize_cpu", "n": args.n,
          "kaizen_cpu_p50_s": round(init_kaizen, 3), "baseline_bare_cpu_p50_s": round(init_bare, 3),
          "extra_cpu_s": round(init_kaizen - init_bare, 3),
          "ratio": round(init_kaizen / init_bare, 3), "target_extra_s": TARGET_EXTRA_S,
          "meets_target": init_kaizen - init_bare <= TARGET_EXTRA_S})


if __name__ == "__main__":
    main()
