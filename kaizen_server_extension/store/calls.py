"""A tool call's own records: the facts its checks read at call time, and its audit row.

``open_call`` is the first of a call's two transactions (it journals ``tool.requested`` with
it, host/run_host.py): one statement checks the run is still ours and reads what the call's
checks re-resolve. The audit row is held by the host and written in the second, with
``tool.settled``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    String,
    bindparam,
    func,
    literal,
    literal_column,
    or_,
    select,
    update,
)

from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import audit_insert
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.store.units import Unit, fetch

log = logging.getLogger("kaizen.tools.audit")


@dataclass(frozen=True, slots=True)
class CallFacts:
    """What one tool call's checks read at call time, in one transaction: the one that
    journals its ``tool.requested`` (``open_call``), or else its authority check's own."""

    run_id: str
    member: str
    status: str
    fence: int
    audience_version: int
    approval_mode: str
    # (tool, member or "*") -> allowed
    policies: Mapping[tuple[str, str], bool]
    # The room's roster is exactly the initiating member (actor-private tools, R-218).
    only_initiator: bool
    # The tools whose policy rows were read; None when every tool's were.
    policy_tools: frozenset[str] | None = None
    # "Allow for this conversation" of the run's member, for the tools read (open_call reads
    # the called tool's); None when these facts read no grant.
    grants: Mapping[str, bool] | None = None
    # The approval that made each grant read (absent once that approval row is gone).
    grant_approvals: Mapping[str, str] | None = None

    def allowed(self, tool: str) -> bool | None:
        """The admin policy for ``tool``, or None when these facts did not read it."""
        if self.policy_tools is not None and tool not in self.policy_tools:
            return None
        # The member's own row overrides the everyone row; no row allows.
        own = self.policies.get((tool, self.member))
        if own is not None:
            return own
        return self.policies.get((tool, "*"), True)

    def granted(self, tool: str) -> bool | None:
        """Whether the member allowed ``tool`` for the run's conversation, or None when these
        facts did not read it (then only an approval answers the gate)."""
        return None if self.grants is None else self.grants.get(tool)

    def grant_approval(self, tool: str) -> str | None:
        """The approval decision that made the grant of ``tool`` these facts read, if any."""
        return None if self.grant_approvals is None else self.grant_approvals.get(tool)


_RUNS = m.Base.metadata.tables[m.Run.__tablename__]
_CONVERSATIONS = m.Base.metadata.tables[m.Conversation.__tablename__]
_MEMBERS = m.Base.metadata.tables[m.Member.__tablename__]
_PARTICIPANTS = m.Base.metadata.tables[m.Participant.__tablename__]
_POLICIES = m.Base.metadata.tables[m.ToolPolicy.__tablename__]
_GRANTS = m.Base.metadata.tables[m.ConversationToolGrant.__tablename__]


def _roster_counts(conversation: Any, member: Any) -> tuple[Any, Any]:
    """(participants of the run's room, of whom the run's member) as scalar subqueries."""
    everyone = (select(func.count()).select_from(_PARTICIPANTS)
                .where(_PARTICIPANTS.c.conversation_id == conversation)
                .correlate_except(_PARTICIPANTS).scalar_subquery())
    own = (select(func.count()).select_from(_PARTICIPANTS)
           .where(_PARTICIPANTS.c.conversation_id == conversation,
                  _PARTICIPANTS.c.member_id == member)
           .correlate_except(_PARTICIPANTS).scalar_subquery())
    return everyone, own


def _policy_of(member: Any) -> Any:
    return (select(_POLICIES.c.allowed)
            .where(_POLICIES.c.tool == bindparam("b_tool"), _POLICIES.c.member == member)
            .correlate_except(_POLICIES).scalar_subquery())


# What a grant row reads as when the approval that made it is gone (SET NULL): still a grant.
_GRANT_WITHOUT_APPROVAL = ""


def _grant_of(member: Any, conversation: Any) -> Any:
    """``member``'s grant of the called tool for ``conversation`` as a scalar subquery: NULL
    when there is none (the primary key is exactly this triple, so at most one row), else the
    id of the approval that made it, or ``_GRANT_WITHOUT_APPROVAL`` once that is gone."""
    return (select(func.coalesce(_GRANTS.c.approval_id,
                                 literal(_GRANT_WITHOUT_APPROVAL, String())))
            .where(_GRANTS.c.member == member, _GRANTS.c.conversation_id == conversation,
                   _GRANTS.c.tool == bindparam("b_tool"))
            .correlate_except(_GRANTS).scalar_subquery())


# SQLite renders RETURNING columns unqualified, and inside a subquery an unqualified
# ``member`` or ``conversation_id`` would name the inner table's own column; the updated row's
# columns are therefore spelled out with their table.
_RUN_CONVERSATION: ColumnElement[str] = literal_column("runs.conversation_id", String())
_RUN_MEMBER: ColumnElement[str] = literal_column("runs.member", String())

# The run's facts and every admin policy row of its member (or everyone), in one statement:
# one row per policy row, or one row with NULL policy columns when there is none. The write
# guard re-reads these immediately before a write executes, so a round trip counts.
_READ_FACTS = (
    select(_RUNS.c.status, _RUNS.c.fence, _RUNS.c.member, _CONVERSATIONS.c.audience_version,
           _MEMBERS.c.approval_mode, *_roster_counts(_RUNS.c.conversation_id, _RUNS.c.member),
           _POLICIES.c.tool, _POLICIES.c.member, _POLICIES.c.allowed)
    .join_from(_RUNS, _CONVERSATIONS, _CONVERSATIONS.c.id == _RUNS.c.conversation_id)
    .join(_MEMBERS, _MEMBERS.c.id == _RUNS.c.member)
    .outerjoin(_POLICIES, or_(_POLICIES.c.member == _RUNS.c.member,
                              _POLICIES.c.member == literal("*")))
    .where(_RUNS.c.id == bindparam("b_run_id"))
)

# A tool call's opening: the run must still be ours (active, same fence: the UPDATE also locks
# the row on PostgreSQL, so a cancel cannot slip in before the journal write in the same
# transaction), its tool-call count goes up, and what the call's checks need comes back with
# it, for the one tool called — its admin policy and the member's "allow for this
# conversation" grant included. One statement instead of a liveness check plus reads.
_OPEN_CALL = (
    update(_RUNS)
    .where(_RUNS.c.id == bindparam("b_run_id"), _RUNS.c.fence == bindparam("b_fence"),
           # Plain comparisons, not IN: no per-execution re-rendering of the SQL text.
           or_(*(_RUNS.c.status == status for status in m.ACTIVE_RUN_STATUSES)))
    .values(tool_calls=_RUNS.c.tool_calls + 1)
    .returning(
        _RUNS.c.conversation_id, _RUNS.c.status, _RUNS.c.fence, _RUNS.c.member,
        select(_CONVERSATIONS.c.audience_version)
        .where(_CONVERSATIONS.c.id == _RUN_CONVERSATION).scalar_subquery(),
        select(_MEMBERS.c.approval_mode).where(_MEMBERS.c.id == _RUN_MEMBER).scalar_subquery(),
        *_roster_counts(_RUN_CONVERSATION, _RUN_MEMBER),
        _policy_of(_RUN_MEMBER),
        _policy_of(literal("*")),
        # The run's own member and room: a grant never answers for another.
        _grant_of(_RUN_MEMBER, _RUN_CONVERSATION),
    )
)


def call_facts(run_id: str) -> Unit[CallFacts | None]:
    """The run's facts and every admin policy row of its member (or everyone)."""
    rows = yield from fetch(_READ_FACTS, {"b_run_id": run_id})
    if not rows:
        return None
    status, fence, member, audience, mode, participants, own = rows[0][:7]
    policies = {(tool, who): bool(allowed) for *_facts, tool, who, allowed in rows
                if tool is not None}
    return CallFacts(run_id, member, status, fence, audience, mode, policies,
                     only_initiator=participants == 1 and own == 1)


async def read_call_facts(store: Store, run_id: str) -> CallFacts | None:
    return await store.run(call_facts(run_id), write=False)


def open_call(run_id: str, fence: int, tool: str) -> Unit[tuple[str, CallFacts] | None]:
    """(conversation id, the call's facts) while the run is still ours at ``fence``,
    counting the call; None when it is not (nothing is changed)."""
    rows = yield from fetch(_OPEN_CALL, {"b_run_id": run_id, "b_fence": fence,
                                         "b_tool": tool})
    if not rows:
        return None
    return call_facts_of(run_id, tool, tuple(rows[0]))


def call_facts_of(run_id: str, tool: str, row: tuple[Any, ...]) -> tuple[str, CallFacts]:
    """(conversation id, facts) from the row ``_OPEN_CALL`` returns."""
    (conversation, status, run_fence, member, audience, mode, participants, own,
     own_policy, everyone_policy, grant) = row
    policies: dict[tuple[str, str], bool] = {}
    if own_policy is not None:
        policies[(tool, member)] = bool(own_policy)
    if everyone_policy is not None:
        policies[(tool, "*")] = bool(everyone_policy)
    return str(conversation), CallFacts(
        run_id, member, status, run_fence, audience, mode, policies,
        only_initiator=participants == 1 and own == 1, policy_tools=frozenset({tool}),
        grants={tool: grant is not None},
        grant_approvals={tool: str(grant)} if grant else {})


@dataclass
class HeldAudit:
    """A tool call's audit row, held for the transaction that journals its settlement."""

    actor: str
    data: dict[str, Any]
    conversation_id: str
    run_id: str

    def unit(self) -> Unit[None]:
        return audit_insert(self.actor, "tool.call", self.data,
                            conversation_id=self.conversation_id, run_id=self.run_id)


def audit_rows(rows: list[HeldAudit]) -> Unit[None]:
    for row in rows:
        yield from row.unit()


async def write_audit_rows(store: Store, rows: list[HeldAudit]) -> None:
    """Held audit rows in their own transaction, when no settlement carries them. Never
    raises: the call already happened, so a failing audit is reported, not propagated."""
    if not rows:
        return
    try:
        await store.run(audit_rows(rows))
    except Exception:
        log.exception("could not write the audit rows of tool call(s) in run %s",
                      rows[0].run_id)
