"""The start-up check that skips Alembic reads the migration files as Alembic does."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from kaizen_server_extension.store import Store
from kaizen_server_extension.store.engine import alembic_config, shipped_revisions, upgrade


def test_shipped_revisions_are_alembics_heads_and_revisions() -> None:
    scripts = ScriptDirectory.from_config(alembic_config("sqlite://"))
    heads, revisions = shipped_revisions()
    assert heads == frozenset(scripts.get_heads())
    assert revisions == frozenset(r.revision for r in scripts.walk_revisions())


async def test_upgrading_a_database_at_the_heads_again_changes_nothing(store: Store) -> None:
    from kaizen_server_extension.store.health import schema_revision

    before = await store.run(schema_revision(), write=False)
    await upgrade(store.engine)  # at the heads: returns without running Alembic
    assert await store.run(schema_revision(), write=False) == before
    assert {before} == set(shipped_revisions()[0])
