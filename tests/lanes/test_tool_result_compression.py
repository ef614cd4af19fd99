"""Tool-result compression end to end: a member's opt-in over REST, a real kernel's noisy
output, and what the model read against what the journal keeps (runtime/compression.py).

Spec (tools: Compression at the tool boundary): only where the member opted in, only the
model-bound copy of run_code's stdout/stderr; the raw result stays canonical for the activity
and the audit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.server import ServerProcess

NOISY = """
import sys
for pct in range(0, 101, 2):
    print(f"\\rloading {pct}%", end="")
print()
for _ in range(60):
    print("warning: column 'x' is deprecated", file=sys.stderr)
for epoch in range(80):
    print(f"epoch {epoch} loss {1 / (epoch + 1):.4f}")
print("final accuracy 0.93")
"""

SCRIPTS: list[dict[str, Any]] = [
    {"match": "train the model", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": NOISY, "language": "python", "artifact_targets": []}}]},
        {"text": "Trained: final accuracy 0.93."}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="module", params=BACKENDS)
def served(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess,
                                                                       FakeOpenAI]]:
    root = tmp_path_factory.mktemp(f"compression-{request.param}")
    with FakeOpenAI(SCRIPTS) as fake, served_by(str(request.param), root, fake, {
            "KAIZEN_KERNEL_POOL_SIZE": "1"}) as proc:
        yield proc, fake


def _opt(client: httpx.Client, enabled: bool) -> dict[str, Any]:
    current = client.get("members/me/settings").json()
    response = client.put("members/me/settings", json={
        "approval_mode": "never_ask", "tool_result_compression": enabled})
    assert response.status_code == 200, response.text
    assert current["approval_mode"] in ("always_ask", "ask_for_writes", "never_ask")
    return dict(response.json())


def _run(server: ServerProcess, fake: FakeOpenAI, member: str
         ) -> tuple[dict[str, Any], dict[str, Any]]:
    """One noisy run_code turn: (the run_code result the model read as JSON, the journal's
    tool.settled data)."""
    with server.client(member) as client:
        fake.reset()
        room = _room(client)
        accepted = _send(client, room, "train the model please")
        run = _settled(client, accepted["run_id"], timeout=120)
        assert run["status"] == "completed", run
        [settled] = [e["data"] for e in _events(client, room, accepted["run_id"])
                     if e["type"] == "tool.settled"]
    [seen] = [m for r in fake.requests() for m in r["messages"]
              if m.get("role") == "tool"]
    return json.loads(seen["content"]), settled


@pytest.mark.rule("R-470", "R-471")
def test_an_opted_in_member_s_model_reads_run_code_output_compressed(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    with server.client("alice") as alice:
        assert alice.get("members/me/settings").json()["tool_result_compression"] is False
        assert _opt(alice, True)["tool_result_compression"] is True
        assert alice.get("members/me/settings").json()["tool_result_compression"] is True
    seen, settled = _run(server, fake, "alice")
    raw = json.loads(settled["content"])
    assert settled["outcome"] == "ok", settled

    # The journal (the activity, a recovery's history) keeps every line the kernel printed.
    assert raw["stderr"].count("warning: column 'x' is deprecated") == 60
    assert all(f"epoch {e} loss" in raw["stdout"] for e in range(80))
    # The model read the same result condensed, first and last values kept.
    assert seen["stdout"] != raw["stdout"] and len(seen["stdout"]) < len(raw["stdout"]) / 3
    assert "loading 100%" in seen["stdout"] and "loading 50%" not in seen["stdout"]
    assert "epoch 0 loss 1.0000" in seen["stdout"] and "epoch 79 loss" in seen["stdout"]
    assert "[... 74 similar lines omitted ...]" in seen["stdout"]
    assert "final accuracy 0.93" in seen["stdout"]
    assert seen["stderr"].count("warning: column 'x' is deprecated") == 1
    assert "[previous line repeated 59 more times]" in seen["stderr"]
    assert seen["status"] == raw["status"]


@pytest.mark.rule("R-470")
def test_without_the_opt_in_the_model_reads_exactly_the_journaled_result(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    with server.client("bob") as bob:
        assert bob.get("members/me/settings").json()["tool_result_compression"] is False
    seen, settled = _run(server, fake, "bob")
    assert seen == json.loads(settled["content"])
    assert json.loads(settled["content"])["stderr"].count("deprecated") == 60


def test_the_opt_in_is_a_checked_member_setting(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, _ = served
    with server.client("carol") as carol:
        before = carol.get("members/me/settings").json()
        refused = carol.put("members/me/settings", json={
            "approval_mode": "never_ask", "tool_result_compression": "yes"})
        assert refused.status_code == 422, refused.text
        assert "tool_result_compression" in refused.json()["error"]["message"]
        assert carol.get("members/me/settings").json() == before  # nothing changed
        # Turning it off again is as simple as turning it on.
        assert _opt(carol, True)["tool_result_compression"] is True
        assert _opt(carol, False)["tool_result_compression"] is False
