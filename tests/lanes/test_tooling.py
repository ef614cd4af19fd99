"""The trusted side of discovery: only frozen deferred tools can be revealed."""

from __future__ import annotations

import json

import pytest

from kaizen_server_extension.host.tool_backend import _with_reveals
from kaizen_server_extension.protocol.tools import ToolCallResult, ToolOutcome


def _search_result(names: list[str]) -> ToolCallResult:
    return ToolCallResult(call_id="c1", name="tool_search", outcome=ToolOutcome.OK,
                          content=json.dumps({"matches": [], "newly_callable": names}))


@pytest.mark.rule("R-296", "R-297")
def test_only_frozen_deferred_tools_not_yet_callable_are_revealed() -> None:
    callable_now = {"list_available_agents"}
    result = _with_reveals(
        _search_result(["deep_search", "list_available_agents", "run_shell"]),
        deferred={"deep_search", "archive"}, callable_now=callable_now)
    assert result.reveals == ("deep_search",)
    assert "deep_search" in callable_now
    again = _with_reveals(_search_result(["deep_search"]), deferred={"deep_search"},
                          callable_now=callable_now)
    assert again.reveals == ()  # already callable: reported, not revealed twice


def test_a_result_that_is_not_a_search_body_reveals_nothing() -> None:
    plain = ToolCallResult(call_id="c1", name="tool_search", outcome=ToolOutcome.OK,
                           content="no json here")
    assert _with_reveals(plain, deferred={"x"}, callable_now=set()).reveals == ()
