"""A task cancelled in the middle of a store transaction must not wedge SQLite.

Seen as "database is locked" on every later transaction of a server after a websocket
observer left while its pump was reading the journal: the cancelled statement's connection
was closed, but SQLite kept it (and its write lock) alive until the garbage collector freed
the cursor (store/engine.py, ``_on_invalidate``).
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path

from kaizen_server_extension.store import Store, create_engine, upgrade
from kaizen_server_extension.store.engine import sqlite_url_for


def _write_lock_free(path: Path) -> bool:
    db = sqlite3.connect(path, timeout=0)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        db.close()


async def test_cancelling_a_transaction_mid_statement_releases_the_write_lock(
        tmp_path: Path) -> None:
    path = tmp_path / "kaizen.db"
    engine = create_engine(sqlite_url_for(path))
    await upgrade(engine, None)
    store = Store(engine)
    await store.members.ensure("alice")
    rng = random.Random(7)
    try:
        for attempt in range(300):
            task = asyncio.create_task(store.members.get("alice"))
            # Somewhere between before the transaction and after it: many land mid-statement.
            await asyncio.sleep(rng.random() * 0.003)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            # Released within half a second (a stuck lock stayed for good).
            for _ in range(50):
                if _write_lock_free(path):
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError(f"the write lock stayed held after cancel {attempt}")
        # And the store itself still works.
        assert (await store.members.get("alice")) is not None
    finally:
        await store.dispose()
