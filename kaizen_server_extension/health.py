"""Liveness and readiness of one server process, for probes and load balancers.

*Live*: the process answers (its event loop runs). *Ready*: it can serve a member — the store
answers, its schema is at the head revision this code ships, and on PostgreSQL the events
link that carries other replicas' journal appends is connected. Each check names a reason
code, never a host, URL or exception text: the probe answers without authentication.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from kaizen_server_extension.store import Store
from kaizen_server_extension.store.health import migration_revisions, ping, schema_revision

#: A store that has not answered by then is not ready (probes time out at a few seconds).
STORE_TIMEOUT_S = 3.0

OK = "ok"


@dataclass(frozen=True)
class Readiness:
    checks: dict[str, str]

    @property
    def ready(self) -> bool:
        return all(value == OK for value in self.checks.values())

    def public(self) -> dict[str, Any]:
        return {"status": "ready" if self.ready else "not_ready", "checks": self.checks}


def migration_state(revision: str | None) -> str:
    """``ok`` at a head; ``behind`` at an older revision of ours (start-up migrates, so a
    replica sees this only while another one is migrating); ``unknown_revision`` when a
    newer release migrated the database; ``missing`` when it was never migrated."""
    heads, known = migration_revisions()
    if revision is None:
        return "missing"
    if revision in heads:
        return OK
    return "behind" if revision in known else "unknown_revision"


async def readiness(store: Store, events_link: Any = None) -> Readiness:
    checks: dict[str, str] = {}
    try:
        await asyncio.wait_for(store.run(ping(), write=False), STORE_TIMEOUT_S)
    except Exception:
        checks["store"] = "unreachable"
        checks["migrations"] = "unknown"
    else:
        checks["store"] = OK
        try:
            revision = await asyncio.wait_for(store.run(schema_revision(), write=False),
                                              STORE_TIMEOUT_S)
        except Exception:
            revision = None  # no alembic_version table: never migrated
        checks["migrations"] = migration_state(revision)
    if events_link is not None:
        checks["events"] = OK if events_link.connected else "disconnected"
    return Readiness(checks)
