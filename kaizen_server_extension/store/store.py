"""The durable store: the transaction core with its repositories, what the server passes around.

``Store(engine)`` is a :class:`~kaizen_server_extension.store.core.Database` whose
repositories (``store.members``, ``store.agents``, ``store.conversations``, ``store.journal``,
``store.inputs``, ``store.runs``) share it.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from kaizen_server_extension.store.core import Database
from kaizen_server_extension.store.repositories import (
    AgentRepository,
    ConversationRepository,
    InputRepository,
    JournalRepository,
    MemberRepository,
    RunRepository,
)


class Store(Database):
    """The database and its repositories."""

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self.members = MemberRepository(self)
        self.agents = AgentRepository(self)
        self.conversations = ConversationRepository(self)
        self.journal = JournalRepository(self)
        self.inputs = InputRepository(self)
        self.runs = RunRepository(self)

    async def dispose(self) -> None:
        await self.inputs.close()  # acceptances under way finish first
        await super().dispose()
