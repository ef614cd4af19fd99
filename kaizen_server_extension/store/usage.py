"""Per-member daily token accounting (LLM_PER_USER_DAILY_TOKENS).

With a positive cap, the check, the model call and the usage row run under one per-member
lock: ``SELECT … FOR UPDATE`` on the member's usage row on PostgreSQL (so server replicas
serialize too), an in-process lock on SQLite, which is single-process by design. The lock is
released on every exit path — success, provider error, cancellation — because it is a
transaction or a context manager, never a flag. With the cap at 0 there is no lock and no
lookup; usage is still recorded after the call.

Recording a call's tokens is one unit (store/units.py), an upsert of the member's row for the
day: it runs after every model step, so it is on the turn's hot path. Like the other records
of a model step it need not wait for PostgreSQL's log flush (docs/architecture.md,
"Durability").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import bindparam, select, text, update
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import Tx
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.store.units import Unit, fetch

_USAGE = m.Base.metadata.tables[m.TokenUsage.__tablename__]
# The day's row is created or bumped in one statement (both databases spell the upsert
# alike); a member without a row in ``members`` records nothing, as the lookup before did.
# The WHERE of the SELECT is also what lets SQLite parse an upsert from a SELECT.
_ADD_TOKENS = text(
    "INSERT INTO token_usage (member, day, tokens) "
    "SELECT :b_member, :b_day, :b_tokens WHERE EXISTS "
    "(SELECT 1 FROM members WHERE members.id = :b_member) "
    "ON CONFLICT (member, day) DO UPDATE SET tokens = token_usage.tokens + excluded.tokens"
).bindparams(bindparam("b_member", type_=_USAGE.c.member.type),
             bindparam("b_day", type_=_USAGE.c.day.type),
             bindparam("b_tokens", type_=_USAGE.c.tokens.type))
_USED = (select(_USAGE.c.tokens)
         .where(_USAGE.c.member == bindparam("b_member"), _USAGE.c.day == bindparam("b_day")))


def add_tokens(member: str, day: str, tokens: int) -> Unit[None]:
    """Add ``tokens`` to the member's usage of ``day``."""
    yield from fetch(_ADD_TOKENS, {"b_member": member, "b_day": day, "b_tokens": tokens})


def used_tokens(member: str, day: str) -> Unit[int]:
    rows = yield from fetch(_USED, {"b_member": member, "b_day": day})
    return int(rows[0][0] or 0) if rows else 0


class DailyTokenCapReached(Exception):
    """The member used their daily token allowance."""


@dataclass
class Meter:
    """Collects the tokens of one guarded model call."""

    tokens: int = 0

    def add(self, tokens: int) -> None:
        self.tokens += max(0, tokens)


def today() -> str:
    return datetime.now(UTC).date().isoformat()


class UsageLedger:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._local_locks: dict[str, asyncio.Lock] = {}

    @asynccontextmanager
    async def guard(self, member: str, cap: int) -> AsyncIterator[Meter]:
        meter = Meter()
        if cap <= 0:
            yield meter
            await self._add(member, meter.tokens)
            return
        if self._store.engine.dialect.name == "postgresql":
            async with self._store.transaction() as tx:
                await self._ensure_row(member)
                used = (await tx.session.execute(
                    select(m.TokenUsage.tokens)
                    .where(m.TokenUsage.member == member, m.TokenUsage.day == today())
                    .with_for_update()
                )).scalar_one()
                if used >= cap:
                    raise DailyTokenCapReached()
                yield meter
                await self._increment(tx, member, meter.tokens)
            return
        lock = self._local_locks.setdefault(member, asyncio.Lock())
        async with lock:
            if await self.used(member) >= cap:
                raise DailyTokenCapReached()
            try:
                yield meter
            finally:
                await self._add(member, meter.tokens)

    async def used(self, member: str) -> int:
        return await self._store.run(used_tokens(member, today()), write=False)

    async def _ensure_row(self, member: str) -> None:
        try:
            async with self._store.transaction() as tx:
                if await tx.session.get(m.TokenUsage, (member, today())) is None:
                    tx.session.add(m.TokenUsage(member=member, day=today(), tokens=0))
        except IntegrityError:
            pass  # created concurrently: fine

    async def _add(self, member: str, tokens: int) -> None:
        if tokens <= 0:
            return
        # One statement: on PostgreSQL its own implicit transaction, one round trip.
        await self._store.run(add_tokens(member, today(), tokens), durable=False,
                              single_statement=True)

    @staticmethod
    async def _increment(tx: Tx, member: str, tokens: int) -> None:
        if tokens > 0:
            await tx.session.execute(
                update(m.TokenUsage)
                .where(m.TokenUsage.member == member, m.TokenUsage.day == today())
                .values(tokens=m.TokenUsage.tokens + tokens)
            )
