"""Servers started the way a user starts them: a plain ``jupyter server`` / ``jupyter lab``
command, none of the test server's identity flags or member tokens."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.server import PORT_ATTEMPTS, free_port, port_was_taken

OWNER_TOKEN = "plain-server-token-0123456789"


@dataclass
class PlainServer:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    token: str = OWNER_TOKEN

    def api(self, *, token: str | None = OWNER_TOKEN) -> httpx.Client:
        headers = {"Authorization": f"token {token}"} if token else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def user_env(root: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a user's shell: no KAIZEN_* test settings, Jupyter's own dirs under
    ``root`` so nothing is shared with another test or the developer's own Jupyter."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KAIZEN_", "JUPYTER", "JPY_"))}
    env.update({
        "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_TOKEN": OWNER_TOKEN,
        "KAIZEN_KERNEL_POOL_SIZE": "0",
    })
    env.update(extra or {})
    return env


def start_plain(command: Sequence[str], root: Path, *, env: Mapping[str, str],
                port: int | None = None, base_path: str = "/",
                timeout: float = 90) -> PlainServer:
    """Start ``command`` (``jupyter server`` or ``jupyter lab`` and its plain flags) on a
    free loopback port and wait until Kaizen's liveness probe answers.

    Another test process may take the free port before the server binds it; Jupyter would
    then move to the next port silently and leave us polling the wrong one. So the server
    stops instead (``port_retries=0``), and a new port is tried, unless ``port`` was given."""
    root.mkdir(parents=True, exist_ok=True)
    attempts = 1 if port else PORT_ATTEMPTS
    for attempt in range(attempts):
        chosen = port or free_port()
        log_path = root / f"jupyter-{chosen}.log"
        args = [*command, "--no-browser", f"--port={chosen}", "--ip=127.0.0.1",
                "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root}"]
        if os.geteuid() == 0:
            args.append("--allow-root")
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(args, env=dict(env), stdout=log_file,
                                       stderr=subprocess.STDOUT, cwd=root)
        server = PlainServer(f"http://127.0.0.1:{chosen}{base_path}", process, log_path)
        try:
            wait_for(server, timeout)
        except RuntimeError:
            if attempt + 1 < attempts and port_was_taken(server.process, server.log()):
                continue
            raise
        return server
    raise AssertionError("unreachable")


def wait_for(server: PlainServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited early:\n{server.log()[-4000:]}")
        try:
            if httpx.get(server.base_url + "kaizen/api/health/live", timeout=2).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"server did not become live:\n{server.log()[-4000:]}")
