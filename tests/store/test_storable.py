"""The store's one policy for text the databases cannot store (store/storable.py), at the
store boundary itself, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from kaizen_server_extension.store import Store, create_engine, upgrade
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.store.storable import (
    ESCAPED_FLAG,
    UNSTORABLE,
    UnstorableText,
    escape_text,
    is_storable,
    restore,
    storable_document,
    unescape_text,
    unstorable_field,
)
from tests.conftest import BACKENDS, POSTGRES_URL, drop_schema, new_schema
from tests.support.unicode import any_text

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12)
documents = st.dictionaries(any_text.filter(lambda k: k != ESCAPED_FLAG), json_values,
                            max_size=5)


@given(text=any_text)
def test_the_escaping_is_reversible_and_leaves_nothing_unstorable(text: str) -> None:
    escaped = escape_text(text)
    assert is_storable(escaped)
    assert unescape_text(escaped) == text
    if "\\" not in text and is_storable(text):
        assert escaped == text  # storable text without a backslash is never changed


@given(document=documents)
def test_a_document_is_stored_as_it_is_or_escaped_flagged_and_restorable(
        document: dict[str, Any]) -> None:
    stored = storable_document(document)
    assert unstorable_field(stored) is None
    if unstorable_field(document) is None:
        assert stored is document  # nothing to do: not even a copy
    else:
        assert stored[ESCAPED_FLAG] is True
    assert restore(stored) == document
    assert storable_document(stored) is stored  # idempotent


@given(value=json_values)
def test_the_hot_path_check_agrees_with_the_field_finder(value: Any) -> None:
    from kaizen_server_extension.store.storable import _holds_unstorable

    assert _holds_unstorable(value) == (unstorable_field(value) is not None)
    assert _holds_unstorable({"wrapped": (value,)}) == _holds_unstorable(value)


def test_only_nul_and_surrogates_are_unstorable() -> None:
    assert not is_storable("\x00") and not is_storable("a\ud800") and not is_storable("\udfff")
    controls = "".join(chr(c) for c in range(1, 32)) + "\x7f\x80\x9f\ufffe\uffff\U0010ffff"
    assert is_storable(controls) and escape_text(controls) == controls
    assert unstorable_field({"a": [1, {"b\x00": 2}]}) == "a.1.b\x00"
    assert unstorable_field({"a": ["ok", "n\x00"]}) == "a.1"


# --- against the databases -----------------------------------------------------------------


@pytest.fixture(scope="module", params=BACKENDS)
def db(request: pytest.FixtureRequest,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[asyncio.AbstractEventLoop,
                                                                   Store, str]]:
    """A migrated store on each backend, with one room, driven from its own event loop (so
    hypothesis can call it from a plain function)."""
    loop = asyncio.new_event_loop()
    schema = None
    if request.param == "sqlite":
        url = sqlite_url_for(Path(tmp_path_factory.mktemp("storable")) / "kaizen.db")
    else:
        url, schema = POSTGRES_URL, new_schema()

    async def start() -> tuple[Store, str]:
        engine = create_engine(url, schema=schema)
        await upgrade(engine, schema)
        store = Store(engine)
        await store.members.ensure("alice")
        await store.agents.ensure_system_agent("general", "General", persona="p",
                                               mode="chat", tool_ceiling=[])
        room = await store.conversations.create("alice", "general", "room", False)
        return store, room.id

    store, room = loop.run_until_complete(start())
    try:
        yield loop, store, room
    finally:
        loop.run_until_complete(store.dispose())
        if schema:
            loop.run_until_complete(drop_schema(schema))
        loop.close()


async def _count(store: Store, model: Any) -> int:
    async with store.transaction() as tx:
        return int((await tx.session.execute(select(func.count()).select_from(model)))
                   .scalar_one())


@pytest.mark.rule("R-264", "R-267")
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=documents)
def test_any_journal_or_audit_document_is_stored_and_read_back_as_the_stated_escaping(
        db: tuple[asyncio.AbstractEventLoop, Store, str], document: dict[str, Any]) -> None:
    """A journal event or audit row carrying machine text never fails to be written; what
    observers get, what is read back and what is stored are the same stated escaping, and
    restoring it gives the original."""
    loop, store, room = db

    async def work() -> None:
        async with store.transaction() as tx:
            appended = await tx.append_event(room, "tool.settled", "alice", document)
            await tx.audit("alice", "tool.call", document, conversation_id=room)
        assert appended.data == storable_document(document)
        [read] = [e for e in await store.journal.read(room, "alice", after=appended.seq - 1,
                                                      limit=1)]
        assert read.data == appended.data and restore(read.data) == document
        async with store.transaction() as tx:
            audit = (await tx.session.execute(
                select(m.AuditEvent.data).order_by(m.AuditEvent.id.desc()).limit(1)
            )).scalar_one()
        assert audit == appended.data

    loop.run_until_complete(work())


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(title=any_text)
def test_any_text_column_value_is_stored_exactly_or_refused_with_nothing_written(
        db: tuple[asyncio.AbstractEventLoop, Store, str], title: str) -> None:
    """Through the ORM session and the units' direct driver path alike."""
    loop, store, room = db

    async def work() -> None:
        before = await _count(store, m.Conversation)
        if UNSTORABLE.search(title):
            with pytest.raises(UnstorableText):
                await store.conversations.create("alice", "general", title, False)
            with pytest.raises(UnstorableText):
                await store.inputs.accept(room, "alice", title, kind="message",
                                          idempotency_key=None)
            assert await _count(store, m.Conversation) == before
        else:
            created = await store.conversations.create("alice", "general", title, False)
            assert (await store.conversations.get_for(created.id, "alice")).title == title
            assert await _count(store, m.Conversation) == before + 1

    loop.run_until_complete(work())


def test_a_unit_on_the_driver_refuses_an_unstorable_column_value(
        db: tuple[asyncio.AbstractEventLoop, Store, str]) -> None:
    """The hot path (store/units.py) converts values with the same column types."""
    from kaizen_server_extension.store.core import journal_append

    loop, store, room = db

    async def work() -> None:
        events = len(await store.journal.read(room, "alice", limit=1000))
        with pytest.raises(UnstorableText):
            await store.run(journal_append(room, "tool.settled", "ali\x00ce", {"a": 1},
                                           run_id=None, notify=store.notifies))
        appended = await store.run(journal_append(room, "tool.settled", "alice",
                                                  {"out": "x\x00y"}, run_id=None,
                                                  notify=store.notifies))
        assert appended.data == {"out": "x\\u0000y", ESCAPED_FLAG: True}
        assert len(await store.journal.read(room, "alice", limit=1000)) == events + 1

    loop.run_until_complete(work())
