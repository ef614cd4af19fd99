"""``KaizenContext``: what request handlers reach, typed, built once by ``KaizenApp``.

It lives apart from the app so handlers import it without importing the app that imports
them (the API and the app are then not a cycle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kaizen_server_extension.events import EventBus, PostgresLink
from kaizen_server_extension.host.tool_backend import PipelineToolBackend
from kaizen_server_extension.lanes.scheduler import TaskScheduler
from kaizen_server_extension.lanes.service import LaneService
from kaizen_server_extension.settings import KaizenSettings
from kaizen_server_extension.store import Store


@dataclass
class KaizenContext:
    """Everything handlers need, placed in the tornado settings under ``"kaizen"``."""

    store: Store
    settings: KaizenSettings
    bus: EventBus
    lanes: LaneService
    tools: PipelineToolBackend
    #: The model id runs use when a member chose none (a provider may fix it).
    model: str
    #: Fires due tasks into their rooms (lanes/scheduler.py).
    scheduler: TaskScheduler
    #: Carries the bus across server processes on PostgreSQL; None on SQLite.
    events_link: PostgresLink | None = None
    #: The credential quarantine (credentials/service.py); None unless
    #: KAIZEN_CREDENTIALS_ENABLED is on.
    credentials: Any = None
    #: Members seen by this process (their rows exist).
    known_members: set[str] = field(default_factory=set)

    @property
    def admin_members(self) -> frozenset[str]:
        return self.settings.KAIZEN_ADMIN_MEMBERS

    @property
    def max_message_bytes(self) -> int:
        return self.settings.KAIZEN_MAX_MESSAGE_BYTES

    @property
    def jupyter_file_max_bytes(self) -> int:
        """The largest file of the Jupyter contents tree a member may attach."""
        return self.settings.KAIZEN_JUPYTER_FILE_MAX_BYTES

    @property
    def library_enabled(self) -> bool:
        """The member's Library (its tools and REST routes); off, it does not exist (R-140)."""
        return self.settings.KAIZEN_LIBRARY_ENABLED

    @property
    def openapi_sources_enabled(self) -> bool:
        """Members' external OpenAPI sources (their REST routes and tools); off, they do not
        exist (R-378, docs/openapi-sources.md)."""
        return self.settings.KAIZEN_OPENAPI_SOURCES_ENABLED

    @property
    def tool_names(self) -> frozenset[str]:
        """Names of the registered tools (the admin tool-policy routes refuse any other)."""
        return self.tools.tool_names

    def is_admin(self, member: str) -> bool:
        return member in self.admin_members
