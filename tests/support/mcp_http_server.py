"""Start the test MCP server (``tests/support/mcp_server.py``) over streamable HTTP as a real
process on loopback: plain http, or https with a certificate from a throwaway ``trustme`` CA,
optionally refusing every request without a given bearer token."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trustme

from tests.support.processes import stop_process
from tests.support.server import free_port

MCP_SCRIPT = Path(__file__).resolve().parent / "mcp_server.py"


@dataclass
class HttpMcp:
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    tls: bool

    @property
    def origin(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.origin}/mcp"

    def lines(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def ran(self) -> list[dict[str, Any]]:
        """The tool calls that reached a tool."""
        return [line for line in self.lines() if "tool" in line]

    def http(self, outcome: str) -> int:
        """How many HTTP requests the bearer check ``accepted`` or ``refused``."""
        return sum(1 for line in self.lines() if line.get("http") == outcome)

    def stop(self) -> None:
        stop_process(self.process)


def start_http_mcp(log: Path, *, ca: trustme.CA | None = None,
                   bearer: str = "") -> HttpMcp:
    """The server on a free port; with ``ca``, over https with a certificate for 127.0.0.1
    that ``ca`` issued."""
    port = free_port()
    command = [sys.executable, str(MCP_SCRIPT), "http", "--port", str(port), "--log", str(log)]
    verify: Any = True
    if ca is not None:
        cert = ca.issue_cert("127.0.0.1", "localhost")
        cert_file, key_file = log.with_suffix(".cert.pem"), log.with_suffix(".key.pem")
        cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
        cert.private_key_pem.write_to_path(str(key_file))
        command += ["--tls-cert", str(cert_file), "--tls-key", str(key_file)]
        ca_file = log.with_suffix(".ca.pem")
        ca.cert_pem.write_to_path(str(ca_file))
        verify = ssl.create_default_context(cafile=str(ca_file))
    if bearer:
        command += ["--require-bearer", bearer]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    running = HttpMcp(process, port, log, ca is not None)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the HTTP MCP server exited early")
        try:
            httpx.get(running.url, timeout=1, verify=verify)
            # The readiness probe is not a request any test counts.
            log.unlink(missing_ok=True)
            return running
        except httpx.HTTPError:
            time.sleep(0.1)
    stop_process(process)
    raise RuntimeError("the HTTP MCP server did not start")
