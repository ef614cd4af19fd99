"""Prompt profiles: how much context a model is given, as a property of its provider.

A large hosted model reads a 6k-token prompt (every authorized tool's schema, the full
grounding text) in well under a second. The embedded 0.5B model on two CPU cores spends about
30 s on the same prompt before its first token. So each :class:`ModelProvider` names the
profile its models get (``ModelProvider.prompt_profile``), and admission applies it in one
place (``lanes/service.py``):

* ``direct_tools``: when set, only these tools (when the run is authorized for them), plus what
  the member's request earns (an exact tool name, R-298; an unfinished artifact version,
  R-299; attached files, which only run_code reads), are advertised on the first step; every
  other authorized tool is deferred behind ``tool_search`` (R-296, R-297, R-323), which this
  profile therefore always admits. The grant is unchanged: a deferred tool is found and made
  callable by searching, never added.
* ``compact_prompt``: the shared grounding rules in their short wording
  (``policy/grounding.py: GROUNDING_COMPACT``), still composed by the one chain no agent can
  opt out of.
* ``description_chars``: each tool's description as projected for this run is cut at a
  sentence end within this many characters (schemas are untouched, so validation is too).
* ``routes_specialists``: a specialist agent's turn starts with the server's routing grant
  (``host/tool_backend.py: ROUTED_FIRST_TOOL``; the Search agent searches first, R-307). A
  large model follows its agent's persona; a small one answers from memory instead.

``FULL`` changes nothing; the built-in ``local`` provider uses ``COMPACT``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PromptProfile:
    name: str
    direct_tools: tuple[str, ...] | None = None
    compact_prompt: bool = False
    description_chars: int | None = None
    routes_specialists: bool = False

    def __post_init__(self) -> None:
        if self.description_chars is not None and self.description_chars < 80:
            raise ValueError("a prompt profile's description_chars must be at least 80")

    @property
    def defers_tools(self) -> bool:
        return self.direct_tools is not None


FULL = PromptProfile("full")
#: Small local models: each default agent's own job direct — run_code (analysis in a
#: kernel) and search (the Search agent's retrieval; a small model does not go looking for a
#: tool it cannot see, and answers from memory instead) — when the agent has them; the rest
#: behind tool_search, short grounding, short descriptions.
COMPACT = PromptProfile("compact", direct_tools=("run_code", "search"), compact_prompt=True,
                        description_chars=700, routes_specialists=True)
