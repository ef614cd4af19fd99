"""The services the trusted host hands a run's tools, typed: ``ctx.services``.

A tool reaches the backend only through these: the member's artifacts (and their drafts,
update checkpoints and Library), the agent roster, the run_code sandbox and its bridge, the
Hashline workspace state, the run's frozen catalog, its admitted files and its agent's
knowledge scope. The host builds them (``host/tool_backend.py``) over the run's store — for a
tool's ``authorize`` check over the one read-only transaction the check runs in — so no tool,
first- or third-party, constructs a store object or opens a transaction of its own.

A plugin that needs a service of its own may find it in ``extra`` (by name); ``get(name)``
answers either, for code written against the earlier mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kaizen_server_extension.agents import UNSCOPED, KnowledgeScope
from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.resources import NO_RESOURCES, AdmittedResources, SharedResource

if TYPE_CHECKING:
    from kaizen_server_extension.notebooks.service import NotebookService
    from kaizen_server_extension.store.artifacts.checkpoints import UpdateCheckpoints
    from kaizen_server_extension.store.artifacts.drafts import DraftStore
    from kaizen_server_extension.store.artifacts.repository import ArtifactStore
    from kaizen_server_extension.store.hashline_state import StoredWorkspaceState
    from kaizen_server_extension.store.library import LibraryStore
    from kaizen_server_extension.tools.catalog import FrozenCatalog


class AgentDirectory(Protocol):
    """The agents a member may use (the roster tool)."""

    async def visible_to(self, member: str) -> list[dict[str, Any]]: ...


class KernelBridge(Protocol):
    """What a kernel's ``tools.call`` may reach during one run_code call: the run's own
    guarded caller, limited to the catalog's read tools."""

    @property
    def read_tools(self) -> Mapping[str, Capability]: ...

    async def dispatch(self, name: str, arguments: Mapping[str, Any]) -> Any: ...


class CodeSandbox(Protocol):
    """run_code's kernels (``kaizen_kernel.service.RunCodeService``)."""

    async def run_arguments(self, actor: str, conversation_id: str,
                            arguments: Mapping[str, Any] | str, **kwargs: Any) -> Any: ...

    def workspace(self, actor: str, conversation_id: str) -> Path:
        """The (actor, conversation) workspace the kernels and the workspace tools share."""
        ...


class TaskDirectory(Protocol):
    """The member's durable tasks (``host/task_tools.py``), always as the member asking."""

    async def list_for(self, member: str) -> list[Any]: ...

    async def get_for(self, member: str, task_id: str) -> tuple[Any, list[Any]]: ...

    async def create(self, member: str, conversation_id: str, *, name: str, prompt: str,
                     interval_seconds: int | None) -> Any: ...

    async def update(self, member: str, task_id: str, **changes: Any) -> Any: ...

    async def delete(self, member: str, task_id: str) -> None: ...

    async def fire(self, member: str, task_id: str, *, kind: str) -> Any: ...


class DocumentLibrary(Protocol):
    """The member's documents and their full-text search (``store/documents.py``), always
    as the member asking, in the room asking, under the agent's knowledge scope."""

    async def search(self, member: str, query: str, *, room: str | None = None,
                     scope: KnowledgeScope = UNSCOPED, documents: Any = None,
                     limit: int = 8) -> Any: ...

    async def passages(self, member: str, document_id: str, *, room: str | None,
                       scope: KnowledgeScope = UNSCOPED, start: int = 0,
                       max_chars: int = 8_000) -> tuple[Any, list[Any]]: ...

    async def resolve_chunk(self, member: str, chunk_id: str, *, room: str | None,
                            scope: KnowledgeScope = UNSCOPED) -> Any: ...

    async def version_file(self, member: str, document_id: str, version: int, *,
                           room: str | None, scope: KnowledgeScope = UNSCOPED) -> Any: ...


class ConversationHistory(Protocol):
    """The member's prior conversations (``store/history.py``)."""

    async def search(self, member: str, query: str, *, exclude: str | None = None,
                     limit: int = 5) -> list[Any]: ...


class AgentDelegation(Protocol):
    """Another agent's turn run inside this run, for ``invoke_agent`` (host/delegation.py):
    under this run's member, selection, budgets and approvals, never more (R-060)."""

    async def invoke(self, agent_id: str, task: str) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ArtifactServices:
    """The member-artifact services, all over one store."""

    store: ArtifactStore
    drafts: DraftStore
    checkpoints: UpdateCheckpoints
    library: LibraryStore


@dataclass(frozen=True)
class ToolServices:
    """What one run's tools may use; a field is None where the server does not offer it."""

    artifacts: ArtifactServices | None = None
    agents: AgentDirectory | None = None
    run_code: CodeSandbox | None = None
    #: The run's caller as a kernel reaches it (set for the run's tools, not for bridge calls).
    bridge: KernelBridge | None = None
    #: Hashline snapshots and registers kept in the database (R-159).
    workspace_store: StoredWorkspaceState | None = None
    #: The member's attached notebooks and their kernels (docs/notebook.md).
    notebooks: NotebookService | None = None
    #: The member's durable tasks (inspect_tasks, manage_tasks; docs/tasks.md).
    tasks: TaskDirectory | None = None
    #: The member's uploaded documents and their full-text search (docs/retrieval.md).
    documents: DocumentLibrary | None = None
    #: The member's prior conversations, for conversation_history_search.
    history: ConversationHistory | None = None
    #: Chunk ids this run's retrieval handed out (search, query_document): the only ones
    #: request_document accepts (R-181). Grows during the run.
    retrieved_chunks: set[str] = field(default_factory=set)
    #: Document versions request_document added to the run's read-only run_code projection,
    #: after the admitted files. Grows during the run.
    requested_documents: list[SharedResource] = field(default_factory=list)
    #: The run's frozen catalog, for tool discovery.
    catalog: FrozenCatalog | None = None
    #: Names callable now; it grows as discovery reveals deferred tools.
    callable_tools: set[str] = field(default_factory=set)
    #: The turn's admitted files, pinned at acceptance (run_code projects exactly these, R-454).
    resources: AdmittedResources = NO_RESOURCES
    #: What the agent retrieves over; it narrows the member's access, never widens it (R-002).
    knowledge_scope: KnowledgeScope = UNSCOPED
    #: Delegation to another agent within this run's authority (invoke_agent).
    delegation: AgentDelegation | None = None
    #: An artifact the member has open, when a tool may default to it.
    focused_artifact: str | None = None
    #: Services a plugin contributes under its own names.
    extra: Mapping[str, Any] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        """The service named ``name`` (a field, else ``extra``), or ``default``."""
        if name in _FIELDS:
            value = getattr(self, name)
            return default if value is None else value
        return self.extra.get(name, default)


_FIELDS = frozenset(f.name for f in fields(ToolServices)) - {"extra"}
