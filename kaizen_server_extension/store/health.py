"""What readiness and the run gauges read from the database: small read-only units."""

from __future__ import annotations

from collections.abc import Generator

from sqlalchemy import func, literal, or_, select, text

from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.engine import shipped_revisions
from kaizen_server_extension.store.units import Rows, Step, fetch

_PING = select(literal(1))
_REVISION = text("SELECT version_num FROM alembic_version")
_RUNS = m.Run.__table__
OPEN_RUN_STATUSES = ("queued", *m.ACTIVE_RUN_STATUSES)
# Equalities rather than IN: a unit statement takes plain positional parameters only.
_OPEN_RUNS = (select(_RUNS.c.status, func.count())
              .where(or_(*(_RUNS.c.status == status for status in OPEN_RUN_STATUSES)))
              .group_by(_RUNS.c.status))


def ping() -> Generator[Step, Rows | None, bool]:
    rows = yield from fetch(_PING, {})
    return bool(rows)


def schema_revision() -> Generator[Step, Rows | None, str | None]:
    """The revision the database was migrated to (raises when it never was)."""
    rows = yield from fetch(_REVISION, {})
    return str(rows[0][0]) if rows else None


def open_run_counts() -> Generator[Step, Rows | None, dict[str, int]]:
    """Runs not yet settled, by status, over the whole database (every replica's)."""
    rows = yield from fetch(_OPEN_RUNS, {})
    counts = dict.fromkeys(OPEN_RUN_STATUSES, 0)
    counts.update({str(status): int(n) for status, n in rows})
    return counts


def migration_revisions() -> tuple[frozenset[str], frozenset[str]]:
    """(heads, every revision) of the migrations this code ships."""
    return shipped_revisions()
