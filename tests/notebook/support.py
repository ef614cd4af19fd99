"""Helpers for the notebook tests: notebooks on disk, a notebook session's kernel, turns."""

from __future__ import annotations

import base64
import json
import struct
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from jupyter_client.blocking.client import BlockingKernelClient

from tests.support.server import ServerProcess, member_token


def png(width: int, height: int) -> str:
    """A real (tiny-bodied) PNG of that size, base64 as nbformat stores it."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    raw = b"".join(b"\x00" + b"\x00" * width * 3 for _ in range(height))
    body = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8,
                                                              2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return base64.b64encode(body).decode()


def code(cell_id: str, source: str, outputs: Sequence[dict[str, Any]] = (),
         count: int | None = None) -> dict[str, Any]:
    return {"cell_type": "code", "id": cell_id, "metadata": {}, "source": source,
            "execution_count": count, "outputs": list(outputs)}


def markdown(cell_id: str, source: str) -> dict[str, Any]:
    return {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": source}


def notebook(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"nbformat": 4, "nbformat_minor": 5, "cells": list(cells),
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                        "language": "python"},
                         "language_info": {"name": "python"}}}


def write_notebook(root: Path, name: str, cells: Sequence[dict[str, Any]]) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(notebook(cells), indent=1))
    return path


def jupyter(server: ServerProcess, member: str = "alice") -> httpx.Client:
    """The Jupyter server's own REST API (sessions, kernels, contents) as ``member``."""
    return httpx.Client(base_url=server.base_url + "api/", timeout=60,
                        headers={"Authorization": f"token {member_token(member)}"})


@contextmanager
def notebook_kernel(server: ServerProcess, root: Path, path: str) -> Iterator[
        tuple[str, BlockingKernelClient]]:
    """A notebook session for ``path`` (as JupyterLab opens one) and a client of its kernel,
    from the connection file the server wrote; the session is deleted afterwards."""
    with jupyter(server) as api:
        created = api.post("sessions", json={"path": path, "type": "notebook", "name": path,
                                             "kernel": {"name": "python3"}})
        assert created.status_code == 201, created.text
        session = created.json()
        kernel_id = session["kernel"]["id"]
        client = BlockingKernelClient(
            connection_file=str(root / "runtime" / f"kernel-{kernel_id}.json"))
        client.load_connection_file()
        # A loaded machine answers a heartbeat late, not never: the default 1 s would call a
        # busy kernel dead ("Kernel died before replying to kernel_info").
        client.hb_channel.time_to_dead = 10.0
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            # The server learns "idle" from a status it sees on iopub; a kernel_info reply
            # can come before its subscription is live (ZMQ's slow joiner), so run a cell.
            deadline = time.monotonic() + 60
            while api.get(f"kernels/{kernel_id}").json().get("execution_state") != "idle":
                assert time.monotonic() < deadline, "the server never saw the kernel idle"
                client.execute("pass", store_history=False, reply=True, timeout=30)
                time.sleep(0.1)
            yield kernel_id, client
        finally:
            client.stop_channels()
            api.delete(f"sessions/{session['id']}")


def execute(client: BlockingKernelClient, source: str, timeout: float = 60) -> dict[str, Any]:
    reply: dict[str, Any] = client.execute_interactive(source, timeout=timeout,
                                                        output_hook=lambda _msg: None)
    assert reply["content"]["status"] == "ok", reply["content"]
    return reply


def user_names(client: BlockingKernelClient) -> list[str]:
    """The kernel's global names and execution count, read without adding any."""
    reply = client.execute("", silent=True, store_history=False,
                           user_expressions={"k": "sorted(globals())"}, reply=True, timeout=30)
    return [reply["content"]["user_expressions"]["k"]["data"]["text/plain"]]


def wait_state(server: ServerProcess, kernel_id: str, state: str = "idle",
               timeout: float = 30) -> None:
    """Until the Jupyter server reports the kernel in ``state``."""
    with jupyter(server) as api:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if api.get(f"kernels/{kernel_id}").json().get("execution_state") == state:
                return
            time.sleep(0.05)
    raise AssertionError(f"the kernel did not become {state}")


def wait_idle(server: ServerProcess, kernel_id: str, timeout: float = 30) -> None:
    wait_state(server, kernel_id, "idle", timeout)


def settled_call(events: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(e["data"] for e in events if e["type"] == "tool.settled"
                and e["data"]["name"] == name)
