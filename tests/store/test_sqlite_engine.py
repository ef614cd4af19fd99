"""The embedded SQLite engine: every transaction takes the write lock up front, a lock it cannot
get is a clear database error, and a transaction that failed half-way leaves nothing open."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from kaizen_server_extension.store import Store, create_engine, upgrade
from kaizen_server_extension.store import engine as engine_module
from kaizen_server_extension.store.engine import sqlite_url_for


async def _store(path: Path) -> Store:
    engine = create_engine(sqlite_url_for(path))
    await upgrade(engine)
    return Store(engine)


async def test_a_transaction_holds_the_write_lock_from_its_first_statement(
    tmp_path: Path,
) -> None:
    store = await _store(tmp_path / "kaizen.db")
    other = sqlite3.connect(tmp_path / "kaizen.db", timeout=0.05, isolation_level=None)
    try:
        async with store.transaction() as tx:
            # Only a read so far; a deferred transaction would not hold the lock yet.
            await tx.session.execute(text("SELECT 1"))
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
    finally:
        other.close()
        await store.dispose()


async def test_a_lock_that_never_comes_is_a_database_error_and_nothing_is_left_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 50)
    store = await _store(tmp_path / "kaizen.db")
    holder = sqlite3.connect(tmp_path / "kaizen.db", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(OperationalError, match="locked"):
            async with store.transaction() as tx:
                await tx.session.execute(text("SELECT 1"))
        holder.execute("ROLLBACK")
        await store.members.ensure("alice")
        assert (await store.members.get("alice")) is not None
    finally:
        holder.close()
        await store.dispose()


async def test_a_failed_transaction_is_rolled_back_before_the_next_one(tmp_path: Path) -> None:
    store = await _store(tmp_path / "kaizen.db")
    try:
        with pytest.raises(RuntimeError):
            async with store.transaction() as tx:
                await store.members.ensure("alice", tx=tx)
                raise RuntimeError("boom")
        assert await store.members.get("alice") is None
        await store.members.ensure("bob")
        assert await store.members.get("bob") is not None
    finally:
        await store.dispose()
