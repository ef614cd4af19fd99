"""Quarantine, then constrain, then validate (guardrails: Structured artifact output)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from kaizen_server_extension.store import create_engine, upgrade
from kaizen_server_extension.store.engine import sqlite_url_for
from tests.conftest import POSTGRES_URL, drop_schema, new_schema

LEGACY = ("INSERT INTO artifact_versions (id, artifact_id, version, kind, language, title, "
          "mime, content, digest, size, author, attestation, created_at) VALUES "
          "(:id, 'root', :version, 'code', :language, 'Legacy', 'application/json', :content, "
          "'d', 3, 'alice', :attestation, CURRENT_TIMESTAMP)")


@pytest.fixture
async def engine(backend: str, tmp_path: Path) -> AsyncIterator[tuple[AsyncEngine, str | None]]:
    schema = None if backend == "sqlite" else new_schema()
    url = sqlite_url_for(tmp_path / "m.db") if backend == "sqlite" else POSTGRES_URL
    eng = create_engine(url, schema=schema)
    try:
        yield eng, schema
    finally:
        await eng.dispose()
        if schema:
            await drop_schema(schema)


@pytest.mark.rule("R-129", "R-130")
async def test_legacy_reserved_rows_are_quarantined_before_the_constraint(
        engine: tuple[AsyncEngine, str | None]) -> None:
    eng, schema = engine
    await upgrade(eng, schema, revision="0004")
    async with eng.begin() as conn:
        await conn.execute(text("INSERT INTO members (id, display_name, approval_mode, "
                                "created_at) VALUES ('alice', 'alice', 'ask_for_writes', "
                                "CURRENT_TIMESTAMP)"))
        await conn.execute(text("INSERT INTO artifacts (id, owner, title, kind, "
                                "current_version, created_at, updated_at) VALUES ('root', "
                                "'alice', 'Legacy', 'code', 3, CURRENT_TIMESTAMP, "
                                "CURRENT_TIMESTAMP)"))
        # Pre-boundary rows: one claiming a (false) attestation, one without, one ordinary.
        for version, language, attestation in ((1, "renderable-artifact", "forged"),
                                               (2, "renderable-artifact", None),
                                               (3, "python", None)):
            await conn.execute(text(LEGACY), {"id": f"v{version}", "version": version,
                                              "language": language, "content": b"{}\n",
                                              "attestation": attestation})
    await upgrade(eng, schema)  # 0005 quarantine, 0006 constrain, 0007 validate
    async with eng.begin() as conn:
        rows = (await conn.execute(text(
            "SELECT id, version, kind, language, attestation, content, title, author "
            "FROM artifact_versions ORDER BY version"))).all()
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
        ("v1", 1, "code", "json", None), ("v2", 2, "code", "json", None),
        ("v3", 3, "code", "python", None)]
    # Exact content, identity, title and authorship are untouched.
    assert all(bytes(r[5]) == b"{}\n" and r[6] == "Legacy" and r[7] == "alice" for r in rows)
    # And now the constraint holds: an old replica's unmarked reserved row fails closed.
    with pytest.raises(IntegrityError):
        async with eng.begin() as conn:
            await conn.execute(text(LEGACY), {"id": "v4", "version": 4,
                                              "language": "renderable-artifact",
                                              "content": b"{}", "attestation": None})
    # The immutability trigger survived the table rebuild.
    with pytest.raises(Exception, match="immutable"):
        async with eng.begin() as conn:
            await conn.execute(text("UPDATE artifact_versions SET title = 'x'"))
    # Downgrading the quarantine is a no-op: nothing is promoted back to the reserved pair.
    await upgrade_down(eng, schema, "0004")
    async with eng.begin() as conn:
        languages = (await conn.execute(text(
            "SELECT language FROM artifact_versions ORDER BY version"))).scalars().all()
    assert languages == ["json", "json", "python"]


async def upgrade_down(eng: AsyncEngine, schema: str | None, revision: str) -> None:
    from alembic import command

    from kaizen_server_extension.store.engine import alembic_config

    cfg = alembic_config(eng.url.render_as_string(hide_password=False), schema)

    def _run(sync_conn: object) -> None:
        cfg.attributes["connection"] = sync_conn
        command.downgrade(cfg, revision)

    async with eng.begin() as conn:
        await conn.run_sync(_run)
