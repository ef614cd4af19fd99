"""request_document enters a run's catalog only in a private turn that also has search and
run_code (R-180)."""

from __future__ import annotations

import dataclasses

import pytest
from kaizen_plugins.code import run_code
from kaizen_plugins.retrieval import query_document, request_document, search

from kaizen_server_extension.tools.catalog import freeze_catalog

# As the registry holds them: first-party.
TOOLS = [dataclasses.replace(d.descriptor, first_party=True)
         for d in (search, query_document, request_document, run_code)]


def _names(ceiling: set[str], *, shared: bool = False, alone: bool = True) -> set[str]:
    catalog = freeze_catalog(TOOLS, agent_ceiling=ceiling, room_shared=shared,
                             roster_is_only_initiator=alone, discovery_enabled=False)
    return set(catalog.names)


@pytest.mark.rule("R-180")
def test_request_document_needs_search_and_run_code_in_a_private_turn() -> None:
    everything = {"search", "query_document", "request_document", "run_code"}
    assert "request_document" in _names(everything)
    assert "request_document" not in _names(everything - {"search"})
    assert "request_document" not in _names(everything - {"run_code"})
    assert "request_document" not in _names({"request_document"})
    # A shared room (or any roster beyond the member): not registered for the turn at all.
    assert "request_document" not in _names(everything, shared=True, alone=False)
    assert "request_document" not in _names(everything, shared=False, alone=False)
    assert "request_document" not in _names(everything, shared=True, alone=True)
    assert "search" in _names(everything, shared=True, alone=False)
