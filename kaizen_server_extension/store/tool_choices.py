"""A member's per-conversation choices over source tools: what they left out of their turns in
one conversation (spec: Request-scoped platform tools, R-311).

A choice names a source tool exactly, its source (``mcp__<id>``, ``openapi__<id>``), its
family (``mcp``, ``openapi``) or every source (``sources``). It is one more intersection after
discovery, the agent's ceiling and admin policy: it removes, never adds. Keyed by (member,
conversation, name), so it is only ever the member's own and answers only their own turns;
read when a run is admitted, as its member. Replacing the set is audited.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sqlalchemy import bindparam, delete, select

from kaizen_server_extension.protocol.errors import SchemaViolation
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import Tx, utcnow
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.store.units import Unit, select_rows

CHOICES_AUDIT_ACTION = "tool.choices"
#: Names one member may leave out of one conversation.
MAX_CHOICES = 200
#: A level of the source tree a choice may name: the root, a family, or a source or one of
#: its tools under the family's prefix (at most 200 characters, as every tool name).
SOURCE_NAME_PATTERN = (r"^(?:sources|mcp|openapi|mcp__[A-Za-z0-9_.:-]{1,195}"
                       r"|openapi__[A-Za-z0-9_.:-]{1,191})$")
_SOURCE_NAME = re.compile(SOURCE_NAME_PATTERN)


def is_source_name(name: str) -> bool:
    """Whether ``name`` is a level of the source tree a choice may name."""
    return _SOURCE_NAME.fullmatch(name) is not None


def left_out(name: str, ancestors: Iterable[str], choices: frozenset[str]) -> bool:
    """Whether the member's ``choices`` leave out the tool ``name``: it or one of its policy
    ``ancestors`` (root, family, source) is chosen out."""
    return name in choices or any(a in choices for a in ancestors)


_TOOL_CHOICES = m.Base.metadata.tables[m.ConversationToolChoice.__tablename__]
_LEFT_OUT = select(_TOOL_CHOICES.c.tool).where(
    _TOOL_CHOICES.c.member == bindparam("b_member"),
    _TOOL_CHOICES.c.conversation_id == bindparam("b_conversation_id"))


def _left_out(member: str, conversation_id: str) -> Unit[frozenset[str]]:
    rows = yield from select_rows(_LEFT_OUT, {"b_member": member,
                                              "b_conversation_id": conversation_id})
    return frozenset(str(row[0]) for row in rows)


class ToolChoices:
    """The member's own choices in one conversation they take part in."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def off_for(self, member: str, conversation_id: str,
                      tx: Tx | None = None) -> frozenset[str]:
        """The names ``member`` left out of ``conversation_id`` (none for a conversation
        they do not take part in: a choice is only ever theirs). Read at every discovery of
        source tools, so outside a transaction it is a read unit (store/reads.py), not a
        session."""
        if tx is None:
            return await self.store.read(_left_out, member, conversation_id,
                                         single_statement=True)
        return await tx.run(_left_out(member, conversation_id))

    async def list_for(self, member: str, conversation_id: str) -> list[str]:
        async with self.store.transaction() as tx:
            # Not a participant (or no such room): the same NotFound as everywhere.
            await self.store.conversations.get_for(conversation_id, member, tx)
            return sorted(await self.off_for(member, conversation_id, tx))

    async def replace(self, member: str, conversation_id: str,
                      off: Iterable[str]) -> list[str]:
        """Make ``off`` the member's whole set of left-out names here; 422 for a name that
        is no level of the source tree, or too many."""
        chosen = sorted(set(off))
        if len(chosen) > MAX_CHOICES:
            raise SchemaViolation(f"At most {MAX_CHOICES} choices per conversation.",
                                  code="too_many_choices")
        wrong = [name for name in chosen if not is_source_name(name)]
        if wrong:
            raise SchemaViolation(
                f"{wrong[0][:80]!r} is not a source tool, a source or a source family; only "
                "those can be left out of a conversation.", code="not_a_source")
        async with self.store.transaction() as tx:
            await self.store.conversations.get_for(conversation_id, member, tx)
            await tx.session.execute(
                delete(m.ConversationToolChoice)
                .where(m.ConversationToolChoice.member == member,
                       m.ConversationToolChoice.conversation_id == conversation_id))
            now = utcnow()
            tx.session.add_all([m.ConversationToolChoice(
                member=member, conversation_id=conversation_id, tool=name, chosen_at=now)
                for name in chosen])
            await tx.audit(member, CHOICES_AUDIT_ACTION, {"off": chosen},
                           conversation_id=conversation_id)
        return chosen
