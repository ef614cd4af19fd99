"""Helpers for artifact tests: rooms, live runs, bundles."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.store import Store
from kaizen_server_extension.store.records import RunRecord
from kaizen_server_extension.store.runs import RunLane
from kaizen_server_extension.tools.services import ToolServices
from tests.support.services import tool_services


async def room(store: Store, owner: str = "alice", *, shared: bool = False,
               members: tuple[str, ...] = ()) -> str:
    await store.members.ensure(owner)
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=[])
    conversation = await store.conversations.create(owner, "general", "room", shared)
    for member in members:
        await store.conversations.add_participant(conversation.id, owner, member)
    return conversation.id


async def live_run(store: Store, conversation_id: str, member: str = "alice",
                   text: str = "go") -> RunRecord:
    """A claimed (running) run of ``member`` in the room, with its fence."""
    await store.inputs.accept(conversation_id, member, text, kind="message",
                              idempotency_key=None)
    run = await RunLane(store).claim_next(conversation_id, "test", timedelta(minutes=5))
    assert run is not None
    return run


def bundle_of(run: RunRecord) -> AuthorityBundle:
    return AuthorityBundle(run_id=run.id, conversation_id=run.conversation_id,
                           input_position=run.input_position, member=run.member,
                           agent_version_id="general@1", audience_version=1,
                           resource_digest="r", fence=run.fence)


class Ctx:
    """The tool context a run gives an implementation: its bundle and named services."""

    def __init__(self, bundle: AuthorityBundle,
                 services: Mapping[str, object] | ToolServices) -> None:
        self.bundle = bundle
        self.services = tool_services(services)

    @property
    def member(self) -> str:
        return self.bundle.member
