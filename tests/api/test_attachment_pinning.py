"""Pinning attachments at acceptance, on both databases: only completed versions, the admitted
list bound into the bundle's resource digest, and the database's own refusal of a pin that
names no real version."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.host.bundle import resource_digest
from kaizen_server_extension.protocol.errors import NotFound
from kaizen_server_extension.resources import AdmittedResources
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.checkpoints import CheckpointScope, UpdateCheckpoints
from kaizen_server_extension.store.artifacts.drafts import DraftScope, DraftStore
from kaizen_server_extension.store.artifacts.repository import ArtifactStore
from kaizen_server_extension.store.attachments import AttachmentStore
from tests.artifacts.support import live_run, room


@pytest.mark.rule("R-449")
async def test_only_a_completed_version_is_pinned_never_a_checkpoint_or_draft(
        store: Store) -> None:
    conversation = await room(store)
    artifacts = ArtifactStore(store)
    done = await artifacts.create("alice", title="Plan", kind="markdown", content="# Plan\n")
    run = await live_run(store, conversation)
    # A streamed update is mid-way: its building checkpoint holds newer, unfinished text.
    scope = CheckpointScope("alice", conversation, run.id, "call-1")
    checkpoints = UpdateCheckpoints(store, artifacts)
    opened = await checkpoints.open(scope, done.artifact_id)
    await checkpoints.advance(scope, opened.checkpoint_id, opened.fence,
                              '{"content": "# Plan, half writ')
    draft = await DraftStore(store, artifacts).begin(
        DraftScope("alice", conversation, run.id, run.fence), title="Draft", kind="markdown",
        language=None)

    accepted = await store.inputs.accept(conversation, "alice", "read it", kind="message",
                                         idempotency_key=None,
                                         attachments=(done.artifact_id,))
    pinned = await AttachmentStore(store).for_input(accepted.input_id)
    assert [(r.reference_id, r.version, r.sha256, r.size) for r in pinned.resources] == [
        (done.artifact_id, 1, hashlib.sha256(b"# Plan\n").hexdigest(), len(b"# Plan\n"))]
    # Neither the checkpoint's nor the draft's id is an attachable artifact.
    for not_an_artifact in (opened.checkpoint_id, draft.draft_id):
        before = await store.inputs.count(conversation)
        with pytest.raises(NotFound):
            await store.inputs.accept(conversation, "alice", "read it", kind="message",
                                      idempotency_key=None, attachments=(not_an_artifact,))
        assert await store.inputs.count(conversation) == before


async def test_the_database_refuses_a_pin_without_a_real_version(store: Store) -> None:
    conversation = await room(store)
    made = await ArtifactStore(store).create("alice", title="T", kind="markdown",
                                             content="x\n")
    accepted = await store.inputs.accept(conversation, "alice", "hi", kind="message",
                                         idempotency_key=None)
    for version, ordinal in ((2, 0), (1, 8)):  # no such version; past the bound
        with pytest.raises(IntegrityError):
            async with store.transaction() as tx:
                tx.session.add(m.InputAttachment(
                    input_id=accepted.input_id, ordinal=ordinal,
                    artifact_id=made.artifact_id, version=version, kind="artifact",
                    digest=made.digest, size=made.size, filename="t.md",
                    media_type="text/markdown"))
                await tx.session.flush()


async def test_a_changed_resource_list_is_a_different_bundle(store: Store) -> None:
    conversation_id = await room(store)
    artifacts = ArtifactStore(store)
    first = await artifacts.create("alice", title="A", kind="markdown", content="a\n")
    second = await artifacts.create("alice", title="B", kind="markdown", content="b\n")
    conversation = await store.runs.conversation_of(conversation_id)
    agent = await store.agents.get_visible("general", "alice")
    assert agent is not None
    digests = set()
    for attached in ((), (first.artifact_id,), (second.artifact_id,),
                     (first.artifact_id, second.artifact_id)):
        accepted = await store.inputs.accept(conversation_id, "alice", "go", kind="message",
                                             idempotency_key=None, attachments=attached)
        admitted = await AttachmentStore(store).for_input(accepted.input_id)
        assert isinstance(admitted, AdmittedResources)
        digests.add(resource_digest(conversation, agent, "catalog", admitted))
    assert len(digests) == 4
