"""Shared fixtures: every database test runs on SQLite and, when configured, PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import select

from kaizen_server_extension.store import Store, create_engine, upgrade
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.engine import is_sqlite, sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.support.server import ServerProcess, start_server

T = TypeVar("T")
POSTGRES_URL = os.environ.get("KAIZEN_TEST_DATABASE_URL", "")
BACKENDS = ["sqlite", "postgresql"] if POSTGRES_URL else ["sqlite"]
RULES_FILE = Path(__file__).resolve().parents[2] / "shared" / "spec" / "RULES.md"


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("CI") == "true" and not POSTGRES_URL:
        raise pytest.UsageError("CI must set KAIZEN_TEST_DATABASE_URL: PostgreSQL tests "
                                "may not be skipped")


def new_schema() -> str:
    return "kz_" + uuid.uuid4().hex[:12]


async def drop_schema(schema: str) -> None:
    engine = create_engine(POSTGRES_URL)
    try:
        async with engine.begin() as conn:
            await conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await engine.dispose()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def store(backend: str, tmp_path: Path) -> AsyncIterator[Store]:
    """A freshly migrated store on each backend."""
    schema = None
    if backend == "sqlite":
        url = sqlite_url_for(tmp_path / "kaizen.db")
    else:
        url, schema = POSTGRES_URL, new_schema()
    engine = create_engine(url, schema=schema)
    await upgrade(engine, schema)
    store = Store(engine)
    try:
        yield store
    finally:
        await store.dispose()
        if schema:
            await drop_schema(schema)


def _database_for(backend: str, root: Path) -> tuple[str, str | None]:
    if backend == "sqlite":
        return sqlite_url_for(root / "kaizen.db"), None
    return POSTGRES_URL, new_schema()


@contextlib.contextmanager
def served_by(backend: str, root: Path, fake_model: FakeOpenAI,
              extra_env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    """A real server on ``backend`` answered by ``fake_model``; its PostgreSQL schema is
    dropped afterwards."""
    url, schema = _database_for(backend, root)
    proc = start_server(root, url, schema, extra_env={
        "KAIZEN_MODEL_BASE_URL": fake_model.base_url, "KAIZEN_MODEL": "fake-model",
        **(extra_env or {})})
    try:
        yield proc
    finally:
        proc.stop()
        if schema:
            asyncio.run(drop_schema(schema))


@contextlib.contextmanager
def scripted_server(backend: str, root: Path, scripts: list[dict[str, Any]],
                    extra_env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    """:func:`served_by` a fake model replaying ``scripts``."""
    with FakeOpenAI(scripts) as fake_model, \
            served_by(backend, root, fake_model, extra_env) as proc:
        yield proc


def with_server_store(server: ServerProcess, work: Callable[[Store], Awaitable[T]]) -> T:
    """Run ``work`` against the database a test server uses, from the test process."""
    async def main() -> T:
        engine = create_engine(server.env["KAIZEN_DATABASE_URL"],
                               schema=server.env.get("KAIZEN_DATABASE_SCHEMA"))
        try:
            return await work(Store(engine))
        finally:
            await engine.dispose()
    return asyncio.run(main())


async def all_rows(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, by table name, each table's rows in a stable order."""
    rows: dict[str, list[tuple[Any, ...]]] = {}
    async with store.transaction() as tx:
        for table in m.Base.metadata.sorted_tables:
            result = await tx.session.execute(select(table))
            rows[table.name] = sorted((tuple(r) for r in result.all()), key=repr)
    return rows


def tool_call_audit(server: ServerProcess, run_id: str) -> list[dict[str, Any]]:
    """The ``tool.call`` audit rows of ``run_id`` in a test server's database."""
    async def read(store: Store) -> list[dict[str, Any]]:
        async with store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.AuditEvent.data).where(m.AuditEvent.run_id == run_id,
                                                m.AuditEvent.action == "tool.call"))
            ).scalars().all()
            return [dict(r) for r in rows]
    return with_server_store(server, read)


@pytest.fixture(scope="session", params=BACKENDS)
def server(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real Jupyter server per backend for the whole session."""
    root = tmp_path_factory.mktemp(f"server-{request.param}")
    url, schema = _database_for(str(request.param), root)
    proc = start_server(root, url, schema)
    try:
        yield proc
    finally:
        proc.stop()
        if schema:
            import asyncio

            asyncio.run(drop_schema(schema))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Iterator[Any]:
    """A failed test that used the session's server gets that server's log tail in its
    report: a server-side cause (a lock, a stall, a traceback) is otherwise lost with the
    process, and CI keeps only the report."""
    report = yield
    if report.failed and call.when == "call":
        proc = getattr(item, "funcargs", {}).get("server")
        if isinstance(proc, ServerProcess) and proc.log_path.exists():
            tail = "\n".join(proc.log().splitlines()[-60:])
            report.sections.append(("server log (last 60 lines)", tail))
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every rule a test cites must exist in RULES.md."""
    if not RULES_FILE.exists():
        return
    known = set(re.findall(r"^(R-\d{3})\b", RULES_FILE.read_text(), flags=re.M))
    for item in items:
        for marker in item.iter_markers("rule"):
            unknown = [r for r in marker.args if r not in known]
            if unknown:
                raise pytest.UsageError(f"{item.nodeid} cites unknown rules {unknown}")


__all__ = ["is_sqlite"]
