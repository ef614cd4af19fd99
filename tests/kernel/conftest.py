"""Shared fixtures for the kernel tests: one RunCodeService (warm pool) and one loopback
bridge server for the whole session, so real ipykernel kernels are started only as often as
the behaviour under test needs."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import tornado.httpserver
import tornado.netutil
import tornado.web

from kaizen_kernel.bridge import bridge_handlers, bridge_url
from kaizen_kernel.leases import KernelLease
from kaizen_kernel.limits import ExecutionBudget, ProcessLimits
from kaizen_kernel.service import RunCodeConfig, RunCodeService

SECRET_ENV = {
    "KAIZEN_MODEL_API_KEY": "sekrit",
    "DATABASE_URL": "postgresql://kaizen:hunter2@db.internal/kaizen",
    "KAIZEN_DATABASE_URL": "postgresql+asyncpg://kaizen:hunter2@db.internal/kaizen",
    # Not secret-looking at all: proves the environment is allowlisted, not deny-listed.
    "KZ_TEST_PLAIN_SETTING": "should-not-pass",
}
TEST_LIMITS = ProcessLimits(max_open_files=300, max_file_bytes=8 * 1024 * 1024)
TEST_BUDGET = ExecutionBudget(wall_seconds=20.0, output_bytes=1024 * 1024)
MAX_FILE_BYTES = 1024 * 1024


@dataclass
class DispatchRecorder:
    calls: list[tuple[KernelLease, str, dict[str, Any]]] = field(default_factory=list)

    async def __call__(self, lease: KernelLease, name: str,
                       arguments: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((lease, name, arguments))
        return {"echo": arguments, "tool": name, "actor": lease.actor}


@dataclass
class Sandbox:
    service: RunCodeService
    dispatch: DispatchRecorder
    bridge: str
    root: Path


@pytest.fixture(scope="session")
def secret_environment() -> Iterator[None]:
    """Secrets in the *server's* environment, as a real deployment has them."""
    saved = {k: os.environ.get(k) for k in SECRET_ENV}
    os.environ.update(SECRET_ENV)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.asynccontextmanager
async def serving(root: Path, *, jail: str, pool: int,
                  kernel_names: dict[str, str] | None = None) -> AsyncIterator[Sandbox]:
    """A started RunCodeService under ``root`` with its own loopback bridge server."""
    dispatch = DispatchRecorder()
    service = RunCodeService(RunCodeConfig(
        state_root=root, budget=TEST_BUDGET, process_limits=TEST_LIMITS,
        jail=jail, pool_sizes={"python": pool}, max_file_bytes=MAX_FILE_BYTES,
        kernel_names=kernel_names))
    app = tornado.web.Application(bridge_handlers("/", service.leases, dispatch))
    sockets = tornado.netutil.bind_sockets(0, "127.0.0.1", family=socket.AF_INET)
    server = tornado.httpserver.HTTPServer(app)
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    service.bridge_url = bridge_url(f"http://127.0.0.1:{port}/")
    await service.start()
    try:
        yield Sandbox(service=service, dispatch=dispatch, bridge=service.bridge_url, root=root)
    finally:
        server.stop()
        await service.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def sandbox(secret_environment: None,
                  tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Sandbox]:
    async with serving(tmp_path_factory.mktemp("kaizen-kernel"), jail="off", pool=2) as box:
        yield box


def bwrap_or_skip() -> None:
    """Skip without bubblewrap, except in CI, which must test the jail (.ci/run installs it)."""
    if shutil.which("bwrap") is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI must install bubblewrap (bwrap) to test the kernel jail")
        pytest.skip("bubblewrap not installed")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def jailed_sandbox(secret_environment: None,
                         tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Sandbox]:
    """Like ``sandbox`` with every kernel in a bubblewrap jail (``jail="required"``)."""
    bwrap_or_skip()
    async with serving(tmp_path_factory.mktemp("kaizen-kernel-jail"), jail="required",
                       pool=0) as box:
        yield box


@pytest.fixture(params=["unjailed", "jailed"])
def either_sandbox(request: pytest.FixtureRequest) -> Sandbox:
    """The test runs twice: on unjailed kernels, then in the bubblewrap jail."""
    name = "sandbox" if request.param == "unjailed" else "jailed_sandbox"
    box: Sandbox = request.getfixturevalue(name)
    return box
