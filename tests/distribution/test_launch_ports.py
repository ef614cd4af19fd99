"""The test launchers survive a port taken between choosing it and binding it.

``free_port()`` only finds a port free at that moment; under ``-n auto`` another test process
may bind it first. Jupyter would then move to the next port silently while the launcher
polled the first. The launchers start servers with ``port_retries=0`` and try another port;
here the first port is held open on purpose."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kaizen_server_extension.store.engine import sqlite_url_for
from tests.distribution import support as distribution_support
from tests.support import server as server_support
from tests.support.server import free_port


@pytest.fixture()
def held_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _held_first(held: int) -> object:
    ports = iter([held])
    return lambda: next(ports, None) or free_port()


def test_start_server_moves_on_from_a_taken_port(tmp_path: Path, held_port: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_support, "free_port", _held_first(held_port))
    server = server_support.start_server(tmp_path, sqlite_url_for(tmp_path / "kaizen.db"))
    try:
        assert f":{held_port}/" not in server.base_url
        with server.client("alice") as client:
            assert client.get("members/me").json()["member"] == "alice"
    finally:
        server.stop()


def test_start_plain_moves_on_from_a_taken_port(tmp_path: Path, held_port: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distribution_support, "free_port", _held_first(held_port))
    server = distribution_support.start_plain(
        [sys.executable, "-m", "jupyter_server"], tmp_path,
        env=distribution_support.user_env(tmp_path))
    try:
        assert f":{held_port}/" not in server.base_url
    finally:
        server.stop()


def test_a_given_port_that_is_taken_fails_plainly(tmp_path: Path, held_port: int) -> None:
    with pytest.raises(RuntimeError, match="exited early"):
        distribution_support.start_plain(
            [sys.executable, "-m", "jupyter_server"], tmp_path,
            env=distribution_support.user_env(tmp_path), port=held_port)
