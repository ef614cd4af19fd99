"""The store's side of the pipeline: the live run row and the admin tool policy, read per call."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kaizen_server_extension.host.store_ports import StoreAuthority, StorePermissions
from kaizen_server_extension.protocol.authority import AuthorityBundle, AuthorityRejected
from kaizen_server_extension.store import Store
from kaizen_server_extension.store.runs import RunLane


async def _running(store: Store, shared: bool = False) -> AuthorityBundle:
    await store.members.ensure("alice")
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=["list_available_agents"])
    room = await store.conversations.create("alice", "general", "room", shared)
    await store.inputs.accept(room.id, "alice", "hi", kind="message", idempotency_key=None)
    run = await RunLane(store).claim_next(room.id, "test", timedelta(seconds=30))
    assert run is not None
    return AuthorityBundle(run.id, room.id, run.input_position, "alice", "general@1",
                           room.audience_version, "digest", run.fence)


@pytest.mark.rule("R-005", "R-204")
async def test_an_admin_revocation_bites_on_the_next_call(store: Store) -> None:
    bundle = await _running(store)
    authority, permissions = StoreAuthority(store, bundle), StorePermissions(store)
    await authority.verify(bundle)
    assert await permissions.allowed("alice", "run_code")
    await permissions.set_policy("run_code", "alice", False, admin="dave")
    await authority.verify(bundle)  # the next call reads the facts again
    assert not await permissions.allowed("alice", "run_code")
    assert await permissions.allowed("alice", "list_available_agents")


async def test_a_members_own_policy_row_overrides_the_everyone_row(store: Store) -> None:
    permissions = StorePermissions(store)
    await permissions.set_policy("run_code", "*", False, admin="dave")
    assert not await permissions.allowed("alice", "run_code")
    await permissions.set_policy("run_code", "alice", True, admin="dave")
    assert await permissions.allowed("alice", "run_code")
    assert not await permissions.allowed("bob", "run_code")


async def test_a_failing_jupyter_authorizer_denies(store: Store) -> None:
    permissions = StorePermissions(store, authorize=lambda member, tool: False)
    assert not await permissions.allowed("alice", "list_available_agents")


@pytest.mark.rule("R-007")
async def test_a_stale_fence_a_changed_audience_or_a_settled_run_is_rejected(
    store: Store,
) -> None:
    bundle = await _running(store, shared=True)
    authority = StoreAuthority(store, bundle)
    await authority.verify(bundle)

    await store.conversations.add_participant(bundle.conversation_id, "alice", "bob")
    with pytest.raises(AuthorityRejected) as roster:
        await authority.verify(bundle)
    assert roster.value.fields == ("audience_version",)

    await RunLane(store).settle(bundle.run_id, "cancelled", "test", "alice")
    with pytest.raises(AuthorityRejected) as settled:
        await authority.verify(bundle)
    assert "status" in settled.value.fields


async def test_a_bundle_that_differs_from_the_admitted_one_is_rejected(store: Store) -> None:
    bundle = await _running(store)
    authority = StoreAuthority(store, bundle)
    forged = AuthorityBundle(bundle.run_id, bundle.conversation_id, bundle.input_position,
                             "mallory", bundle.agent_version_id, bundle.audience_version,
                             bundle.resource_digest, bundle.fence)
    with pytest.raises(AuthorityRejected) as rejected:
        await authority.verify(forged)
    assert rejected.value.fields == ("member",)
