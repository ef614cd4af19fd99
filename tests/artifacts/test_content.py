"""Governed renderable envelopes and typed graphs: validated before anything is written."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kaizen_plugins import artifacts as plugin

from kaizen_server_extension.store import Store
from kaizen_server_extension.store.artifacts.content import (
    GRAPH_CONTRACT,
    GraphInvalid,
    ValidationFailed,
    attest_trusted_result,
    canonical_json,
    validate_envelope,
    validate_graph,
)
from kaizen_server_extension.store.artifacts.edit import content_tag
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, WriteContext
from kaizen_server_extension.tools import MemberSafeError
from tests.artifacts.support import Ctx, bundle_of, live_run, room

ENVELOPE: dict[str, Any] = {
    "version": 2, "renderer": "table", "title": "Jobs", "text_fallback": "3 jobs ran",
    "markings": {"overall": "UNCLASSIFIED", "portions": {"rows": "U"}},
    "provenance": {"cluster": "c1", "job": "j-42"}, "result": {"rows": [[1, 2]]},
    "download": {"filename": "jobs.json", "media_type": "application/json"},
}


def _without(key: str) -> dict[str, Any]:
    return {k: v for k, v in ENVELOPE.items() if k != key}


@pytest.mark.rule("R-104", "R-105", "R-112", "R-115")
@pytest.mark.parametrize("envelope", [
    _without("markings"),
    {**ENVELOPE, "markings": {}},
    {**ENVELOPE, "markings": "UNCLASSIFIED"},            # never flattened
    {**ENVELOPE, "markings_error": "upstream failed"},
    _without("provenance"),
    {**ENVELOPE, "provenance": {"host": "x"}},
    {**ENVELOPE, "download": {"filename": "../../etc/passwd"}},
    {**ENVELOPE, "download": {"filename": "/tmp/x.json"}},
    {**ENVELOPE, "download": {"path": "x"}},
    {**ENVELOPE, "result_ref": {"id": "r1", "sha256": "0" * 64}},   # both result and ref
    {**_without("result"), "result_ref": {"id": "https://evil/x", "sha256": "0" * 64}},
    {**_without("result"), "result_ref": {"id": "r1", "sha256": "nope"}},
    {**ENVELOPE, "result": "x" * 300_000},
    {**ENVELOPE, "script": "<script>"},
    {**ENVELOPE, "version": 1},
    "not json",
    b"\xff\xfe",
    [ENVELOPE],
])
def test_envelopes_off_contract_fail_closed(envelope: Any) -> None:
    with pytest.raises(ValidationFailed):
        validate_envelope(envelope)


def test_an_opaque_result_ref_is_kept_inert() -> None:
    ref = {"id": "run:7", "sha256": "a" * 64}
    valid = validate_envelope({**_without("result"), "result_ref": ref})
    assert json.loads(valid.canonical)["result_ref"] == ref


@pytest.mark.rule("R-107", "R-116", "R-117", "R-118", "R-120")
async def test_governed_writes_need_the_attestation_and_keep_their_binding(
        store: Store) -> None:
    await store.members.ensure("alice")
    await store.members.ensure("bob")
    artifacts = ArtifactStore(store)
    envelope = validate_envelope(ENVELOPE)
    attestation = attest_trusted_result("call-1", envelope)
    # A marker minted for another call, or for other bytes, does not verify.
    other = validate_envelope({**ENVELOPE, "title": "Other"})
    for forged in (attest_trusted_result("call-2", other),
                   type(attestation)("call-1", attestation.digest, "kz-attest:v1:" + "0" * 48)):
        with pytest.raises(ValidationFailed):
            await artifacts.create_governed("alice", envelope, forged, where=WriteContext())
    made = await artifacts.create_governed("alice", envelope, attestation,
                                           where=WriteContext())
    assert made.governed and made.content == envelope.canonical
    assert made.content == canonical_json(ENVELOPE).encode()
    # Ordinary content cannot replace it, whoever asks.
    with pytest.raises(ValidationFailed):
        await artifacts.update("alice", made.artifact_id, content="{}", expected_version=1)
    # A governed update may not relabel provenance or markings...
    for changed in ({**ENVELOPE, "markings": {"overall": "SECRET"}},
                    {**ENVELOPE, "provenance": {"cluster": "c2"}}):
        relabel = validate_envelope(changed)
        with pytest.raises(ValidationFailed):
            await artifacts.update_governed("alice", made.artifact_id, relabel,
                                            attest_trusted_result("call-3", relabel),
                                            expected_version=1, where=WriteContext())
    # ...but a new result under the same binding is a new attested version.
    newer = validate_envelope({**ENVELOPE, "result": {"rows": [[3]]}})
    second = await artifacts.update_governed("alice", made.artifact_id, newer,
                                             attest_trusted_result("call-4", newer),
                                             expected_version=1, where=WriteContext())
    assert second.version == 2 and second.governed
    # A fork copies the exact stored bytes and language and keeps the marker.
    fork = await artifacts.fork("alice", made.artifact_id, where=WriteContext())
    assert fork.governed and fork.content == second.content
    assert fork.derived_from == made.artifact_id and fork.artifact_id != made.artifact_id
    with pytest.raises(ValidationFailed):  # and the fork is as locked as its source
        await artifacts.update("alice", fork.artifact_id, content="{}", expected_version=1)
    assert await artifacts.count_versions(made.artifact_id) == 2


@pytest.mark.rule("R-120")
async def test_a_room_collaborator_cannot_substitute_content_into_a_governed_copy(
        store: Store) -> None:
    shared = await room(store, "alice", shared=True, members=("bob",))
    artifacts = ArtifactStore(store)
    envelope = validate_envelope(ENVELOPE)
    made = await artifacts.create_governed("alice", envelope,
                                           attest_trusted_result("c", envelope),
                                           where=WriteContext(shared))
    run = await live_run(store, shared, "bob")
    bob = Ctx(bundle_of(run), {"artifacts": artifacts})
    text = made.text()
    with pytest.raises(MemberSafeError):
        await plugin.edit_artifact.impl(bob, artifact_id=made.artifact_id, version=1,
                                        tag=content_tag(text), edits="PUT 1.=1:\n+{}\n")
    with pytest.raises(MemberSafeError):
        await plugin.update_artifact.impl(bob, artifact_id=made.artifact_id, content="{}")
    assert await artifacts.list_for("bob") == []
    assert await artifacts.count_versions(made.artifact_id) == 1


GRAPH = {"nodes": [{"id": "a", "label": "A"}, {"id": "b", "label": "B", "type": "t"}],
         "edges": [{"id": "e1", "source": "a", "target": "b"}],
         "sources": [{"id": "s1", "title": "Paper"}],
         "references": [{"target": "e1", "source": "s1"}]}


def test_a_valid_graph_is_stored_canonically() -> None:
    assert json.loads(validate_graph(json.dumps(GRAPH))) == GRAPH


@pytest.mark.rule("R-459")
def test_a_rejected_graph_names_every_problem_and_the_whole_contract() -> None:
    aliased = {"nodes": [{"id": "a", "name": "A"}, {"id": "a", "label": "dup"}],
               "edges": [{"from": "a", "to": "b"}],
               "references": [{"target": "zz", "source": "s9"}], "meta": {}}
    with pytest.raises(GraphInvalid) as refused:
        validate_graph(json.dumps(aliased))
    message = refused.value.message
    for fragment in ("'name'", "not unique", "'from'", "'to'", "edges[0].source",
                     "references[0].target", "references[0].source", "'meta'"):
        assert fragment in message, fragment
    assert canonical_json(GRAPH_CONTRACT) in message


@pytest.mark.rule("R-458")
async def test_a_rejected_graph_is_neither_created_nor_revised(store: Store) -> None:
    conv = await room(store)
    run = await live_run(store, conv)
    ctx = Ctx(bundle_of(run), {"artifacts": ArtifactStore(store)})
    bad = json.dumps({"nodes": [{"id": "a", "label": "A"}],
                      "edges": [{"id": "e", "source": "a", "target": "missing"}]})
    with pytest.raises(MemberSafeError) as refused:
        await plugin.create_artifact.impl(ctx, title="G", kind="graph", content=bad)
    assert refused.value.code == "graph_invalid"
    assert await ArtifactStore(store).list_for("alice") == []
    made = await plugin.create_artifact.impl(ctx, title="G", kind="graph",
                                             content=json.dumps(GRAPH))
    with pytest.raises(MemberSafeError):
        await plugin.update_artifact.impl(ctx, artifact_id=made["artifact_id"], content=bad)
    latest = await ArtifactStore(store).resolve("alice", made["artifact_id"])
    assert latest.version == 1 and json.loads(latest.text()) == GRAPH
