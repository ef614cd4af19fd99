"""Search over the member's prior conversations (``conversation_history_search``).

Only rooms the member is a participant of now, never the room asking (its own transcript is
already in context), newest first; a bounded scan and a bounded answer: at most
``MAX_SCANNED`` candidate messages are read and ``MAX_RESULTS`` returned, each an excerpt of
the message and of the answer its run committed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select

from kaizen_server_extension.document_text import query_terms
from kaizen_server_extension.protocol.errors import BadRequest
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.store import Store

MAX_RESULTS = 10
MAX_SCANNED = 200
MAX_EXCERPT_CHARS = 300
#: Only the first terms of a query are matched: each is one more LIKE over the scan.
MAX_HISTORY_TERMS = 8


@dataclass(frozen=True, slots=True)
class HistoryHit:
    conversation_id: str
    title: str
    position: int
    asked_by: str
    at: str
    message: str
    answer: str | None
    matched: int

    def public(self) -> dict[str, Any]:
        return {"conversation_id": self.conversation_id, "title": self.title,
                "position": self.position, "asked_by": self.asked_by, "at": self.at,
                "message": self.message, "answer": self.answer,
                "citation": f"[{self.title}, message {self.position}]"
                            f"(kaizen:conversation/{self.conversation_id}#position="
                            f"{self.position})"}


def _like(term: str) -> str:
    escaped = term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class HistorySearch:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def search(self, member: str, query: str, *, exclude: str | None = None,
                     limit: int = 5) -> list[HistoryHit]:
        terms = query_terms(query)[:MAX_HISTORY_TERMS]
        if not terms:
            raise BadRequest("The query holds no words to search for.", code="empty_query")
        limit = max(1, min(limit, MAX_RESULTS))
        text = m.AcceptedInput.text
        mine = select(m.Participant.conversation_id).where(m.Participant.member_id == member)
        query_rows = (
            select(m.AcceptedInput.id, m.AcceptedInput.conversation_id,
                   m.AcceptedInput.position, m.AcceptedInput.member, m.AcceptedInput.text,
                   m.AcceptedInput.created_at, m.Conversation.title)
            .join(m.Conversation, m.Conversation.id == m.AcceptedInput.conversation_id)
            .where(m.AcceptedInput.conversation_id.in_(mine),
                   or_(*(text.ilike(_like(t), escape="\\") for t in terms)))
            .order_by(m.AcceptedInput.created_at.desc(), m.AcceptedInput.id)
            .limit(MAX_SCANNED))
        if exclude is not None:
            query_rows = query_rows.where(m.AcceptedInput.conversation_id != exclude)
        async with self.store.transaction() as tx:
            rows = (await tx.session.execute(query_rows)).all()
            scored = sorted(
                rows, key=lambda r: -sum(t in r.text.lower() for t in terms))[:limit]
            answers: dict[str, str] = {}
            if scored:
                found = (await tx.session.execute(
                    select(m.Run.input_id, m.JournalEvent.data)
                    .join(m.JournalEvent, m.JournalEvent.run_id == m.Run.id)
                    .where(m.Run.input_id.in_([r.id for r in scored]),
                           m.JournalEvent.type == "answer.committed"))).all()
                for input_id, data in found:
                    answer = data.get("text") if isinstance(data, dict) else None
                    if isinstance(answer, str):
                        answers[input_id] = answer[:MAX_EXCERPT_CHARS]
        return [HistoryHit(r.conversation_id, r.title, int(r.position), r.member,
                           r.created_at.isoformat(), r.text[:MAX_EXCERPT_CHARS],
                           answers.get(r.id), sum(t in r.text.lower() for t in terms))
                for r in scored]
