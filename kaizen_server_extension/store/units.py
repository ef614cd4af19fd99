"""Transactions written once as *units*, run through a session or straight on the driver.

A running turn writes two small transactions per tool call and one per model step. Through
the asyncio session every statement costs several round trips to aiosqlite's worker thread
(cursor, execute, fetch, close) plus SQLAlchemy's per-statement work, and every transaction
adds BEGIN, COMMIT and the pool's reset; on PostgreSQL the pool's pre-ping adds three network
round trips of its own. Those hops, not the databases, were most of a tool call's cost
(bench/README.md).

A unit is a generator: it yields the statements of one transaction (:class:`Query`) and the
journal events it appended (:class:`Appended`), receives each statement's rows, and returns
its result. The statements are the store's SQLAlchemy Core statements. A unit runs:

* inside an open :class:`~kaizen_server_extension.store.store.Tx`, statement by statement
  through the session (``Tx.run``), where it is one part of a larger transaction;
* on its own (``Store.run``): on SQLite the whole transaction, BEGIN IMMEDIATE to COMMIT, runs
  on the event loop's thread when the write lock is free, else as one call on the pooled
  connection's thread (:class:`SQLiteRunner`); on PostgreSQL it runs on asyncpg from a pool of
  its own without the pre-ping, as one BEGIN … COMMIT (:class:`PostgresRunner`).

Either way the same rows are written: the driver path compiles each statement once per
dialect and converts parameters with the column types' own bind processors, as SQLAlchemy
does. Rows come back as the driver returns them (units read only numbers and text).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import weakref
from abc import ABC, abstractmethod
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import asyncpg
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import ClauseElement, sqltypes
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import TypeDecorator, TypeEngine

from kaizen_server_extension.store.records import EventRecord

T = TypeVar("T")
Rows = list[tuple[Any, ...]]
log = logging.getLogger("kaizen.store")

#: How long a transaction waits for this process's SQLite writer gate: the pool's own
#: checkout timeout (store/engine.py), which the gate stands in front of.
WRITER_GATE_TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class Query:
    """One statement of a unit. ``clause`` is a statement built once (module level): the
    driver path compiles it once per dialect and keys its cache on it. ``typed``: its rows
    come back converted by the result columns' types (datetimes, booleans, JSON documents)
    on the driver path too, as a session returns them; otherwise as the driver returns them
    (numbers and text, which is all the writing units read)."""

    clause: ClauseElement
    params: Mapping[str, Any]
    typed: bool = False


@dataclass(frozen=True, slots=True)
class Appended:
    """A journal event the unit appended, published to observers once the unit commits."""

    record: EventRecord


Step = Query | Appended
Unit = Generator[Step, Rows | None, T]


def fetch(clause: ClauseElement, params: Mapping[str, Any]) -> Generator[Step, Rows | None, Rows]:
    """``rows = yield from fetch(...)``: run one statement, get its rows ([] when none)."""
    rows = yield Query(clause, params)
    return rows or []


def select_rows(clause: ClauseElement,
                params: Mapping[str, Any]) -> Generator[Step, Rows | None, Rows]:
    """``rows = yield from select_rows(...)``: like :func:`fetch`, with the rows converted
    by their columns' types (a record can be built from them as from a session's)."""
    rows = yield Query(clause, params, typed=True)
    return rows or []


@dataclass(frozen=True, slots=True)
class CompiledStatement:
    """A Core statement compiled for one dialect: SQL text, argument order, converters."""

    sql: str
    names: tuple[str, ...]
    converters: tuple[Callable[[Any], Any] | None, ...]
    defaults: Mapping[str, Any]
    #: Per result column, what turns the driver's value into the type's (None: as it is).
    results: tuple[Callable[[Any], Any] | None, ...] = ()

    @classmethod
    def of(cls, clause: ClauseElement, dialect: Dialect) -> CompiledStatement:
        compiled = clause.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
        if compiled.positiontup is None or "POSTCOMPILE" in compiled.string:
            raise ValueError("a unit statement needs plain positional parameters")
        names = tuple(compiled.positiontup)
        converters = []
        defaults: dict[str, Any] = {}
        for name in names:
            bind = compiled.binds[name]
            converters.append(bind.type.dialect_impl(dialect).bind_processor(dialect))
            if not bind.required:
                defaults[name] = bind.effective_value
        results = tuple(_result_converter(entry.type, dialect)
                        for entry in compiled._result_columns)
        return cls(compiled.string, names, tuple(converters), defaults, results)

    def rows(self, raw: Iterable[Sequence[Any]]) -> Rows:
        """The driver's rows with each value converted by its column's type."""
        results = self.results
        if not any(results):
            return [tuple(row) for row in raw]
        return [tuple(value if convert is None or value is None else convert(value)
                      for value, convert in zip(row, results, strict=True)) for row in raw]

    def arguments(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        values = []
        for name, convert in zip(self.names, self.converters, strict=True):
            value = params[name] if name in params else self.defaults[name]
            # Like SQLAlchemy, every value goes through the type's processor, None included.
            values.append(convert(value) if convert is not None else value)
        return tuple(values)


def _result_converter(type_: TypeEngine[Any], dialect: Dialect) -> Callable[[Any], Any] | None:
    """What SQLAlchemy would apply to a value of ``type_`` read through ``dialect``. One
    difference: SQLAlchemy's asyncpg connections decode JSON themselves (a type codec), the
    unit pool's do not, so a JSON column's text is decoded here."""
    impl = type_.dialect_impl(dialect)
    processor = impl.result_processor(dialect, None)
    stored = impl.load_dialect_impl(dialect) if isinstance(impl, TypeDecorator) else impl
    if dialect.name != "postgresql" or not isinstance(stored, sqltypes.JSON):
        return processor

    def from_json_text(value: Any) -> Any:
        decoded = json.loads(value) if isinstance(value, str) else value
        return processor(decoded) if processor is not None else decoded

    return from_json_text


@dataclass(slots=True)
class UnitCounts:
    """Transactions and statements (BEGIN, COMMIT not counted) the direct runner ran: the
    part of the store's cost that does not move with machine load (bench/)."""

    transactions: int = 0
    statements: int = 0


class DirectRunner(ABC):
    """Runs a unit as one transaction on the driver, returning its result and the journal
    events it appended."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._main = engine
        self._dialect = engine.dialect
        self._compiled: dict[ClauseElement, CompiledStatement] = {}
        self.counts = UnitCounts()

    def statement_for(self, clause: ClauseElement) -> CompiledStatement:
        """The clause compiled for this database (cached), counted as one statement run."""
        self.counts.statements += 1
        statement = self._compiled.get(clause)
        if statement is None:
            statement = self._compiled[clause] = CompiledStatement.of(clause, self._dialect)
        return statement

    @abstractmethod
    async def run(self, unit: Unit[T], *, write: bool, durable: bool,
                  single_statement: bool = False) -> tuple[T, list[EventRecord]]:
        """Run ``unit`` as one transaction. ``single_statement``: the unit is one statement,
        which may run as its own implicit transaction (PostgreSQL: see
        :meth:`PostgresRunner.run`); elsewhere it runs as any unit."""

    @abstractmethod
    async def read(self, make: Callable[..., Unit[T]], args: Sequence[Any], *,
                   single_statement: bool = False) -> T:
        """Run the read-only unit ``make(*args)``; ``make`` may be called again for a fresh
        unit when the first attempt could not run (the database was busy, the connection
        gone). ``single_statement``: one statement, which may run as its own implicit
        transaction (PostgreSQL: one round trip)."""

    async def dispose(self) -> None:
        return None

    async def run_flushed_statement(self, unit: Unit[T]) -> tuple[T, list[EventRecord]]:
        """The one-statement write ``unit``, answered once it is on disk; see
        :meth:`PostgresRunner.run_flushed_statement`. Elsewhere a durable single-statement
        unit."""
        return await self.run(unit, write=True, durable=True, single_statement=True)

    async def flushed(self) -> None:
        """Return once every commit that returned before this call is on disk (PostgreSQL:
        see :class:`GroupFlush`). SQLite's commits are as durable as they get when they
        return (WAL, ``synchronous=NORMAL``: store/engine.py)."""
        return None

    def writer_gate(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Held around this process's session transactions: on SQLite it keeps them and units
        from meeting at the database's write lock; elsewhere it is free."""
        return contextlib.nullcontext()

    @staticmethod
    def for_engine(engine: AsyncEngine) -> DirectRunner:
        if engine.dialect.name == "sqlite":
            return SQLiteRunner(engine)
        if engine.dialect.name == "postgresql" and engine.dialect.driver == "asyncpg":
            return PostgresRunner(engine)
        raise ValueError(f"no unit runner for {engine.dialect.name}+{engine.dialect.driver}")


class _Stepping(Generic[T]):
    """Steps one unit for a driver: hands out its statements one at a time, collects the
    journal events it appended, and keeps its result once it returns."""

    def __init__(self, unit: Unit[T]) -> None:
        self._unit = unit
        self.appended: list[EventRecord] = []
        self.result: T | None = None

    def next_query(self, reply: Rows | None = None) -> Query | None:
        """The next statement to run, given the rows of the previous one; None when the
        unit has returned (its value is then ``result``)."""
        while True:
            try:
                step = self._unit.send(reply)
            except StopIteration as stop:
                self.result = stop.value
                return None
            if isinstance(step, Query):
                return step
            self.appended.append(step.record)
            reply = None

    def outcome(self) -> tuple[T, list[EventRecord]]:
        return self.result, self.appended  # type: ignore[return-value]

    def close(self) -> None:
        self._unit.close()


class SQLiteRunner(DirectRunner):
    """SQLite: a unit runs on the event loop's own thread when it can, else on the pooled
    connection's thread; either way as one BEGIN IMMEDIATE … COMMIT.

    On the loop's thread it uses a connection of its own, with ``busy_timeout`` 0, so it never
    waits there: a transaction of a few indexed statements takes about 0.1 to 0.2 ms, less than
    the two thread hops and the pool checkout it would otherwise cost. When the write lock is
    held elsewhere (another process, or a session outside the writer gate) BEGIN fails at
    once and the unit goes to the pooled connection's thread, where it waits its turn like any
    session. This process's own sessions and units never meet at SQLite's lock: both hold the
    writer gate (``Store.transaction``). The loop's connection never checkpoints the WAL (a
    checkpoint syncs the database file): every ``CHECKPOINT_EVERY`` units it asks the pooled
    connection to, and that connection's own commits checkpoint as before.

    aiosqlite offers no public way to run a function on its connection thread; its
    ``_execute`` (queue a callable for that thread) and ``_conn`` are what its own methods use,
    and tests/store/test_units.py fails should a release change them.
    """

    CHECKPOINT_EVERY = 500

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        database = engine.url.database
        # An in-memory database is private to its connection: no second connection to it.
        self._path = database if database and database != ":memory:" else None
        self._loop_db: sqlite3.Connection | None = None
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary())
        self._since_checkpoint = 0
        self._checkpointing: asyncio.Task[None] | None = None
        self.loop_thread_units = 0

    def _gate(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        gate = self._gates.get(loop)
        if gate is None:
            gate = self._gates[loop] = asyncio.Lock()
        return gate

    @asynccontextmanager
    async def writer_gate(self) -> AsyncIterator[None]:
        async with asyncio.timeout(WRITER_GATE_TIMEOUT_S), self._gate():
            yield

    async def run(self, unit: Unit[T], *, write: bool, durable: bool,
                  single_statement: bool = False) -> tuple[T, list[EventRecord]]:
        gate = self._gate()
        if gate.locked():
            async with self.writer_gate():
                return await self._run(unit, write)
        # Free: nothing awaits between this check and the unit's end on this thread.
        return await self._run(unit, write)

    async def read(self, make: Callable[..., Unit[T]], args: Sequence[Any], *,
                   single_statement: bool = False) -> T:
        """On the loop thread's connection, without the writer gate: under WAL a reader
        neither waits for nor blocks the writer, and sees the last commit. Should SQLite still
        answer busy (a WAL recovery, another process's exclusive checkpoint), a fresh unit
        runs on the pooled connection's thread, which waits its turn."""
        db = self._loop_connection()
        if db is not None:
            try:
                db.execute("BEGIN")
                return self._run_begun(db, make(*args))[0]
            except sqlite3.OperationalError as error:
                if error.sqlite_errorcode not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                    raise
        result, _appended = await self._on_pool_thread(make(*args), False)
        return result

    async def _run(self, unit: Unit[T], write: bool) -> tuple[T, list[EventRecord]]:
        db = self._loop_connection()
        if db is not None and self._begin(db, write):
            self.loop_thread_units += 1
            result = self._run_begun(db, unit)
            self._count_for_checkpoint()
            return result
        return await self._on_pool_thread(unit, write)

    def _loop_connection(self) -> sqlite3.Connection | None:
        if self._path is None:
            return None
        if self._loop_db is None:
            # check_same_thread off: the start-up code may run on a thread of its own; a
            # unit on this connection runs start to end without yielding, on one thread.
            db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            for pragma in ("journal_mode=WAL", "foreign_keys=ON", "busy_timeout=0",
                           "synchronous=NORMAL", "wal_autocheckpoint=0"):
                db.execute(f"PRAGMA {pragma}")
            self._loop_db = db
        return self._loop_db

    @staticmethod
    def _begin(db: sqlite3.Connection, write: bool) -> bool:
        """BEGIN without waiting; False when the write lock is held elsewhere."""
        try:
            # Writers take the write lock up front (see store/engine.py's BEGIN IMMEDIATE).
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                return False
            raise
        return True

    async def _on_pool_thread(self, unit: Unit[T], write: bool) -> tuple[T, list[EventRecord]]:
        async with self._main.connect() as connection:
            driver = (await connection.get_raw_connection()).driver_connection
            assert driver is not None
            result: tuple[T, list[EventRecord]] = await driver._execute(
                self._run_waiting, driver._conn, unit, write)
            return result

    def _run_waiting(self, db: sqlite3.Connection, unit: Unit[T],
                     write: bool) -> tuple[T, list[EventRecord]]:
        # The pooled connection waits for the lock (its busy_timeout, store/engine.py).
        db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        return self._run_begun(db, unit)

    def _run_begun(self, db: sqlite3.Connection, unit: Unit[T]) -> tuple[T, list[EventRecord]]:
        self.counts.transactions += 1
        stepping = _Stepping(unit)
        try:
            query = stepping.next_query()
            while query is not None:
                statement = self.statement_for(query.clause)
                try:
                    cursor = db.execute(statement.sql, statement.arguments(query.params))
                except sqlite3.IntegrityError as error:
                    raise IntegrityError(statement.sql, None, error) from error
                query = stepping.next_query(statement.rows(cursor) if query.typed
                                            else cursor.fetchall())
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            stepping.close()
        return stepping.outcome()

    def _count_for_checkpoint(self) -> None:
        self._since_checkpoint += 1
        if self._since_checkpoint >= self.CHECKPOINT_EVERY and self._checkpointing is None:
            self._since_checkpoint = 0
            self._checkpointing = asyncio.get_running_loop().create_task(self._checkpoint())

    async def _checkpoint(self) -> None:
        try:
            async with self._main.connect() as connection:
                driver = (await connection.get_raw_connection()).driver_connection
                assert driver is not None
                # Outside any transaction (a checkpoint cannot run inside one); PASSIVE takes
                # no writer lock, so units and sessions go on meanwhile.
                await driver._execute(_checkpoint_passive, driver._conn)
        except Exception:
            log.warning("SQLite WAL checkpoint failed; the next one will retry",
                        exc_info=True)
        finally:
            self._checkpointing = None

    async def dispose(self) -> None:
        if self._checkpointing is not None:
            await self._checkpointing
        if self._loop_db is not None:
            self._loop_db.close()
            self._loop_db = None


def _checkpoint_passive(db: sqlite3.Connection) -> None:
    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()


#: What a PostgreSQL unit's transaction starts with. A unit that need not be durable before
#: its commit returns (a read tool's call and settlement, a step's start) commits without
#: waiting for the WAL flush: a later durable commit flushes it, and only a crash of the
#: database server in between loses it (docs/architecture.md, "Durability").
_PG_BEGIN = {
    # (write, durable, the session's synchronous_commit is off): see KaizenConnection.
    (True, True, False): "BEGIN",
    (True, False, False): "BEGIN; SET LOCAL synchronous_commit TO off",
    (True, True, True): "BEGIN; SET LOCAL synchronous_commit TO DEFAULT",
    (True, False, True): "BEGIN",
    **{(False, durable, off): "BEGIN READ ONLY" for durable in (True, False)
       for off in (True, False)},
}

# Raised by asyncpg (or the socket under it) when the pooled connection is gone, e.g. after the
# database restarted; before BEGIN succeeded nothing was done, so the unit can run again
# (after, whether it committed is unknown: store/accept_batch.py).
DISCONNECTED = (OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError,
                 asyncpg.exceptions.AdminShutdownError)


class KaizenConnection(asyncpg.Connection):
    """A unit pool's connection, knowing its session's ``synchronous_commit``: off once it
    has run a single-statement unit (which then needs no SET of its own); every durable
    transaction on it then says ``SET LOCAL synchronous_commit TO DEFAULT`` in its BEGIN."""

    commits_async = False

    def mark_commits_async(self) -> None:
        self.commits_async = True


class GroupFlush:
    """Waits until every commit that returned before :meth:`wait` was called is flushed.

    Waiters arriving while a barrier runs wait for the next one (the running one may have
    begun before their commit); all who arrived meanwhile share that next one. So a process
    runs at most one barrier at a time, and a burst of commits a few barriers in all."""

    def __init__(self, barrier: Callable[[], Awaitable[None]]) -> None:
        self._barrier = barrier
        self._waiting: list[asyncio.Future[None]] = []
        self._draining: asyncio.Task[None] | None = None

    async def wait(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        if self._draining is None:
            self._draining = asyncio.ensure_future(self._drain())
        await waiter

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    await self._barrier()
                except BaseException as error:
                    for waiter in batch:
                        if not waiter.done():
                            waiter.set_exception(error)
                    if not isinstance(error, Exception):
                        raise
                else:
                    for waiter in batch:
                        if not waiter.done():
                            waiter.set_result(None)
        finally:
            self._draining = None
            for waiter in self._waiting:  # only when cancelled, at shutdown
                if not waiter.done():
                    waiter.set_exception(asyncpg.InterfaceError("the store is closing"))


class PostgresRunner(DirectRunner):
    """On asyncpg from a pool of its own: the same database, user and ``search_path`` as the
    store's engine. No SQLAlchemy pool in between (its checkout and checkin are greenlet
    hops, and its pre-ping three round trips), and no reset query when a connection goes
    back: a unit ends its own transaction. A connection found dead at BEGIN is dropped and
    the unit runs once more on a fresh one."""

    def __init__(self, engine: AsyncEngine, pool_size: int = 4) -> None:
        super().__init__(engine)
        self._pool_size = pool_size
        self._pool: asyncpg.Pool | None = None
        self._starting = asyncio.Lock()
        self._flush = GroupFlush(self._barrier)
        # The connection of run_flushed_statement, and the one statement at a time it runs.
        self._flushing_pg: asyncpg.Connection | None = None
        self._flushing = asyncio.Lock()

    async def _connections(self) -> asyncpg.Pool:
        if self._pool is None:
            async with self._starting:
                if self._pool is None:
                    async with self._main.connect() as connection:
                        search_path = (await connection.exec_driver_sql(
                            "SHOW search_path")).scalar_one()
                    url = self._main.url.set(drivername="postgresql")
                    # Units are short: a few connections serve many turns, and every server
                    # process on the database adds its own (docs/architecture.md).
                    self._pool = await asyncpg.create_pool(
                        url.render_as_string(hide_password=False), min_size=1,
                        max_size=2 * self._pool_size,
                        server_settings={"search_path": search_path},
                        reset=_end_open_transaction, connection_class=KaizenConnection)
        return self._pool

    async def run(self, unit: Unit[T], *, write: bool, durable: bool,
                  single_statement: bool = False) -> tuple[T, list[EventRecord]]:
        """One BEGIN … COMMIT; or, ``single_statement`` (a write), the unit's one statement
        as its own implicit transaction.

        A single statement holds its row locks only while the database executes it: no
        round trip to this process (whose event loop may be busy) comes between the
        statement and its commit. Nor does its commit hold them across the WAL flush: the
        connection runs it with ``synchronous_commit`` off, and when ``durable`` the caller
        then waits for a WAL barrier (:class:`GroupFlush`) that starts after the commit, so
        hears back only once the statement is on disk. A burst of statements queued at one
        row lock so pays for its flushes outside the lock, a few barriers for all of them.
        """
        pool = await self._connections()
        if single_statement:
            result = await self._single(pool, unit)
            if durable:
                await self._flush.wait()
            return result
        for attempt in (1, 2):
            async with pool.acquire() as pg:
                try:
                    await pg.execute(_PG_BEGIN[(write, durable, pg.commits_async)])
                except DISCONNECTED:
                    pg.terminate()
                    if attempt == 2:
                        raise
                    continue
                return await self._run_begun(pg, unit)
        raise AssertionError("unreachable")

    async def read(self, make: Callable[..., Unit[T]], args: Sequence[Any], *,
                   single_statement: bool = False) -> T:
        """``BEGIN READ ONLY`` … ``COMMIT``; or, one statement, as its own implicit
        transaction (one round trip). A connection found dead is dropped and the read runs
        once more on a fresh one (a read can always be repeated)."""
        pool = await self._connections()
        for attempt in (1, 2):
            async with pool.acquire() as pg:
                try:
                    if single_statement:
                        return (await self._run_single(pg, make(*args)))[0]
                    await pg.execute("BEGIN READ ONLY")
                except DISCONNECTED:
                    pg.terminate()
                    if attempt == 2:
                        raise
                    continue
                return (await self._run_begun(pg, make(*args)))[0]
        raise AssertionError("unreachable")

    async def _single(self, pool: asyncpg.Pool, unit: Unit[T]) -> tuple[T, list[EventRecord]]:
        for attempt in (1, 2):
            async with pool.acquire() as pg:
                if not pg.commits_async:
                    # This connection's first single statement: its session's setting is
                    # off from now on (its durable transactions then say "on" themselves).
                    try:
                        await pg.execute("SET synchronous_commit TO off")
                    except DISCONNECTED:
                        pg.terminate()
                        if attempt == 2:
                            raise
                        continue
                    pg.mark_commits_async()
                return await self._run_single(pg, unit)
        raise AssertionError("unreachable")

    async def _run_single(self, pg: asyncpg.Connection,
                          unit: Unit[T]) -> tuple[T, list[EventRecord]]:
        self.counts.transactions += 1
        stepping = _Stepping(unit)
        try:
            query = stepping.next_query()
            if query is not None:
                statement = self.statement_for(query.clause)
                arguments = statement.arguments(query.params)
                try:
                    rows = await pg.fetch(statement.sql, *arguments)
                except asyncpg.IntegrityConstraintViolationError as error:
                    raise IntegrityError(statement.sql, None, error) from error
                if stepping.next_query(statement.rows(rows) if query.typed
                                       else [tuple(row) for row in rows]) is not None:
                    raise ValueError("a single-statement unit asked for a second statement")
        finally:
            stepping.close()
        return stepping.outcome()

    async def flushed(self) -> None:
        await self._flush.wait()

    async def run_flushed_statement(self, unit: Unit[T]) -> tuple[T, list[EventRecord]]:
        """The one-statement write ``unit`` as its own implicit transaction whose commit
        waits for the WAL flush (the database's ``synchronous_commit``), on a connection of
        its own, one statement at a time: one round trip to an answer that means "on disk",
        where a unit-pool statement takes two (the statement, then a barrier). Its row locks
        are held through that flush, so this suits a few large writes — the acceptance
        batches (store/accept_batch.py) — not every statement. A connection found broken is
        dropped (the error goes to the caller, who cannot know whether it committed) and the
        next statement opens a fresh one."""
        async with self._flushing:
            pg = self._flushing_pg
            if pg is None or pg.is_closed():
                pool = await self._connections()
                async with pool.acquire() as pooled:
                    search_path = await pooled.fetchval("SHOW search_path")
                url = self._main.url.set(drivername="postgresql")
                pg = self._flushing_pg = await asyncpg.connect(
                    url.render_as_string(hide_password=False),
                    server_settings={"search_path": search_path})
            try:
                return await self._run_single(pg, unit)
            except DISCONNECTED:
                self._flushing_pg = None
                pg.terminate()
                raise

    async def _barrier(self) -> None:
        """Commit a WAL record, flushed before the commit returns: a transactional
        logical-decoding message, which any role may emit and which changes no table. Its
        commit record follows every commit that returned before it began."""
        pool = await self._connections()
        async with pool.acquire() as pg:
            prefix = "SET LOCAL synchronous_commit TO DEFAULT; " if pg.commits_async else ""
            await pg.execute(f"BEGIN; {prefix}"
                             "SELECT pg_logical_emit_message(true, 'kaizen', 'flush'); COMMIT")

    async def _run_begun(self, pg: asyncpg.Connection,
                         unit: Unit[T]) -> tuple[T, list[EventRecord]]:
        self.counts.transactions += 1
        stepping = _Stepping(unit)
        try:
            query = stepping.next_query()
            while query is not None:
                statement = self.statement_for(query.clause)
                try:
                    rows = await pg.fetch(statement.sql, *statement.arguments(query.params))
                except asyncpg.IntegrityConstraintViolationError as error:
                    raise IntegrityError(statement.sql, None, error) from error
                query = stepping.next_query(statement.rows(rows) if query.typed
                                            else [tuple(row) for row in rows])
            await pg.execute("COMMIT")
        except BaseException:
            try:
                if pg.is_in_transaction():
                    await pg.execute("ROLLBACK")
            except Exception:
                pg.terminate()  # never hand a connection in an unknown state to the next unit
            raise
        finally:
            stepping.close()
        return stepping.outcome()

    async def dispose(self) -> None:
        if self._flushing_pg is not None:
            await self._flushing_pg.close()
            self._flushing_pg = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


async def _end_open_transaction(pg: asyncpg.Connection) -> None:
    """The pool's reset: a unit ends its transaction itself, so normally there is nothing to
    do and no round trip; one left open by an interrupted unit is rolled back."""
    if pg.is_in_transaction():
        await pg.execute("ROLLBACK")


async def run_in_session(session: Any, unit: Unit[T]) -> tuple[T, list[EventRecord]]:
    """Run ``unit`` statement by statement inside the session's open transaction."""
    stepping = _Stepping(unit)
    try:
        query = stepping.next_query()
        while query is not None:
            executed = await session.execute(query.clause, dict(query.params))
            query = stepping.next_query(
                [tuple(row) for row in executed.all()] if executed.returns_rows else [])
    finally:
        stepping.close()
    return stepping.outcome()
