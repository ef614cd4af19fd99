"""Start-up: replicas starting together on one database take turns migrating and seeding."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kaizen_plugins.agents import GENERAL, SEARCH

from kaizen_server_extension.app import bootstrap
from kaizen_server_extension.store import Store, create_engine
from kaizen_server_extension.store.engine import sqlite_url_for
from tests.conftest import POSTGRES_URL, drop_schema, new_schema
from tests.support.server import start_server


@pytest.mark.postgres
async def test_replicas_bootstrapping_at_once_both_succeed() -> None:
    if not POSTGRES_URL:
        pytest.skip("KAIZEN_TEST_DATABASE_URL is not set")
    schema = new_schema()
    try:
        await asyncio.gather(*[bootstrap(POSTGRES_URL, schema, (GENERAL, SEARCH))
                               for _ in range(3)])
        engine = create_engine(POSTGRES_URL, schema=schema)
        try:
            agents = await Store(engine).agents.list_visible("anyone")
        finally:
            await engine.dispose()
        assert sorted(a.id for a in agents) == ["general", "search"]
        assert all(a.version == 1 for a in agents)
    finally:
        await drop_schema(schema)


def test_an_invalid_lease_setting_stops_start_up(tmp_path: Path) -> None:
    server = start_server(tmp_path, sqlite_url_for(tmp_path / "k.db"),
                          extra_env={"KAIZEN_RUN_LEASE_SECONDS": "0"}, wait=False)
    try:
        code = server.process.wait(60)
    finally:
        server.stop()
    assert code != 0 and "KAIZEN_RUN_LEASE_SECONDS" in server.log()
