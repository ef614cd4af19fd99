"""Alembic environment: runs over a connection handed in by ``store.engine.upgrade``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from kaizen_server_extension.store.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "Run migrations with `kaizen-db upgrade` or at server start-up; they need the "
        "store's own engine."
    )
_run(connection)
