"""Text addressed to the model is never the member's answer (issue 13, item 7).

run_code's failed result carries a ``repair_instruction`` ("The run failed with
ModuleNotFoundError. Fix the code and run it again; ..."). A small model once copied it as its
answer, and that instruction was committed as what the member was told. Now it is marked as
model-facing (``protocol/model_facing.py``): the controller discards such an answer unseen and
asks once more, then says plainly what failed and why; the host refuses to journal or settle
it as an answer whatever a controller sends.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from kaizen_server_extension.host.run_host import RunHost
from kaizen_server_extension.protocol.model_facing import (
    ECHO_REASON,
    ECHO_REMINDER,
    ECHO_RULE_ID,
    directives_in,
    echoes,
)
from kaizen_server_extension.protocol.tools import (
    Capability,
    ToolCallRequest,
    ToolCallResult,
    ToolOutcome,
)
from kaizen_server_extension.runtime.port import TerminalOutcome, TerminalStatus, TraceEvent
from kaizen_server_extension.store import Store
from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.lanes.test_call_transactions import _no_model, _turn
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.server import ServerProcess, start_server

#: What run_code's failed result says to the model (kaizen_kernel/service.py), verbatim.
REPAIR = ("The run failed with ModuleNotFoundError. Fix the code and run it again; do not "
          "resend the same code unchanged.")
MISSING = "kz_module_that_is_not_installed"
FAILING = {"name": "run_code", "arguments": {
    "code": f"import {MISSING}\nprint('never')", "language": "python",
    "artifact_targets": []}}
PLAIN = f"The code failed: the module {MISSING} is not installed, so I have no sum."

SCRIPTS: list[dict[str, Any]] = [
    # The model repeats the repair instruction, is asked again, and answers plainly.
    {"match": "sum it once", "responses": [
        {"tool_calls": [FAILING]},
        {"attempts": [{"text": REPAIR}, {"text": PLAIN}]}]},
    # The model repeats it every time: the turn ends with a plain statement of the failure.
    {"match": "sum it always", "responses": [
        {"tool_calls": [FAILING]},
        {"text": REPAIR}]},
]


# --- the marking and the matching ---------------------------------------------------------


def test_a_repair_instruction_in_a_tool_body_is_marked_model_facing() -> None:
    body = {"status": "error", "error": {"name": "ModuleNotFoundError"},
            "repair_instruction": REPAIR}
    assert directives_in(body) == (REPAIR,)
    assert directives_in(json.dumps(body)) == (REPAIR,)  # as the projection carries it
    assert directives_in({"status": "ok", "stdout": REPAIR}) == ()  # output is not marked
    assert directives_in("not json") == ()


@pytest.mark.rule("R-023")
@pytest.mark.parametrize("answer", [
    REPAIR,
    f"Sorry! {REPAIR.lower()}",
    "fix the code and run it again",
    "I will fix the code and run it again; do not resend the same code",
])
def test_an_answer_repeating_the_instruction_echoes_it(answer: str) -> None:
    assert echoes(answer, [REPAIR])


@pytest.mark.parametrize("answer", [
    "The code failed with ModuleNotFoundError: No module named 'pandas'.",
    "The run failed with ModuleNotFoundError, because pandas is not installed here.",
    "The sum of column b is 42.",
    "",
])
def test_a_plain_statement_of_the_failure_does_not_echo(answer: str) -> None:
    assert not echoes(answer, [REPAIR])


# --- the host refuses it, whatever the controller does -------------------------------------


def _failed_run_code(call_id: str) -> ToolCallResult:
    body = {"status": "error", "stdout": "", "stderr": "",
            "error": {"name": "ModuleNotFoundError",
                      "value": "No module named 'pandas'", "traceback": ""},
            "repair_instruction": REPAIR}
    return ToolCallResult(call_id=call_id, name="run_code", outcome=ToolOutcome.ERROR,
                          content=json.dumps(body), capability=Capability.WRITE,
                          model_facing=(REPAIR,))


@pytest.mark.rule("R-023", "R-022")
async def test_the_host_refuses_to_publish_a_repair_instruction_as_the_answer(
        store: Store) -> None:
    """A controller that commits the repair text anyway: the host journals no such answer and
    settles the run failed with a plain statement of what failed and why."""
    turn = await _turn(store)

    async def call_tool(bundle: Any, request: ToolCallRequest, scope: object = None, /
                        ) -> ToolCallResult:
        return _failed_run_code(request.call_id)

    host = RunHost(store=store, lane=turn.lane, bundle=turn.bundle, model_stream=_no_model,
                   call_tool=call_tool, publish_live=lambda conversation, kind, data: None,
                   lease=timedelta(seconds=30))
    await host.publish(turn.bundle, TraceEvent("tool.requested", {
        "step": 1, "call_id": "c1", "name": "probe_read", "arguments": "{}"}))
    await host.call_tool(turn.bundle, ToolCallRequest("c1", "probe_read", "{}", 1))
    await host.publish(turn.bundle, TraceEvent("answer.committed", {"step": 2, "text": REPAIR}))
    assert await host.publish_terminal(turn.bundle, TerminalOutcome(
        TerminalStatus.COMPLETED, "answered", REPAIR))

    events = await store.journal.read(turn.bundle.conversation_id, "alice", limit=500)
    assert [e for e in events if e.type == "answer.committed"] == []
    run = await store.runs.get_for(turn.bundle.run_id, "alice")
    assert (run.status, run.reason) == ("failed", ECHO_REASON)
    [terminal] = [e.data for e in events if e.type == "run.terminal"]
    message = str(terminal.get("message"))
    assert "ModuleNotFoundError: No module named 'pandas'" in message
    assert not echoes(message, [REPAIR])


async def test_the_host_lets_a_plain_answer_through(store: Store) -> None:
    turn = await _turn(store)

    async def call_tool(bundle: Any, request: ToolCallRequest, scope: object = None, /
                        ) -> ToolCallResult:
        return _failed_run_code(request.call_id)

    host = RunHost(store=store, lane=turn.lane, bundle=turn.bundle, model_stream=_no_model,
                   call_tool=call_tool, publish_live=lambda conversation, kind, data: None,
                   lease=timedelta(seconds=30))
    await host.call_tool(turn.bundle, ToolCallRequest("c1", "probe_read", "{}", 1))
    await host.publish(turn.bundle, TraceEvent("answer.committed", {"step": 2, "text": PLAIN}))
    assert await host.publish_terminal(turn.bundle, TerminalOutcome(
        TerminalStatus.COMPLETED, "answered", PLAIN))
    run = await store.runs.get_for(turn.bundle.run_id, "alice")
    assert (run.status, run.reason) == ("completed", "answered")


# --- end to end: a real server, a real kernel, the scripted model ----------------------------


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[ServerProcess, FakeOpenAI]]:
    root: Path = tmp_path_factory.mktemp("model-facing")
    with FakeOpenAI(SCRIPTS) as fake:
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake",
            "KAIZEN_KERNEL_POOL_SIZE": "1"})
        try:
            yield server, fake
        finally:
            server.stop()


def _turn_of(server: ServerProcess, text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with server.client("alice") as alice:
        alice.put("members/me/settings", json={"approval_mode": "never_ask"})
        room = _room(alice)
        accepted = _send(alice, room, text)
        run = _settled(alice, accepted["run_id"], timeout=90)
        return run, _events(alice, room, accepted["run_id"])


def _run_code_failed(events: list[dict[str, Any]]) -> None:
    [settled] = [e["data"] for e in events if e["type"] == "tool.settled"]
    assert settled["name"] == "run_code" and settled["outcome"] == "error", settled
    # The kernel's own repair instruction is what the model was handed.
    assert json.loads(str(settled["content"]))["repair_instruction"] == REPAIR


@pytest.mark.rule("R-023", "R-016")
def test_a_repeated_repair_instruction_is_discarded_and_the_model_asked_again(
        echo_server: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = echo_server
    fake.reset()
    run, events = _turn_of(server, "sum it once please")
    _run_code_failed(events)
    assert (run["status"], run["outcome"]) == ("completed", "answered"), run
    committed = [e["data"]["text"] for e in events if e["type"] == "answer.committed"]
    assert committed == [PLAIN]
    corrections = [e["data"] for e in events if e["type"] == "correction.applied"]
    assert [c["rule_id"] for c in corrections] == [ECHO_RULE_ID]
    # The step was asked again with the reminder; the rejected text is not in its history.
    last = fake.requests()[-1]["messages"]
    assert any(m["role"] == "system" and m["content"] == ECHO_REMINDER for m in last)
    assert not any(m["role"] == "assistant" and REPAIR in str(m.get("content")) for m in last)


@pytest.mark.rule("R-023", "R-022")
def test_a_model_that_keeps_repeating_it_gets_a_plain_statement_of_the_failure(
        echo_server: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = echo_server
    fake.reset()
    run, events = _turn_of(server, "sum it always please")
    _run_code_failed(events)
    assert (run["status"], run["outcome"]) == ("failed", ECHO_REASON), run
    assert [e for e in events if e["type"] == "answer.committed"] == []
    [terminal] = [e["data"] for e in events if e["type"] == "run.terminal"]
    message = str(terminal["message"])
    assert f"ModuleNotFoundError: No module named '{MISSING}'" in message, message
    assert not echoes(message, [REPAIR])
    assert "Fix the code" not in json.dumps([e["data"] for e in events
                                             if e["type"] != "tool.settled"])
