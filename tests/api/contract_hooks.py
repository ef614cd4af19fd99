"""schemathesis hooks of ``test_contract.py`` (loaded as ``SCHEMATHESIS_HOOKS``): the check that
an error answer wrote nothing.

Before every request the store is let settle (no queued or active run, every settled run's
notice in: a turn accepted by an earlier request runs detached and writes its own journal and
completion notice) and fingerprinted: a digest of every
table's rows, and the Jupyter contents tree's files. After any 4xx or 5xx answer the fingerprint
must be the same: a refused request leaves the database and the files as they were.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import schemathesis

ACTIVE = ("queued", "running", "awaiting_approval")
NOTIFIED = ("completed", "failed", "answer_unavailable")
#: Files of the server itself in its root, not the member's contents.
_SERVER_FILES = ("kaizen.db", "server-")
_SERVER_DIRS = {"data", "runtime", "config"}


class Fingerprint:
    """The store of the server under test, read from this process (read-only)."""

    def __init__(self, url: str, schema: str | None, root: Path) -> None:
        self.root = root
        self.lock = threading.Lock()
        self.sqlite: sqlite3.Connection | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pg: Any = None
        if url.startswith("sqlite"):
            path = url.split(":///", 1)[1]
            self.sqlite = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30,
                                          check_same_thread=False)
            names = [r[0] for r in self.sqlite.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        else:
            import asyncpg

            self.loop = asyncio.new_event_loop()
            dsn = "postgresql://" + url.split("://", 1)[1]
            self.pg = self.loop.run_until_complete(asyncpg.connect(
                dsn, server_settings={"search_path": schema or "public"}))
            names = [r[0] for r in self._pg(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1 "
                "AND table_type = 'BASE TABLE' ORDER BY table_name", schema or "public")]
        self.tables = [n for n in names if n != "alembic_version"]
        assert "journal" in self.tables and "runs" in self.tables, self.tables
        # One round trip on PostgreSQL, no row text: each table's row count and the newest
        # writing transaction of its rows (an insert or update makes a row version whose xmin
        # is a transaction id newer than every earlier one; a delete lowers the count).
        self.pg_digest = " UNION ALL ".join(
            f"SELECT '{t}', count(*)::text || ':' || coalesce(max(xmin::text::bigint), 0)::text "
            f"FROM \"{t}\"" for t in self.tables)

    def _pg(self, query: str, *args: Any) -> list[Any]:
        assert self.loop is not None
        rows: list[Any] = self.loop.run_until_complete(self.pg.fetch(query, *args))
        return rows

    def _active(self) -> int:
        """Runs still going, and settled runs whose completion notice (lanes/inbox.py: one per
        run that ended other than cancelled, written just after it settles) is not yet in."""
        query = (f"SELECT count(*) FROM runs r WHERE r.status IN {ACTIVE!r} OR (r.status IN "
                 f"{NOTIFIED!r} AND NOT EXISTS (SELECT 1 FROM notifications n "
                 f"WHERE n.dedupe_key = 'run:' || r.id))")
        if self.sqlite is not None:
            return int(self.sqlite.execute(query).fetchone()[0])
        return int(self._pg(query)[0][0])

    def settle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self._active():
            if time.monotonic() > deadline:
                raise AssertionError("a run never settled, so no fingerprint can be taken")
            time.sleep(0.02)

    def take(self) -> dict[str, str]:
        with self.lock:
            if self.sqlite is not None:
                digests = {}
                for table in self.tables:
                    rows = sorted(repr(r) for r in self.sqlite.execute(f'SELECT * FROM "{table}"'))
                    digests[table] = hashlib.sha256("\n".join(rows).encode()).hexdigest()
            else:
                digests = {r[0]: r[1] for r in self._pg(self.pg_digest)}
        digests["<jupyter contents>"] = self._files()
        return digests

    def _files(self) -> str:
        entries = []
        for folder, dirs, files in os.walk(self.root):
            if Path(folder) == self.root:
                dirs[:] = [d for d in dirs if d not in _SERVER_DIRS]
                files = [f for f in files if not f.startswith(_SERVER_FILES)]
            for name in files:
                path = Path(folder, name)
                stat = path.stat()
                entries.append(f"{path.relative_to(self.root)}:{stat.st_size}:{stat.st_mtime_ns}")
        return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()


_store: Fingerprint | None = None
_before: dict[str, dict[str, str]] = {}
#: What the check saw, written for the test to assert that it really ran.
_counts = {"requests": 0, "errors_checked": 0}


@atexit.register
def _report() -> None:
    path = os.environ.get("KAIZEN_CONTRACT_REPORT")
    if path:
        Path(path).write_text(json.dumps(_counts))


def _fingerprint() -> Fingerprint:
    global _store
    if _store is None:
        _store = Fingerprint(os.environ["KAIZEN_CONTRACT_DATABASE_URL"],
                             os.environ.get("KAIZEN_CONTRACT_DATABASE_SCHEMA") or None,
                             Path(os.environ["KAIZEN_CONTRACT_ROOT"]))
    return _store


@schemathesis.hook
def before_call(ctx: Any, case: Any, kwargs: dict[str, Any]) -> None:
    store = _fingerprint()
    store.settle()
    _before[case.id] = store.take()
    _counts["requests"] += 1


@schemathesis.check
def no_write_on_error(ctx: Any, response: Any, case: Any) -> bool | None:
    """A 4xx or 5xx answer changed no row of any table and no file of the contents tree."""
    before = _before.pop(case.id, None)
    if before is None or response.status_code < 400:
        return None
    after = _fingerprint().take()
    _counts["errors_checked"] += 1
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if changed:
        raise AssertionError(f"A {response.status_code} answer wrote to: {', '.join(changed)}")
    return None
