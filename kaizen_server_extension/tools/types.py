"""Shared shapes of the tool layer: descriptors, room classes, the per-call context.

Kept small and dependency-free so the registry, the pipeline, the policy chain and plugins
all agree on one definition.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.tools import CanvasItem, Capability, StoredFile, WriteCategory

if TYPE_CHECKING:
    from kaizen_server_extension.tools.services import ToolServices

DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 240.0


class RoomClass(enum.StrEnum):
    """Shared-room admission class (spec: Shared-room admission classes)."""

    # Exact room resources and audience-intersection reads: may enter a shared room.
    AUDIENCE_SAFE_READ = "audience_safe_read"
    # Bounded, secret-free metadata reads callable only as the initiating actor.
    ACTOR_BOUND_READ = "actor_bound_read"
    # Enters a turn only when the roster is exactly the initiating member.
    ACTOR_PRIVATE_READ = "actor_private_read"
    # Writes that keep the actor identity through their guard and repository checks.
    ACTOR_BOUND_WRITE = "actor_bound_write"
    # Missing/malformed/unknown declaration: absent from a shared room.
    UNKNOWN = "unknown"


class TrustedBody(dict[str, Any]):
    """A tool's JSON body with trusted parts beside it: the durable files the call stored for
    its declared output targets (run_code), and the rich output it moved to the chat canvas.
    The body is read and projected for the model exactly like any dict; neither part is ever
    projected. The pipeline carries ``stored_files`` on ``ToolCallResult.files``, which the
    journal's ``tool.settled`` publishes so a generation placeholder can morph into its file
    (R-236), and ``canvas`` on ``ToolCallResult.canvas``, which the host materializes on the
    same event while the body keeps one on-screen marker per item (R-277)."""

    __slots__ = ("canvas", "stored_files")

    def __init__(self, body: Mapping[str, Any], stored_files: Iterable[StoredFile] = (), *,
                 canvas: Iterable[CanvasItem] = ()) -> None:
        super().__init__(body)
        self.stored_files: tuple[StoredFile, ...] = tuple(stored_files)
        self.canvas: tuple[CanvasItem, ...] = tuple(canvas)


class ToolContext(Protocol):
    """What a tool implementation may use. It acts as the member, never as the server."""

    @property
    def bundle(self) -> AuthorityBundle: ...

    @property
    def member(self) -> str: ...

    @property
    def services(self) -> ToolServices:
        """The backend services the trusted host hands this run's tools (tools/services.py)."""
        ...


ToolImpl = Callable[..., Awaitable[Any]]


class ResourceContext(Protocol):
    """What a tool's ``authorize`` callable may use: who is asking, and read-only services.

    ``services`` (the artifact services) and ``store`` open only the one read-only transaction
    the check runs in (SQLite ``PRAGMA query_only``, PostgreSQL ``SET TRANSACTION READ
    ONLY``): an authorize callable must not mutate (R-365), and a write it attempts is refused
    by the database.
    """

    @property
    def bundle(self) -> AuthorityBundle: ...

    @property
    def member(self) -> str: ...

    @property
    def services(self) -> ToolServices: ...

    @property
    def store(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class ResourceVerdict:
    """A tool's own resource authorization: allowed, or denied with a member-safe reason."""

    allowed: bool
    reason: str = ""
    code: str = "resource_denied"

    @classmethod
    def allow(cls) -> ResourceVerdict:
        return RESOURCE_ALLOWED

    @classmethod
    def deny(cls, reason: str, code: str = "resource_denied") -> ResourceVerdict:
        return cls(False, reason, code)


RESOURCE_ALLOWED = ResourceVerdict(True)

#: ``async def authorize(ctx, arguments) -> ResourceVerdict`` with the validated arguments.
AuthorizeImpl = Callable[[ResourceContext, Mapping[str, Any]], Awaitable[ResourceVerdict]]


@dataclass(frozen=True)
class ToolDescriptor:
    """A tool as registered: the trusted wrapper's declaration, not the model's."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    capability: Capability = Capability.UNDECLARED
    timeout_s: float = DEFAULT_TIMEOUT_S
    repeat_creates_object: bool = False
    room_class: RoomClass = RoomClass.UNKNOWN
    write_category: WriteCategory = WriteCategory.NONE
    # Name of a multi-call protocol this tool belongs to (exposed whole or not at all).
    protocol_group: str | None = None
    # Discovery surface ("parent") this tool is listed under.
    surface: str = "general"
    first_party: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)
    # Offered only to an agent whose tool list names it explicitly (run_code, R-136): an agent
    # without a tool list does not get it by default.
    explicit_grant_only: bool = False
    # Arguments whose values never leave the backend for observers: see ``tool``.
    withheld_arguments: frozenset[str] = frozenset()
    # Tools the catalog must also admit for this one to enter it (``tool(requires=)``).
    requires_tools: frozenset[str] = frozenset()
    # Never in a durable-shared room, even while only its owner is in it (``tool(...)``).
    private_room_only: bool = False

    @property
    def effective_timeout_s(self) -> float:
        return min(self.timeout_s if self.timeout_s > 0 else DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S)


@dataclass(frozen=True)
class RegisteredTool:
    descriptor: ToolDescriptor
    impl: ToolImpl
    # The tool's own resource authorization, run by the pipeline's write-guard step after any
    # approval and immediately before execution, in a read-only transaction.
    authorize: AuthorizeImpl | None = None


#: The root of the admin policy tree over every source tool (MCP servers, OpenAPI sources):
#: a ceiling that only tightens (R-312, docs/tool-policies.md).
SOURCES_ROOT = "sources"


@dataclass(frozen=True, slots=True)
class Discovered:
    """What one run's discovery found: tools, and the sources that gave none (down)."""

    tools: tuple[RegisteredTool, ...] = ()
    unavailable: tuple[str, ...] = ()
    #: (source id, reason code) of each unavailable source that said why, e.g. an MCP
    #: server that needs the member's credential to list its tools (``credential_required``).
    reasons: tuple[tuple[str, str], ...] = ()

    def __add__(self, other: Discovered) -> Discovered:
        return Discovered(self.tools + other.tools, self.unavailable + other.unavailable,
                          self.reasons + other.reasons)
