"""Documents in the store on SQLite and PostgreSQL: versions, the owner ACL, room shares, and
search over the database's own full-text index, which a delete or unshare leaves at once."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text, update
from sqlalchemy.exc import DBAPIError

from kaizen_server_extension.agents import KnowledgeScope
from kaizen_server_extension.document_text import chunks, extract
from kaizen_server_extension.protocol.errors import BadRequest, NotFound
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.documents import DocumentStore

POLICY = (b"# Travel policy\n\nEconomy class is required for flights under six hours.\n\n"
          b"## Hotels\n\nHotels are booked through the portal.\n")
NOTES = b"Quarterly revenue grew by nine percent, driven by the aurora product line.\n"


async def _members(store: Store, *names: str) -> None:
    for name in names:
        await store.members.ensure(name)
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=[])


async def _room(store: Store, owner: str, *others: str) -> str:
    room = await store.conversations.create(owner, "general", "room", bool(others))
    for other in others:
        await store.conversations.add_participant(room.id, owner, other)
    return room.id


async def test_upload_chunks_and_search_cites_the_passage(store: Store) -> None:
    await _members(store, "alice")
    docs = DocumentStore(store)
    doc = await docs.upload("alice", "policy.md", POLICY)
    assert doc.current_version == 1
    assert doc.media_type == "text/markdown" and doc.chunks >= 1
    result = await docs.search("alice", "economy flights")
    assert result.searched == 1 and result.hits
    hit = result.hits[0]
    assert hit.document_id == doc.id and "Economy class" in hit.excerpt
    cited = hit.public()
    assert cited["chunk_id"] == hit.chunk_id and doc.id in cited["citation"]


async def test_a_new_version_replaces_what_search_finds(store: Store) -> None:
    await _members(store, "alice")
    docs = DocumentStore(store)
    doc = await docs.upload("alice", "notes.txt", NOTES)
    updated = await docs.add_version("alice", doc.id, "notes.txt",
                                     b"Revenue fell; the zephyr line was retired.\n")
    assert updated.current_version == 2
    assert not (await docs.search("alice", "aurora")).hits
    (hit,) = (await docs.search("alice", "zephyr")).hits
    assert hit.version == 2
    assert [v["version"] for v in await docs.versions("alice", doc.id)] == [1, 2]
    _, version, old = await docs.text_of("alice", doc.id, 1)
    assert version == 1 and "aurora" in old


async def test_another_member_cannot_read_search_version_share_or_delete(store: Store) -> None:
    await _members(store, "alice", "bob")
    docs = DocumentStore(store)
    doc = await docs.upload("alice", "notes.txt", NOTES)
    bob_room = await _room(store, "bob")
    assert (await docs.search("bob", "aurora")).searched == 0
    with pytest.raises(NotFound):
        await docs.get("bob", doc.id)
    with pytest.raises(NotFound):
        await docs.text_of("bob", doc.id)
    with pytest.raises(NotFound):
        await docs.add_version("bob", doc.id, "notes.txt", b"bob's words")
    with pytest.raises(NotFound):
        await docs.share("bob", doc.id, bob_room)
    with pytest.raises(NotFound):
        await docs.delete("bob", doc.id)
    # Naming it does not widen bob's search to it: the call fails, nothing is searched.
    with pytest.raises(NotFound):
        await docs.search("bob", "aurora", documents=[doc.id])
    assert (await docs.get("alice", doc.id)).current_version == 1


async def test_sharing_into_a_room_grants_its_participants_until_unshared(store: Store) -> None:
    await _members(store, "alice", "bob", "carol")
    docs = DocumentStore(store)
    doc = await docs.upload("alice", "notes.txt", NOTES)
    room = await _room(store, "alice", "bob")
    assert await docs.share("alice", doc.id, room) is True
    assert await docs.share("alice", doc.id, room) is False
    assert (await docs.search("bob", "aurora")).hits
    assert (await docs.get("bob", doc.id)).id == doc.id
    assert (await docs.search("carol", "aurora")).searched == 0
    # bob may read it but not manage it.
    with pytest.raises(NotFound):
        await docs.unshare("bob", doc.id, room)
    with pytest.raises(NotFound):
        await docs.delete("bob", doc.id)
    assert await docs.unshare("alice", doc.id, room) is True
    assert (await docs.search("bob", "aurora")).searched == 0
    with pytest.raises(NotFound):
        await docs.get("bob", doc.id)


async def test_sharing_needs_a_room_the_owner_is_in(store: Store) -> None:
    await _members(store, "alice", "bob")
    docs = DocumentStore(store)
    doc = await docs.upload("alice", "notes.txt", NOTES)
    bob_room = await _room(store, "bob")
    with pytest.raises(NotFound):
        await docs.share("alice", doc.id, bob_room)
    assert (await docs.search("bob", "aurora")).searched == 0


async def test_leaving_the_room_ends_access_through_its_share(store: Store) -> None:
    await _members(store, "alice", "bob")
    docs = DocumentStore(store)
    doc = await docs.upload("alice", "notes.txt", NOTES)
    room = await _room(store, "alice", "bob")
    await docs.share("alice", doc.id, room)
    await store.conversations.remove_participant(room, "alice", "bob")
    assert (await docs.search("bob", "aurora")).searched == 0


async def test_delete_removes_rows_and_index_entries(store: Store) -> None:
    await _members(store, "alice")
    docs = DocumentStore(store)
    doc = await docs.upload("alice", "notes.txt", NOTES)
    await docs.delete("alice", doc.id)
    assert (await docs.search("alice", "aurora")).searched == 0
    with pytest.raises(NotFound):
        await docs.get("alice", doc.id)
    async with store.transaction() as tx:
        left = (await tx.session.execute(
            text("SELECT count(*) FROM document_chunks"))).scalar_one()
        assert left == 0
        if tx.session.get_bind().dialect.name == "sqlite":
            # The FTS5 index forgot the rows too (its delete trigger ran on the cascade).
            hits = (await tx.session.execute(text(
                "SELECT count(*) FROM document_chunks_fts WHERE document_chunks_fts "
                "MATCH 'aurora'"))).scalar_one()
            assert hits == 0


async def test_in_a_shared_room_search_reaches_only_what_was_shared_there(store: Store) -> None:
    await _members(store, "alice", "bob")
    docs = DocumentStore(store)
    private = await docs.upload("alice", "private.txt", b"The aurora budget is secret.\n")
    shared = await docs.upload("alice", "shared.txt", b"The aurora launch is in May.\n")
    room = await _room(store, "alice", "bob")
    await docs.share("alice", shared.id, room)
    result = await docs.search("alice", "aurora", room=room)
    assert {h.document_id for h in result.hits} == {shared.id}
    private_room = await _room(store, "alice")
    result = await docs.search("alice", "aurora", room=private_room)
    assert {h.document_id for h in result.hits} == {shared.id, private.id}
    with pytest.raises(NotFound):
        await docs.passages("alice", private.id, room=room)


@pytest.mark.rule("R-002")
async def test_a_knowledge_scope_narrows_and_never_widens(store: Store) -> None:
    await _members(store, "alice", "bob")
    docs = DocumentStore(store)
    mine = await docs.upload("alice", "a.txt", b"aurora one\n")
    other = await docs.upload("alice", "b.txt", b"aurora two\n")
    bobs = await docs.upload("bob", "c.txt", b"aurora three\n")
    scope = KnowledgeScope(documents=frozenset({mine.id, bobs.id}))
    result = await docs.search("alice", "aurora", scope=scope)
    assert {h.document_id for h in result.hits} == {mine.id}
    with pytest.raises(NotFound):
        await docs.get("alice", other.id, scope=scope)
    with pytest.raises(NotFound):
        await docs.get("alice", bobs.id, scope=scope)


async def test_a_chunk_resolves_only_while_its_parent_is_readable_and_current(
        store: Store) -> None:
    await _members(store, "alice", "bob")
    docs = DocumentStore(store)
    doc = await docs.upload("alice", "notes.txt", NOTES)
    (hit,) = (await docs.search("alice", "aurora")).hits
    assert (await docs.resolve_chunk("alice", hit.chunk_id, room=None)).document_id == doc.id
    with pytest.raises(NotFound):
        await docs.resolve_chunk("bob", hit.chunk_id, room=None)
    with pytest.raises(NotFound):  # a document id is not a chunk id
        await docs.resolve_chunk("alice", doc.id, room=None)
    await docs.add_version("alice", doc.id, "notes.txt", b"new words\n")
    with pytest.raises(NotFound):
        await docs.resolve_chunk("alice", hit.chunk_id, room=None)


async def test_query_syntax_is_inert(store: Store) -> None:
    await _members(store, "alice")
    docs = DocumentStore(store)
    await docs.upload("alice", "notes.txt", NOTES)
    for query in ('aurora" OR "x', "aurora NEAR(x)", "aurora:* & !x", "body:aurora -x"):
        assert (await docs.search("alice", query)).hits
    with pytest.raises(BadRequest):
        await docs.search("alice", "!!! ???")


async def test_versions_and_chunks_are_immutable_in_the_database(store: Store) -> None:
    await _members(store, "alice")
    doc = await DocumentStore(store).upload("alice", "notes.txt", NOTES)
    for statement in (update(m.DocumentVersion).where(m.DocumentVersion.document_id == doc.id)
                      .values(text="forged"),
                      update(m.DocumentChunk).where(m.DocumentChunk.document_id == doc.id)
                      .values(body="forged")):
        with pytest.raises(DBAPIError):
            async with store.transaction() as tx:
                await tx.session.execute(statement)


def test_a_notebook_is_chunked_by_cell() -> None:
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "markdown", "metadata": {}, "id": "a", "source": "# Findings\nAurora."},
        {"cell_type": "code", "metadata": {}, "id": "b", "execution_count": None,
         "outputs": [], "source": ["import pandas\n", "df = pandas.read_csv('x')"]}]}
    extracted = extract("analysis.ipynb", json.dumps(notebook).encode())
    passages = chunks(extracted.segments)
    assert [p.locator for p in passages] == ["cell 1 (markdown), lines 1-2",
                                             "cell 2 (code), lines 1-2"]
    assert "read_csv" in passages[1].body


def test_long_text_is_cut_into_bounded_chunks() -> None:
    body = "\n".join(f"line {i} " + "word " * 30 for i in range(200)).encode()
    passages = chunks(extract("long.txt", body).segments)
    assert len(passages) > 10 and all(len(p.body) <= 1200 for p in passages)
    assert passages[0].locator.startswith("lines 1-")


def test_a_pdf_is_chunked_by_page() -> None:
    import io

    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer)
    for words in ("Falcon migration starts in March.", "Osprey nests are counted in May."):
        pdf.drawString(72, 720, words)
        pdf.showPage()
    pdf.save()
    extracted = extract("birds.pdf", buffer.getvalue())
    assert extracted.media_type == "application/pdf"
    passages = chunks(extracted.segments)
    assert [p.locator.split(",")[0] for p in passages] == ["page 1", "page 2"]
    assert "Osprey" in passages[1].body


def test_a_docx_is_read_paragraph_by_paragraph() -> None:
    import io

    import docx

    document = docx.Document()
    document.add_heading("Quarterly review", level=1)
    document.add_paragraph("The kestrel programme met its target.")
    buffer = io.BytesIO()
    document.save(buffer)
    extracted = extract("review.docx", buffer.getvalue())
    assert "kestrel programme" in extracted.text and "Quarterly review" in extracted.text


def test_without_pypdf_a_pdf_is_refused_and_nothing_else_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from kaizen_server_extension.protocol.errors import SchemaViolation

    monkeypatch.setitem(sys.modules, "pypdf", None)  # import pypdf now raises ImportError
    with pytest.raises(SchemaViolation) as refused:
        extract("birds.pdf", b"%PDF-1.4")
    assert refused.value.code == "document_type_unavailable"
    assert extract("notes.txt", NOTES).text.startswith("Quarterly")


def test_a_damaged_pdf_or_docx_is_refused() -> None:
    from kaizen_server_extension.protocol.errors import SchemaViolation

    for name in ("broken.pdf", "broken.docx"):
        with pytest.raises(SchemaViolation) as refused:
            extract(name, b"not really a file of that type")
        assert refused.value.code == "document_unreadable"
