"""Typed tool services from the named ones a test hands a tool (``{"artifacts": store, ...}``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from kaizen_server_extension.store.artifacts.checkpoints import UpdateCheckpoints
from kaizen_server_extension.store.artifacts.drafts import DraftStore
from kaizen_server_extension.store.artifacts.repository import ArtifactStore
from kaizen_server_extension.store.library import LibraryStore
from kaizen_server_extension.tools.services import ArtifactServices, ToolServices

_FIELDS = {f.name for f in fields(ToolServices)} - {"extra"}


def artifact_services(artifacts: ArtifactStore) -> ArtifactServices:
    """The artifact services over ``artifacts`` (a test may hand a subclass of its own)."""
    store = artifacts.store
    return ArtifactServices(store=artifacts, drafts=DraftStore(store, artifacts),
                            checkpoints=UpdateCheckpoints(store, artifacts),
                            library=LibraryStore(store, artifacts))


def tool_services(named: Mapping[str, Any] | ToolServices) -> ToolServices:
    """``named`` as the typed services a run hands its tools; unknown names go to ``extra``."""
    if isinstance(named, ToolServices):
        return named
    known: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for name, value in named.items():
        if name == "artifacts" and isinstance(value, ArtifactStore):
            value = artifact_services(value)
        (known if name in _FIELDS else extra)[name] = value
    return ToolServices(**known, extra=extra)
