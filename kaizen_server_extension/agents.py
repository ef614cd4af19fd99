"""Source-defined agents: what ``kaizen_register_agents`` hooks register.

An agent is configuration, not authority: its tool list is a ceiling and its knowledge scope
only narrows (spec: What an agent is). A definition is validated here and seeded as an
immutable agent version at start-up; a changed definition becomes a new version.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    StringConstraints,
    ValidationError,
    model_validator,
)

#: The agent a conversation gets when none is named (the first-party General agent).
DEFAULT_AGENT_ID = "general"
#: The id of a Library collection or project, as the store mints them (at most 64 characters).
LibraryId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
#: How many ids one scope may name per kind: a scope is a short list a person wrote down.
MAX_SCOPE_IDS = 200
#: ``ctx.services`` key under which a run hands its agent's scope to the retrieval tools.
class KnowledgeScope(BaseModel):
    """What an agent retrieves over: the member's Library collections and projects it may
    read from (a project also brings what it links, transitively), and the uploaded documents
    its ``search`` and ``query_document`` may reach (docs/retrieval.md).

    Empty means no narrowing. A non-empty scope is always intersected with what the member
    running the agent can open, at every call: an id the member cannot open reaches nothing,
    so a scope never widens access (R-002).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    collections: Annotated[frozenset[LibraryId], Field(max_length=MAX_SCOPE_IDS)] = frozenset()
    projects: Annotated[frozenset[LibraryId], Field(max_length=MAX_SCOPE_IDS)] = frozenset()
    documents: Annotated[frozenset[LibraryId], Field(max_length=MAX_SCOPE_IDS)] = frozenset()

    @property
    def narrows(self) -> bool:
        return bool(self.collections or self.projects or self.documents)

    def stored(self) -> dict[str, list[str]]:
        """The canonical JSON kept on the agent version and bound into the run's resource
        digest. Unscoped is ``{}``: what versions seeded before scopes existed hold, so they
        stay unchanged and so do the digests of their runs."""
        if not self.narrows:
            return {}
        stored = {"collections": sorted(self.collections), "projects": sorted(self.projects)}
        if self.documents:  # absent when empty: scopes stored before documents keep digests
            stored["documents"] = sorted(self.documents)
        return stored

    @classmethod
    def from_stored(cls, raw: Mapping[str, Any]) -> KnowledgeScope:
        return cls.model_validate(dict(raw))


UNSCOPED = KnowledgeScope()


class AgentDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    agent_id: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]
    name: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    mode: Literal["search", "chat"]
    persona: Annotated[str, StringConstraints(min_length=1, max_length=20_000)]
    tool_ceiling: Annotated[tuple[str, ...], Field(max_length=200)] = ()
    knowledge_scope: KnowledgeScope = UNSCOPED

    @model_validator(mode="wrap")
    @classmethod
    def _name_the_agent(cls, data: Any,
                        handler: ModelWrapValidatorHandler[AgentDefinition]) -> AgentDefinition:
        """Every refusal names the agent it is about, whether the plugin built the definition
        itself or handed ``register`` plain data: start-up stops on it, and the operator must
        see which agent to fix."""
        try:
            return handler(data)
        except ValidationError as exc:
            agent_id = data.get("agent_id") if isinstance(data, Mapping) else None
            named = f"agent {agent_id[:64]!r}" if isinstance(agent_id, str) else "an agent"
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc']) or 'definition'}: "
                f"{error['msg']}" for error in exc.errors())
            raise ValueError(f"{named} is invalid: {problems}") from None


class AgentRegistrationError(ValueError):
    """A plugin registered an invalid or duplicate agent; start-up stops naming it."""


def collect_agents(registrations: list[tuple[str, object]]) -> tuple[AgentDefinition, ...]:
    """Validate ``(plugin, item)`` pairs from ``kaizen_register_agents``; ids are unique."""
    seen: dict[str, str] = {}
    agents: list[AgentDefinition] = []
    for plugin, item in registrations:
        try:
            agent = item if isinstance(item, AgentDefinition) else \
                AgentDefinition.model_validate(item)
        except ValueError as exc:
            raise AgentRegistrationError(f"plugin {plugin} registered an invalid agent: "
                                         f"{_reason(exc)}") from None
        if agent.agent_id in seen:
            raise AgentRegistrationError(
                f"agent id {agent.agent_id!r} registered by both {seen[agent.agent_id]} and "
                f"{plugin}")
        seen[agent.agent_id] = plugin
        agents.append(agent)
    return tuple(agents)


def _reason(exc: ValueError) -> str:
    """The validator's own sentence (which names the agent), without pydantic's framing."""
    if isinstance(exc, ValidationError):
        return "; ".join(str(error["msg"]).removeprefix("Value error, ")
                         for error in exc.errors())
    return str(exc)
