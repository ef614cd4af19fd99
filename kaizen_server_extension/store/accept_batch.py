"""Gathering a process's acceptances into batches (PostgreSQL; issue 21, bench/README.md).

A burst of messages into one room queues at the room's row: each acceptance locks it while
its statement runs, and must then be on disk before its 202. With many posts in flight the
hand-offs of that lock between database backends, and the round trips, dominate. So a process
writes the acceptances it holds at once as one statement (store/inputs.py: ``accept_batch``):

* the first acceptance goes at once, alone; those arriving while a batch is being written
  wait and go together as the next one, in arrival order (at most ``MAX_BATCH``);
* a batch's statement commits on a connection whose commit waits for the WAL flush
  (store/units.py: ``run_flushed_statement``), so when it returns its senders are answered
  at once and a 202 still means "on disk": one round trip per batch. The batch's rooms stay
  locked through that flush (a millisecond or a few), which a burst pays a few times, not
  once per post; a statement with ``synchronous_commit`` off followed by a WAL barrier took
  a second round trip through an event loop busy with the rest of the burst;
* its journal events are published to observers only then, as any unit's are only once
  committed;
* an input that cannot go with the others does not fail them: a second use of an
  idempotency key within one batch waits for the batch and is answered as any replay is,
  and a batch the database refuses (a key raced in from another process, a value a column
  refuses) is written again one input at a time, each with today's single acceptance, so
  each gets exactly the answer it would have got alone. A batch whose fate is unknown (the
  connection broke) is not written again: its senders get the error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import asyncpg
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.protocol.errors import MemberError
from kaizen_server_extension.store.core import utcnow
from kaizen_server_extension.store.inputs import Arrival, NewInput, accept_batch
from kaizen_server_extension.store.records import AcceptedInputRecord
from kaizen_server_extension.store.units import DISCONNECTED

if TYPE_CHECKING:
    from kaizen_server_extension.store.core import Database

log = logging.getLogger("kaizen.store")

#: The most inputs one statement writes: a burst larger than this goes as several batches.
MAX_BATCH = 128


class Alone(Enum):
    """The batch did not settle this input: accept it on its own (the caller's usual path)."""

    ALONE = "alone"


ALONE = Alone.ALONE
#: What the batcher answers for one input: written, None (nothing written: not a
#: participant, no such room, or the idempotency key is taken), or ALONE.
BatchOutcome = AcceptedInputRecord | None | Alone


@dataclass(slots=True)
class _Waiting:
    arrival: Arrival
    answer: asyncio.Future[BatchOutcome] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class AcceptBatcher:
    """One per process and store: writes the acceptances waiting at once as one statement,
    one batch at a time."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self._waiting: list[_Waiting] = []
        self._writing: asyncio.Task[None] | None = None
        #: Batches written, the inputs they held, and batches the database refused (tests).
        self.batches = 0
        self.inputs = 0
        self.refused = 0

    async def accept(self, new: NewInput) -> BatchOutcome:
        waiting = _Waiting(Arrival(new, utcnow()))
        self._waiting.append(waiting)
        if self._writing is None:
            self._writing = asyncio.ensure_future(self._write_all())
        # The batch is written (and settled) even if this request is cancelled meanwhile.
        return await asyncio.shield(waiting.answer)

    async def _write_all(self) -> None:
        try:
            while self._waiting:
                batch = self._waiting[:MAX_BATCH]
                del self._waiting[:MAX_BATCH]
                try:
                    await self._write(batch)
                except BaseException as error:
                    _fail(batch, error)  # no sender is left waiting, whatever broke
                    if not isinstance(error, Exception):
                        raise
        finally:
            self._writing = None

    async def _write(self, batch: list[_Waiting]) -> None:
        together, alone = _split_replays(batch)
        try:
            written = await self._database.run_flushed_statement(
                accept_batch([w.arrival for w in together]))
        except (IntegrityError, MemberError, asyncpg.PostgresError) as error:
            if isinstance(error, DISCONNECTED):
                raise  # whether it committed is unknown: never written twice
            # Refused by the database (nothing written): one at a time, as without batching.
            self.refused += 1
            log.info("acceptance batch of %d refused (%s); accepting one at a time",
                     len(together), type(error).__name__)
            _settle(batch, lambda _w: ALONE)
            return
        self.batches += 1
        self.inputs += len(together)
        outcome = {id(w): item for w, item in zip(together, written, strict=True)}
        try:
            self._database.publish([item.event for item in outcome.values()
                                    if item is not None])
        except Exception:
            # On disk either way: an observer that failed must not fail the senders.
            log.exception("publishing an acceptance batch failed")

        def answer(w: _Waiting) -> BatchOutcome:
            if id(w) in alone:
                return ALONE
            item = outcome[id(w)]
            return item.accepted if item is not None else None

        _settle(batch, answer)

    async def close(self) -> None:
        """Let the batch under way finish (shutdown)."""
        while self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)


def _split_replays(batch: list[_Waiting]) -> tuple[list[_Waiting], set[int]]:
    """The inputs the statement writes, and (by ``id``) those that reuse an idempotency key
    already used earlier in the batch: those wait for it and are then answered alone, as a
    replay (or a conflict) of what it wrote."""
    together: list[_Waiting] = []
    alone: set[int] = set()
    keys: set[tuple[str, str]] = set()
    for waiting in batch:
        new = waiting.arrival.new
        if new.idempotency_key is not None:
            key = (new.conversation_id, new.idempotency_key)
            if key in keys:
                alone.add(id(waiting))
                continue
            keys.add(key)
        together.append(waiting)
    return together, alone


def _settle(batch: list[_Waiting], answer: Callable[[_Waiting], BatchOutcome]) -> None:
    for waiting in batch:
        if not waiting.answer.done():
            waiting.answer.set_result(answer(waiting))


def _fail(batch: list[_Waiting], error: BaseException) -> None:
    for waiting in batch:
        if waiting.answer.done():
            continue
        if isinstance(error, asyncio.CancelledError):
            waiting.answer.cancel()
        else:
            waiting.answer.set_exception(error)
