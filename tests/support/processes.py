"""Stopping the helper processes tests start (local model, MCP, API and gateway servers)."""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen[bytes], *, grace_s: float = 10) -> None:
    """Ask ``process`` to end, and kill it if it has not within ``grace_s``."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
