"""The pluggy hook specifications of project ``kaizen``.

Every hook hands the plugin a ``register`` callback (as datasette and llm do) instead of asking
it to return a list: the host decides what a registration means, records which plugin made it,
and can refuse it with an error that names the plugin.

First-party families (``tools/manifest.py: DEFAULT_PLUGINS``) and third-party packages (the
``kaizen`` entry-point group) use these same hooks, so our own code exercises the door third
parties use. Plugin authors' guide: docs/plugins.md.
"""

from __future__ import annotations

from typing import Any, Protocol

import pluggy

from kaizen_server_extension.tools.types import RegisteredTool

PROJECT = "kaizen"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class ToolRegistrar(Protocol):
    """The ``register`` callback of :func:`kaizen_register_tools`."""

    def __call__(self, tool: RegisteredTool, /) -> None: ...


class Registrar(Protocol):
    """The ``register`` callback of the guardrail, model-provider and agent hooks."""

    def __call__(self, item: Any, /) -> None: ...


@hookspec
def kaizen_register_tools(register: ToolRegistrar) -> None:
    """Register tool implementations (``@tool``-decorated functions). Called once at start-up.

    First-party tools must also be named in ``BUILTIN_TOOLS``; the registry refuses one that is
    not, and refuses a third-party tool that takes a built-in name."""


@hookspec
def kaizen_register_guardrails(register: Registrar) -> None:
    """Register guardrails for the policy chain."""


@hookspec
def kaizen_register_model_providers(register: Registrar) -> None:
    """Register model providers: ``register(ModelProvider(name=..., create=factory))`` from
    ``kaizen_server_extension.models.providers``. Called once at start-up; the operator picks
    one by name with ``KAIZEN_MODEL_PROVIDER``. The built-in ``openai-compatible`` and
    ``local`` providers register here too (``kaizen_plugins.providers``), and their names
    cannot be taken by another plugin."""


@hookspec
def kaizen_register_agents(register: Registrar) -> None:
    """Register source-defined agents."""
