"""Fixtures for the events tests: a fresh PostgreSQL schema, a second server on one schema."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kaizen_server_extension.store import Store, create_engine, upgrade
from tests.conftest import POSTGRES_URL, drop_schema, new_schema
from tests.support.server import ServerProcess, start_server

needs_postgres = pytest.mark.skipif(not POSTGRES_URL, reason="KAIZEN_TEST_DATABASE_URL unset")


@pytest.fixture
async def pg_store() -> AsyncIterator[tuple[Store, str]]:
    """A migrated store on a fresh PostgreSQL schema, and the schema's name."""
    if not POSTGRES_URL:
        pytest.skip("KAIZEN_TEST_DATABASE_URL unset")
    schema = new_schema()
    engine = create_engine(POSTGRES_URL, schema=schema)
    await upgrade(engine, schema)
    store = Store(engine)
    try:
        yield store, schema
    finally:
        await store.dispose()
        await drop_schema(schema)


@pytest.fixture(scope="module")
def server_pair(server: ServerProcess,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess,
                                                                            ServerProcess]]:
    """Two server processes on ONE PostgreSQL schema: the session's server (its schema is
    fresh for this test session) and a second one started on the same schema."""
    schema = server.env.get("KAIZEN_DATABASE_SCHEMA")
    if not schema:
        pytest.skip("two processes share a database only on PostgreSQL")
    root: Path = tmp_path_factory.mktemp("server-b")
    second = start_server(root, server.env["KAIZEN_DATABASE_URL"], schema)
    try:
        yield server, second
    finally:
        second.stop()
