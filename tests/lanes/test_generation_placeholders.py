"""run_code generation placeholders in the durable journal (R-236).

Every run_code call declares its output files (``artifact_targets``, R-235), so the backend
publishes one placeholder per declared target on ``tool.requested``, derived from the
*validated* arguments only, and the call's ``tool.settled`` carries the durable file stored for
each target that was produced (``files``), straight from the artifact store. A declared target
without an entry was not produced: its placeholder goes. The panel's reducer over these events
is tested in ``labextension/test/generation.test.ts``.

Through the REST API, with a real server, real kernels and a scripted model; then the host's
own rules (what it derives, and what it refuses from the untrusted controller) directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kaizen_server_extension.host.run_host import generation_placeholders
from kaizen_server_extension.runtime.port import TraceEvent
from kaizen_server_extension.store import Store
from tests.conftest import BACKENDS, scripted_server
from tests.lanes.test_call_transactions import _turn
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.server import ServerProcess

ONE_OF_TWO = """
import csv
with open("summary.csv", "w", newline="") as f:
    csv.writer(f).writerows([["region", "total"], ["north", 12]])
# charts/plot.png is declared too, but this program never writes it.
print("wrote the summary only")
"""

RAISES_FIRST = """
raise ValueError("the input sheet is empty")
"""


def _run_code(code: str, targets: list[str]) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_code", "arguments": {
        "code": code, "language": "python", "artifact_targets": targets}}]}


SCRIPTS = [
    {"match": "summary and chart", "responses": [
        _run_code(ONE_OF_TWO, ["summary.csv", "./charts/plot.png"]),
        {"text": "The summary is ready; the chart was not drawn."}]},
    {"match": "empty sheet", "responses": [
        _run_code(RAISES_FIRST, ["report.xlsx"]),
        {"text": "The sheet was empty, so there is no report."}]},
    {"match": "escape the workspace", "responses": [
        _run_code("print('never runs')", ["notes/../../outside.txt"]),
        {"text": "That name is not allowed."}]},
]


@pytest.fixture(scope="module", params=BACKENDS)
def placeholder_server(request: pytest.FixtureRequest,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp(f"placeholders-{request.param}")
    with scripted_server(str(request.param), root, SCRIPTS,
                         extra_env={"KAIZEN_KERNEL_POOL_SIZE": "1"}) as server:
        yield server


def _run_code_events(client: httpx.Client, text: str) -> tuple[str, dict[str, Any],
                                                                dict[str, Any]]:
    """Send ``text``, wait for the run to end, and return the room with the run_code call's
    ``tool.requested`` and ``tool.settled`` events, read back from the durable journal."""
    room = _room(client)
    accepted = _send(client, room, text)
    run = _settled(client, accepted["run_id"], timeout=90)
    assert run["status"] == "completed", run
    events = _events(client, room, accepted["run_id"])
    [requested] = [e for e in events if e["type"] == "tool.requested"
                   and e["data"]["name"] == "run_code"]
    [settled] = [e for e in events if e["type"] == "tool.settled"
                 and e["data"]["name"] == "run_code"]
    # The run-bound reference that lets the settling frame find its placeholders.
    assert requested["run_id"] == settled["run_id"] == accepted["run_id"]
    assert requested["data"]["call_id"] == settled["data"]["call_id"]
    return room, requested, settled


@pytest.mark.rule("R-236")
def test_a_produced_target_morphs_into_its_file_and_a_missing_one_is_absent(
        placeholder_server: ServerProcess) -> None:
    with placeholder_server.client("alice") as alice:
        room, requested, settled = _run_code_events(alice, "make the summary and chart")
        # One placeholder per declared target, under its normalised name, before running.
        assert requested["data"]["placeholders"] == [{"target": "summary.csv"},
                                                     {"target": "charts/plot.png"}]
        assert requested["seq"] < settled["seq"]
        assert settled["data"]["outcome"] == "ok", settled
        # Only the produced target has a durable file; the chart is simply absent.
        [stored] = settled["data"]["files"]
        assert set(stored) == {"target", "artifact_id", "version", "filename", "media_type"}
        assert (stored["target"], stored["version"], stored["filename"],
                stored["media_type"]) == ("summary.csv", 1, "summary.csv", "text/csv")
        # It is the exact stored version, downloadable through the ordinary route.
        version = alice.get(f"artifacts/{stored['artifact_id']}/versions/1",
                            params={"conversation_id": room})
        assert version.status_code == 200 and version.json()["kind"] == "file"
        download = alice.get(f"artifacts/{stored['artifact_id']}/versions/1/download")
        assert download.status_code == 200
        assert download.content.replace(b"\r\n", b"\n") == b"region,total\nnorth,12\n"
        listed = alice.get("artifacts", params={"conversation_id": room}).json()
        assert [a["title"] for a in listed] == ["summary.csv"]


@pytest.mark.rule("R-236")
def test_a_program_that_raises_before_writing_settles_with_no_file(
        placeholder_server: ServerProcess) -> None:
    with placeholder_server.client("alice") as alice:
        room, requested, settled = _run_code_events(alice, "report on the empty sheet")
        assert requested["data"]["placeholders"] == [{"target": "report.xlsx"}]
        # The call's failed completion settles the placeholder: nothing to morph into.
        assert settled["data"]["outcome"] == "error"
        assert settled["data"]["failure_domain"] == "caller"
        assert settled["data"]["files"] == []
        assert alice.get("artifacts", params={"conversation_id": room}).json() == []


@pytest.mark.rule("R-236")
def test_invalid_targets_publish_no_placeholder(placeholder_server: ServerProcess) -> None:
    with placeholder_server.client("alice") as alice:
        _room_id, requested, settled = _run_code_events(alice, "escape the workspace")
        # The name passes the schema's pattern but not the tool's target rules: the call is
        # refused before anything runs, so nothing is announced from its raw text.
        assert "placeholders" not in requested["data"]
        assert "outside.txt" in str(requested["data"]["arguments"])
        assert settled["data"]["outcome"] == "error" and settled["data"]["files"] == []


@pytest.mark.rule("R-236")
@pytest.mark.parametrize(("name", "arguments", "expected"), [
    ("run_code", '{"code": "1", "artifact_targets": ["a.csv", "./out/b.png"]}',
     [{"target": "a.csv"}, {"target": "out/b.png"}]),
    ("run_code", '{"code": "1", "artifact_targets": []}', []),
    # Refused by the tool: no placeholder is read out of an invalid call.
    ("run_code", '{"code": "1"}', None),
    ("run_code", '{"code": "1", "artifact_targets": ["a.csv", "./a.csv"]}', None),
    ("run_code", '{"code": "1", "artifact_targets": ["/etc/passwd"]}', None),
    ("run_code", '{"code": "1", "artifact_targets": ["x.csv"], "extra": 1}', None),
    ("run_code", '{"code": "1", "artifact_targets": ["x.csv"', None),
    # Another tool never has placeholders, whatever its arguments say.
    ("create_artifact", '{"artifact_targets": ["x.csv"]}', None),
])
def test_placeholders_come_only_from_validated_run_code_arguments(
        name: str, arguments: str, expected: list[dict[str, str]] | None) -> None:
    assert generation_placeholders(name, arguments) == expected


@pytest.mark.rule("R-236")
async def test_the_controller_cannot_forge_placeholders_or_a_settlement(store: Store) -> None:
    turn = await _turn(store)
    # The controller is untrusted: what it puts under "placeholders" is discarded...
    await turn.host.publish(turn.bundle, TraceEvent("tool.requested", {
        "step": 1, "call_id": "c1", "name": "probe_read", "arguments": '{"key": "k"}',
        "placeholders": [{"target": "forged.pdf"}]}))
    # ...and a tool.settled it publishes itself (which could name any file) is never stored.
    await turn.host.publish(turn.bundle, TraceEvent("tool.settled", {
        "step": 1, "call_id": "c1", "name": "run_code", "outcome": "ok",
        "files": [{"target": "forged.pdf", "artifact_id": "someone-elses", "version": 1}]}))
    events = await store.journal.read(turn.bundle.conversation_id, "alice", limit=500)
    calls = [e for e in events if e.type.startswith("tool.")]
    assert [e.type for e in calls] == ["tool.requested"]
    assert "placeholders" not in calls[0].data
