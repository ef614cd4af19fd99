"""Alembic environment: runs over a connection handed in by ``store.engine.upgrade``."""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from sqlalchemy import Connection

from kaizen_server_extension.store.models import Base, UTCDateTime

config = context.config
target_metadata = Base.metadata


def _render_item(type_: str, obj: Any, autogen_context: Any) -> str | Literal[False]:
    # Migrations are frozen text: render the UTC wrapper as the plain column type it stores.
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        render_item=_render_item,
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
