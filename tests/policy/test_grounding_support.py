"""What counts as support for a grounded answer (policy/grounding.py, R-103)."""

from __future__ import annotations

import json

import pytest

from kaizen_server_extension.policy.grounding import Retrieved, found_support, unsupported_answer


def _r(name: str, body: object, failed: bool = False, evidence: bool = True) -> Retrieved:
    return Retrieved(name, json.dumps(body), failed, evidence)


@pytest.mark.rule("R-103")
@pytest.mark.parametrize(("results", "supported"), [
    ([_r("search", {"hits": [{"chunk_id": "x"}]})], True),
    ([_r("search", {"hits": [], "note": "Nothing matches."})], False),
    ([_r("search", {"hits": [{"chunk_id": "x"}]}, failed=True)], False),
    ([_r("query_document", {"passages": [{"text": "p"}]})], True),
    ([_r("conversation_history_search", {"results": []})], False),
    ([_r("search_about", {"results": [{"path": "docs/x.md"}]})], True),
    # A delegated answer supports only with citations its child's retrieval verified.
    ([_r("invoke_agent", {"answer": "300 pelicans", "citations": []})], False),
    ([_r("invoke_agent", {"answer": "42", "citations": [{"citation": "kaizen:x"}]})], True),
    # Another tool's successful result is authoritative output an answer may rest on...
    ([_r("list_available_agents", {"agents": [{"id": "search"}]})], True),
    # ...but not one that gave nothing, or failed.
    ([_r("list_available_agents", {}, evidence=False)], False),
    ([_r("run_code", {"status": "error"}, failed=True)], False),
    # Finding a tool is not finding an answer.
    ([_r("tool_search", {"matches": [{"name": "search"}]})], False),
])
def test_support_is_a_successful_retrieval_that_found_something(
        results: list[Retrieved], supported: bool) -> None:
    assert found_support(results) is supported


@pytest.mark.rule("R-103")
def test_which_turns_are_held_to_support() -> None:
    empty = [_r("search", {"hits": []})]
    assert unsupported_answer("search", [])  # a Search agent that retrieved nothing
    assert unsupported_answer("chat", empty)  # any turn whose retrieval found nothing
    assert not unsupported_answer("chat", [])  # ordinary chat is not a grounded answer
    # Delegating alone does not make a coordinator's turn a search.
    assert not unsupported_answer("chat", [_r("invoke_agent", {"citations": []})])
    # Files attached to the turn are evidence in the prompt itself.
    assert not unsupported_answer("search", empty, attached_evidence=True)
