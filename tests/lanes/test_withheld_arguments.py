"""R-225: artifact argument fragments stay in the backend. Until the exact request is approved
(and afterwards too), the journal every observer reads and the approval request show only
their size; the approved call still writes the whole content."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kaizen_server_extension.host.run_host import shown_arguments
from kaizen_server_extension.policy.redaction import withhold
from kaizen_server_extension.tools import Capability, ToolContext, tool
from kaizen_server_extension.tools.decorators import ToolDeclarationError
from tests.conftest import BACKENDS, scripted_server
from tests.lanes.test_turns import _events, _pending_approval, _room, _send, _settled
from tests.support.server import ServerProcess

SECRET = "R225-fragment-that-must-stay-in-the-backend"
CONTENT = f"# Plan\n\n{SECRET}\n"

SCRIPTS = [
    {"match": "save the plan", "responses": [
        {"tool_calls": [{"name": "create_artifact", "arguments": {
            "title": "Plan", "kind": "markdown", "content": CONTENT}}]},
        {"text": "Saved."}]},
]


@pytest.fixture(scope="module", params=BACKENDS)
def server(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root: Path = tmp_path_factory.mktemp(f"withheld-{request.param}")
    with scripted_server(str(request.param), root, SCRIPTS) as process:
        yield process


@pytest.mark.rule("R-225", "R-224")
def test_artifact_content_never_reaches_an_observer_and_the_approved_call_writes_it(
        server: ServerProcess) -> None:
    with server.client("alice") as alice:
        assert alice.put("members/me/settings",
                         json={"approval_mode": "always_ask"}).status_code == 200
        room = _room(alice)
        accepted = _send(alice, room, "save the plan")
        approval = _pending_approval(alice, accepted["run_id"])

        # While the decision is open: the request and the journal show the content's size only.
        assert approval["tool"] == "create_artifact"
        assert approval["arguments"]["content"] == {"withheld": True, "chars": len(CONTENT)}
        assert approval["arguments"]["title"] == "Plan"  # what is decided on stays readable
        listed = alice.get("approvals", params={"status": "pending"}).text
        assert SECRET not in listed
        journal = json.dumps(_events(alice, room))
        assert SECRET not in journal
        requested = [e for e in _events(alice, room, accepted["run_id"])
                     if e["type"] == "tool.requested"]
        assert requested[0]["data"]["arguments"]["content"] == {
            "withheld": True, "chars": len(CONTENT)}

        assert alice.post(f"approvals/{approval['id']}",
                          json={"decision": "approve"}).status_code == 200
        run = _settled(alice, accepted["run_id"], timeout=60)
        assert run["status"] == "completed", run

        # The approved call got the whole content; observers still never saw it.
        [artifact] = [a for a in alice.get("artifacts").json()
                      if a["title"] == "Plan"]
        download = alice.get(f"artifacts/{artifact['id']}/download")
        assert download.status_code == 200 and download.text == CONTENT
        assert SECRET not in json.dumps(
            [e for e in _events(alice, room) if e["type"] != "artifact.version"])


@pytest.mark.rule("R-225")
def test_withheld_values_are_reduced_to_their_size_whatever_their_shape() -> None:
    names = frozenset({"content"})
    assert withhold({"content": "abc", "title": "t"}, names) == {
        "content": {"withheld": True, "chars": 3}, "title": "t"}
    assert withhold({"content": ["a", 1]}, names) == {"content": {"withheld": True, "chars": 8}}
    assert withhold(["not", "an", "object"], names) == ["not", "an", "object"]
    # Arguments that are not JSON at all are refused by the tool later; their text is
    # withheld all the same.
    assert shown_arguments(f'{{"content": "{SECRET}', names) == {
        "withheld": True, "chars": len(SECRET) + 13}
    assert SECRET in json.dumps(shown_arguments(f'{{"content": "{SECRET}'))


def test_a_tool_cannot_withhold_an_argument_it_does_not_take() -> None:
    async def impl(ctx: ToolContext, text: str) -> str:
        """Echo."""
        return text

    with pytest.raises(ToolDeclarationError, match="not parameters"):
        tool(name="echo_withheld", capability=Capability.READ,
             withheld_arguments=("content",))(impl)
