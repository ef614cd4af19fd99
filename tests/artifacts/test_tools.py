"""create/update/read/edit_artifact as the member, with every refusal tried."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from kaizen_plugins import artifacts as plugin
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.protocol.errors import Conflict
from kaizen_server_extension.protocol.tools import WriteCategory
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.edit import content_tag
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, WriteContext
from kaizen_server_extension.tools import MemberSafeError
from kaizen_server_extension.tools.schema import validate_arguments
from tests.artifacts.support import Ctx, bundle_of, live_run, room


async def _ctx(store: Store, member: str = "alice", *, conv: str | None = None,
               **services: Any) -> Ctx:
    conv = conv or await room(store, member)
    run = await live_run(store, conv, member)
    return Ctx(bundle_of(run), {"artifacts": ArtifactStore(store), **services})


async def _refused(call: Any, code: str) -> MemberSafeError:
    with pytest.raises(MemberSafeError) as refused:
        await call
    assert refused.value.code == code, refused.value
    assert "nothing was saved" in str(refused.value).lower() or code in (
        "artifact_not_text", "invalid_window", "artifact_not_found")
    return refused.value


async def test_create_stores_version_one_and_journals_it_in_the_run(store: Store) -> None:
    ctx = await _ctx(store)
    result = await plugin.create_artifact.impl(ctx, title="Report", kind="markdown",
                                               content="# Q3\n\nGood.\n")
    assert result["version"] == 1 and result["total_lines"] == 3
    assert result["tag"] == content_tag("# Q3\n\nGood.\n")
    events = [e for e in await store.journal.read(ctx.bundle.conversation_id, "alice")
              if e.type == "artifact.version"]
    assert [(e.data["artifact_id"], e.run_id) for e in events] == [
        (result["artifact_id"], ctx.bundle.run_id)]


def test_write_tools_declare_the_member_store_category_and_create_dedupes() -> None:
    for registered in plugin.TOOLS:
        d = registered.descriptor
        if d.name == "read_artifact":
            assert d.capability.value == "read" and d.write_category is WriteCategory.NONE
        else:
            assert d.write_category is WriteCategory.MEMBER_STORE
        assert d.repeat_creates_object is (d.name == "create_artifact")


@pytest.mark.rule("R-450")
@pytest.mark.parametrize("title", ["Deck.pptx", "budget.XLSX", "Report.docx "])
async def test_native_office_titles_are_redirected_to_run_code(store: Store,
                                                               title: str) -> None:
    ctx = await _ctx(store)
    refused = await _refused(plugin.create_artifact.impl(ctx, title=title, kind="markdown",
                                                         content="x"),
                             "native_file_needs_run_code")
    assert "run_code" in str(refused)
    assert await ArtifactStore(store).list_for("alice") == []


@pytest.mark.rule("R-106")
async def test_direct_calls_cannot_use_the_reserved_language(store: Store) -> None:
    ctx = await _ctx(store)
    await _refused(plugin.create_artifact.impl(ctx, title="t", kind="code", content="{}",
                                               language="renderable-artifact"),
                   "reserved_artifact_language")
    made = await plugin.create_artifact.impl(ctx, title="t", kind="code", content="{}",
                                             language="json")
    await _refused(plugin.update_artifact.impl(ctx, artifact_id=made["artifact_id"],
                                               content="{}", language="renderable-artifact"),
                   "reserved_artifact_language")
    await _refused(plugin.begin_artifact.impl(ctx, title="t", kind="code",
                                              language="renderable-artifact"),
                   "reserved_artifact_language")
    assert await ArtifactStore(store).count_versions(made["artifact_id"]) == 1


@pytest.mark.rule("R-243", "R-254")
async def test_explicit_id_wins_over_the_focused_artifact(store: Store) -> None:
    ctx = await _ctx(store)
    a = await plugin.create_artifact.impl(ctx, title="A", kind="markdown", content="a")
    b = await plugin.create_artifact.impl(ctx, title="B", kind="markdown", content="b")
    ctx.services = replace(ctx.services, focused_artifact=b["artifact_id"])
    updated = await plugin.update_artifact.impl(ctx, artifact_id=a["artifact_id"],
                                                content="a2")
    assert updated["artifact_id"] == a["artifact_id"] and updated["version"] == 2
    artifacts = ArtifactStore(store)
    assert (await artifacts.resolve("alice", b["artifact_id"])).version == 1
    # Without an id the focused artifact is the fallback...
    fallback = await plugin.update_artifact.impl(ctx, content="b2")
    assert fallback["artifact_id"] == b["artifact_id"]
    # ...and with neither, nothing is guessed.
    ctx.services = replace(ctx.services, focused_artifact=None)
    await _refused(plugin.update_artifact.impl(ctx, content="?"), "artifact_id_required")
    # A foreign or missing root fails closed, with one answer for both.
    bob = await _ctx(store, "bob")
    for target in (a["artifact_id"], "0" * 32):
        await _refused(plugin.update_artifact.impl(bob, artifact_id=target, content="x"),
                       "artifact_not_found")
    assert await artifacts.count_versions(a["artifact_id"]) == 2


async def test_update_with_a_stale_expected_version_saves_nothing(store: Store) -> None:
    ctx = await _ctx(store)
    a = await plugin.create_artifact.impl(ctx, title="A", kind="markdown", content="a")
    await plugin.update_artifact.impl(ctx, artifact_id=a["artifact_id"], content="a2",
                                      expected_version=1)
    await _refused(plugin.update_artifact.impl(ctx, artifact_id=a["artifact_id"],
                                               content="a3", expected_version=1),
                   "version_conflict")


@pytest.mark.rule("R-160")
async def test_read_returns_a_bounded_numbered_window_with_version_digest_and_tag(
        store: Store) -> None:
    ctx = await _ctx(store)
    text = "".join(f"line {n}\n" for n in range(1, 1001))
    made = await plugin.create_artifact.impl(ctx, title="Long", kind="code", content=text,
                                             language="text")
    read = await plugin.read_artifact.impl(ctx, artifact_id=made["artifact_id"])
    tag = content_tag(text)
    rows = read["text"].split("\n")
    assert rows[0] == f"[artifact#{tag}]" and rows[1] == "1:line 1"
    assert len(rows) == 1 + 400 and rows[-1] == "400:line 400"
    assert (read["version"], read["total_lines"], read["tag"], read["more"]) == (
        1, 1000, tag, True)
    assert read["digest"] == made["digest"]
    tail = await plugin.read_artifact.impl(ctx, artifact_id=made["artifact_id"],
                                           start_line=901, line_count=400)
    assert (tail["start_line"], tail["end_line"], tail["more"]) == (901, 1000, False)
    arguments = json.dumps({"artifact_id": made["artifact_id"], "line_count": 401})
    with pytest.raises(MemberSafeError):
        validate_arguments(plugin.read_artifact.descriptor, arguments)
    await _refused(plugin.read_artifact.impl(ctx, artifact_id=made["artifact_id"],
                                             start_line=1001), "invalid_window")


BASE = "".join(f"{n}\n" for n in range(1, 11))


async def _edit(ctx: Ctx, artifact_id: str, edits: str, *, version: int = 1,
                tag: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = await plugin.edit_artifact.impl(
        ctx, artifact_id=artifact_id, version=version, tag=tag or content_tag(BASE),
        edits=edits)
    return result


@pytest.mark.rule("R-161")
async def test_edit_applies_hunks_bottom_up_against_the_displayed_base(store: Store) -> None:
    ctx = await _ctx(store)
    made = await plugin.create_artifact.impl(ctx, title="n", kind="code", content=BASE)
    tag = content_tag(BASE)
    result = await _edit(ctx, made["artifact_id"],
                         f"[artifact#{tag}]\nPUT 2.=3:\n+two\n+three\n+three and a half\n"
                         "CUT 5.=6\nPUT 10.=10:\n+ten\n")
    assert result["version"] == 2 and result["hunks"] == 3
    latest = await ArtifactStore(store).resolve("alice", made["artifact_id"])
    assert latest.text() == "1\ntwo\nthree\nthree and a half\n4\n7\n8\n9\nten\n"


@pytest.mark.rule("R-092", "R-161", "R-162")
async def test_every_bad_edit_is_refused_and_saves_nothing(store: Store) -> None:
    ctx = await _ctx(store)
    made = await plugin.create_artifact.impl(ctx, title="n", kind="code", content=BASE)
    aid = made["artifact_id"]
    too_many = "".join(f"CUT {n}.={n}\n" for n in range(1, 11)) * 4  # 40 hunks
    cases = [
        ("PUT 2.=4:\n+x\nCUT 4.=5\n", "invalid_edit"),            # overlap
        ("PUT 3.=3:\n+x\nPUT 3.=3:\n+y\n", "invalid_edit"),         # same line twice
        ("CUT 9.=11\n", "invalid_edit"),                            # out of range
        ("CUT 5.=4\n", "invalid_edit"),                             # backwards
        ("PUT 2.=3:\n", "invalid_edit"),                            # PUT without rows
        ("PUT >3:\n+gap\n", "invalid_edit"),                        # not a ranged hunk
        ("REM\n", "invalid_edit"),
        ("[artifact#0000]\nCUT 1.=1\n", "invalid_edit"),            # header tag mismatch
        ("hello\n", "invalid_edit"),
        (too_many, "invalid_edit"),                                 # > 32 hunks
    ]
    for edits, code in cases:
        await _refused(_edit(ctx, aid, edits), code)
    await _refused(_edit(ctx, aid, "CUT 1.=1\n", version=2), "stale_version")
    await _refused(_edit(ctx, aid, "CUT 1.=1\n", tag="ABCD"), "stale_version")
    assert await ArtifactStore(store).count_versions(aid) == 1
    # 32 hunks is the bound, and it is accepted.
    ok = await _edit(ctx, aid, "".join(f"PUT {n}.={n}:\n+#{n}\n" for n in range(1, 11)))
    assert ok["version"] == 2


@pytest.mark.rule("R-093")
async def test_two_edits_of_one_version_one_wins_the_other_saves_nothing(
        store: Store) -> None:
    ctx = await _ctx(store)
    made = await plugin.create_artifact.impl(ctx, title="n", kind="code", content=BASE)
    results = await asyncio.gather(_edit(ctx, made["artifact_id"], "CUT 1.=1\n"),
                                   _edit(ctx, made["artifact_id"], "CUT 2.=2\n"),
                                   return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["MemberSafeError", "dict"]
    assert await ArtifactStore(store).versions("alice", made["artifact_id"]) == [1, 2]


@pytest.mark.rule("R-090", "R-091")
async def test_editing_a_room_version_remixes_and_never_touches_the_creators_root(
        store: Store) -> None:
    shared = await room(store, "alice", shared=True, members=("bob",))
    artifacts = ArtifactStore(store)
    original = await artifacts.create("alice", title="Plan", kind="code", content=BASE,
                                      where=WriteContext(shared))
    private = await artifacts.create("alice", title="Mine", kind="code", content=BASE)
    bob = await _ctx(store, "bob", conv=shared)
    read = await plugin.read_artifact.impl(bob, artifact_id=original.artifact_id)
    assert read["version"] == 1
    remix = await _edit(bob, original.artifact_id, "CUT 1.=9\n")
    assert remix["remixed_from"] == original.artifact_id
    assert remix["artifact_id"] != original.artifact_id
    mine = await artifacts.resolve("bob", remix["artifact_id"])
    assert mine.owner == "bob" and mine.text() == "10\n"
    assert mine.derived_from == original.artifact_id
    assert (await artifacts.resolve("alice", original.artifact_id)).text() == BASE
    assert await artifacts.count_versions(original.artifact_id) == 1
    # Not bound to this room: not readable, not editable.
    await _refused(plugin.read_artifact.impl(bob, artifact_id=private.artifact_id),
                   "artifact_not_found")
    await _refused(_edit(bob, private.artifact_id, "CUT 1.=1\n"), "artifact_not_found")
    # bob's other room is not the exact reference either.
    elsewhere = await _ctx(store, "bob")
    await _refused(plugin.read_artifact.impl(elsewhere, artifact_id=original.artifact_id),
                   "artifact_not_found")


async def test_graph_and_json_validators_refuse_before_anything_is_written(
        store: Store) -> None:
    ctx = await _ctx(store)
    await _refused(plugin.create_artifact.impl(ctx, title="j", kind="json", content="{"),
                   "validation_failed")
    assert await ArtifactStore(store).list_for("alice") == []


@pytest.mark.rule("R-164")
async def test_a_room_version_yields_one_remix_and_a_second_is_refused(store: Store) -> None:
    shared = await room(store, "alice", shared=True, members=("bob",))
    artifacts = ArtifactStore(store)
    original = await artifacts.create("alice", title="Plan", kind="code", content=BASE,
                                      where=WriteContext(shared))
    bob = await _ctx(store, "bob", conv=shared)
    remix = await _edit(bob, original.artifact_id, "CUT 1.=1\n")
    again = await _refused(_edit(bob, original.artifact_id, "CUT 2.=2\n"), "already_derived")
    assert remix["artifact_id"] in str(again)  # the refusal names bob's one copy
    bobs = await artifacts.list_for("bob")
    assert [r.artifact_id for r in bobs if r.derived_from == original.artifact_id] == [
        remix["artifact_id"]]
    assert (await artifacts.resolve("alice", original.artifact_id)).text() == BASE
    assert await artifacts.count_versions(original.artifact_id) == 1
    # The store refuses a second copy the same way, and the database is the authority even
    # when the Python check is skipped.
    with pytest.raises(Conflict):
        await artifacts.create("bob", title="Plan", kind="code", content="x\n",
                               derived_from=(original.artifact_id, 1))
    with pytest.raises(IntegrityError):
        async with store.transaction() as tx:
            now = datetime.now(UTC)
            tx.session.add(m.Artifact(id="forged", owner="bob", title="Plan", kind="code",
                                      derived_from=original.artifact_id, derived_version=1,
                                      current_version=1, created_at=now, updated_at=now))
    # A different source version may still be remixed once.
    await artifacts.update("alice", original.artifact_id, content="1\n2\n",
                           expected_version=1, where=WriteContext(shared))
    second = await plugin.edit_artifact.impl(bob, artifact_id=original.artifact_id, version=2,
                                             tag=content_tag("1\n2\n"), edits="CUT 1.=1\n")
    assert second["remixed_from"] == original.artifact_id
    assert second["artifact_id"] != remix["artifact_id"]


@pytest.mark.rule("R-232")
async def test_a_retained_run_code_file_stays_an_opaque_native_artifact(store: Store) -> None:
    ctx = await _ctx(store)
    artifacts = ArtifactStore(store)
    docx = b"PK\x03\x04 not really a docx, but bytes all the same"
    mime = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    record, _reused = await artifacts.persist_file(
        "alice", ctx.bundle.conversation_id, ctx.bundle.run_id, "report.docx", docx, mime)
    aid = record.artifact_id
    await _refused(plugin.read_artifact.impl(ctx, artifact_id=aid), "artifact_not_text")
    await _refused(plugin.edit_artifact.impl(ctx, artifact_id=aid, version=1, tag="0000",
                                             edits="PUT 1.=1:\n+hello text"),
                   "artifact_not_text")
    await _refused(plugin.update_artifact.impl(ctx, content="hello text", artifact_id=aid),
                   "artifact_not_text")
    after = await artifacts.resolve("alice", aid)
    assert (after.kind, after.mime, after.version, after.content) == ("file", mime, 1, docx)


@pytest.mark.rule("R-179")
def test_create_artifact_says_an_explicit_request_overrides_keeping_answers_in_chat() -> None:
    # The size heuristic and its override are one description the model reads with the tool.
    text = " ".join(plugin.create_artifact.descriptor.description.split())
    assert "Keep short answers in chat by default" in text
    assert ("when the member explicitly asks you to create, make, build or write a report, "
            "document, page, diagram or other artifact, gather what you need and then create "
            "it even if it is short") in text
    # And native office files are not this tool's (run_code writes them, R-246).
    assert "Native Word, PowerPoint, Excel or PDF files are not artifacts: make them with " \
           "run_code" in text
