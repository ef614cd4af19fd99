"""Async engines for SQLite (embedded default) and PostgreSQL, and migrations at start-up."""

from __future__ import annotations

import ast
import asyncio
import gc
import re
import threading
from collections.abc import Awaitable, Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# ``revision = "0013"`` / ``down_revision: str | None = "0011"`` in a migration file.
_REVISION_LINE = re.compile(r"^(revision|down_revision)\s*(?::[^=]*)?=\s*(?P<value>[^#]+)")
SQLITE_BUSY_TIMEOUT_MS = 10_000
#: After a pooled SQLite connection is invalidated, collect garbage this soon (see below).
SQLITE_ZOMBIE_COLLECT_S = 0.05


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def sqlite_url_for(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def create_engine(url: str, *, schema: str | None = None, echo: bool = False) -> AsyncEngine:
    """One engine per process. ``schema`` selects a PostgreSQL schema via ``search_path``."""
    if is_sqlite(url):
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        # Every SQLite transaction takes the write lock (BEGIN IMMEDIATE below), so extra
        # connections would only wait in SQLite's sleeping busy handler; one connection makes
        # them queue fairly in the pool instead.
        # No rollback when a connection goes back to the pool: SQLAlchemy closes every
        # transaction it began (commit, rollback, or rollback on close) and store units close
        # theirs (store/units.py), so the pool's own ROLLBACK only repeated that, at the cost
        # of a hop to aiosqlite's thread on every transaction.
        engine = create_async_engine(url, echo=echo, connect_args={"timeout": 30},
                                     pool_size=1, max_overflow=0, pool_timeout=60,
                                     pool_reset_on_return=None)
        _configure_sqlite(engine)
        return engine
    connect_args: dict[str, Any] = {}
    if schema:
        connect_args["server_settings"] = {"search_path": schema}
    return create_async_engine(
        url, echo=echo, pool_size=10, max_overflow=10, pool_pre_ping=True,
        connect_args=connect_args,
    )


def _configure_sqlite(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take over transaction control from the driver so BEGIN IMMEDIATE below is honoured.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Write transactions must not start as readers: a deferred transaction that later
        # writes fails with SQLITE_BUSY_SNAPSHOT under WAL instead of waiting its turn.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    @event.listens_for(engine.sync_engine, "invalidate")
    def _on_invalidate(_dbapi_connection: Any, _record: Any, _exception: Any) -> None:
        # A task cancelled while one of its statements runs gets its connection invalidated
        # and closed, but the statement's cursor lives on in the cancellation's traceback (a
        # reference cycle). SQLite defers closing a connection with an unfinalized statement:
        # the "closed" connection keeps its transaction and so the write lock, and every
        # other transaction fails "database is locked" until the garbage collector happens
        # to free that cursor. Collecting once the cancellation has unwound frees it now.
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        loop.call_later(SQLITE_ZOMBIE_COLLECT_S, gc.collect)


@cache
def shipped_revisions() -> tuple[frozenset[str], frozenset[str]]:
    """(heads, every revision) of the migrations this code ships, read from the migration
    files' ``revision`` / ``down_revision`` lines without loading Alembic: a server whose
    database is already at the heads starts without importing it. The same answer as
    Alembic's own ScriptDirectory (tests/store/test_migration_heads.py)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in sorted((MIGRATIONS_DIR / "versions").glob("*.py")):
        found: dict[str, Any] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            match = _REVISION_LINE.match(line)
            if match is not None and match[1] not in found:
                found[match[1]] = ast.literal_eval(match["value"].strip())
        revision = found.get("revision")
        if not isinstance(revision, str):
            raise ValueError(f"migration {path.name} names no revision")
        revisions.add(revision)
        down = found.get("down_revision")
        parents.update((down,) if isinstance(down, str) else tuple(down or ()))
    return frozenset(revisions - parents), frozenset(revisions)


async def _at_heads(conn: AsyncConnection) -> bool:
    """Whether the database was migrated to exactly the shipped heads."""
    if conn.dialect.name == "sqlite":
        exists = (await conn.exec_driver_sql(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' "
            "AND name = 'alembic_version'")).scalar()
    else:
        exists = (await conn.exec_driver_sql(
            "SELECT to_regclass('alembic_version') IS NOT NULL")).scalar()
    if not exists:
        return False
    current = {str(row[0]) for row in await conn.exec_driver_sql(
        "SELECT version_num FROM alembic_version")}
    return current == set(shipped_revisions()[0])


def alembic_config(url: str, schema: str | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if schema:
        cfg.attributes["schema"] = schema
    return cfg


async def upgrade(engine: AsyncEngine, schema: str | None = None, revision: str = "head") -> None:
    """Run migrations over the engine's own connection. A database already at the shipped
    heads is left as it is without loading Alembic (most start-ups)."""
    url = engine.url.render_as_string(hide_password=False)

    def _run(sync_conn: Connection) -> None:
        from alembic import command

        cfg = alembic_config(url, schema)
        cfg.attributes["connection"] = sync_conn
        command.upgrade(cfg, revision)

    async with engine.begin() as conn:
        if schema and not is_sqlite(url):
            await conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        if revision == "head" and await _at_heads(conn):
            return
        await conn.run_sync(_run)


def run_blocking(main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main`` to completion from synchronous start-up code, on a private thread and
    event loop (the server's loop is not running yet, and must not be borrowed)."""
    failure: list[BaseException] = []

    def _target() -> None:
        try:
            asyncio.run(_call(main))
        except BaseException as exc:  # re-raised on the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=_target, name="kaizen-bootstrap")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


async def _call(main: Callable[[], Awaitable[None]]) -> None:
    await main()
