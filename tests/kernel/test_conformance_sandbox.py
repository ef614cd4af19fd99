"""Conformance of run_code through a real server, real kernels and the REST API (spec: tools,
"The closed built-in registry" and "The runtime decides whether a call failed"): what the code
process can see, what a kernel callback is re-checked against, and how a failed call that
saved files is reported."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.server import SERVER_TOKEN, ServerProcess, member_token, start_server

REPO = Path(__file__).resolve().parents[2]

# Everything the code process can reach about itself: environment, the sandbox module's
# state, its own namespace, its process records and the files around it.
DUMP_PROGRAM = r"""
import json, os, sys
seen = {"env": dict(os.environ), "argv": sys.argv}
sandbox = sys.modules.get("_kaizen_sandbox")
seen["sandbox_state"] = repr(getattr(sandbox, "_state", None))
seen["sandbox_names"] = sorted(vars(sandbox)) if sandbox else []
seen["namespace"] = {k: repr(v)[:2000] for k, v in globals().items() if not k.startswith("_")}
for name in ("environ", "cmdline"):
    try:
        with open(f"/proc/self/{name}", "rb") as f:
            seen["proc_" + name] = f.read().decode("utf-8", "replace")
    except OSError as exc:
        seen["proc_" + name] = type(exc).__name__
files = {}
for base in {os.getcwd(), os.environ.get("HOME", "")} - {""}:
    for dirpath, _dirs, names in os.walk(base):
        for n in names[:50]:
            path = os.path.join(dirpath, n)
            try:
                with open(path, "rb") as f:
                    files[path] = f.read(65536).decode("utf-8", "replace")
            except OSError:
                pass
seen["files"] = files
with open("capability-dump.json", "w") as f:
    json.dump(seen, f)
print("dumped", len(json.dumps(seen)))
"""

# Calls the roster back once, then keeps calling until a callback is refused; the flag file
# tells the test that the first callback succeeded. What happened is also written to a file,
# so it can be read even when the turn itself ends differently.
LOOP_PROGRAM = r"""
import json, time
first = tools.call("list_available_agents")
outcome = {"first": sorted(a["name"] for a in first["agents"]), "refused": None, "calls": 1}
open("{flag}", "w").write("started")
deadline = time.time() + 45
while time.time() < deadline:
    try:
        tools.call("list_available_agents")
        outcome["calls"] += 1
    except tools.ToolCallError as exc:
        outcome["refused"] = {"code": exc.code, "message": str(exc)}
        break
    time.sleep(0.2)
open("{flag}.json", "w").write(json.dumps(outcome))
print("outcome:", json.dumps(outcome))
"""

GUARDED_PROGRAM = r"""
try:
    tools.call("list_available_agents")
    print("roster: allowed")
except tools.ToolCallError as exc:
    print("roster refused:", exc)
# A write tool and a name that is no tool at all: the descriptor check refuses both.
for name in ("manage_library", "delete_everything"):
    try:
        tools.call(name, {})
        print(name, "allowed")
    except tools.ToolCallError as exc:
        print(name, "refused:", exc.code)
"""

FAILING_WITH_FILE = r"""
with open("partial.csv", "w") as f:
    f.write("region,total\nnorth,12\n")
raise RuntimeError("the south region is missing")
"""


def _run_code(code: str, targets: list[str]) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_code", "arguments": {
        "code": code, "language": "python", "artifact_targets": targets}}]}


SCRIPTS = [
    {"match": "dump what you see", "responses": [
        _run_code(DUMP_PROGRAM, ["capability-dump.json"]), {"text": "Dumped."}]},
    {"match": "loop until revoked", "responses": [
        _run_code(LOOP_PROGRAM.replace("{flag}", "revoked-flag"), []), {"text": "Looped."}]},
    {"match": "loop until the room changes", "responses": [
        _run_code(LOOP_PROGRAM.replace("{flag}", "audience-flag"), []), {"text": "Looped."}]},
    {"match": "call the roster from code", "responses": [
        _run_code(GUARDED_PROGRAM, []), {"text": "Called."}]},
    {"match": "make the partial report", "responses": [
        _run_code(FAILING_WITH_FILE, ["partial.csv"]),
        {"text": "The script failed."}]},
]


@pytest.fixture(scope="module")
def sandbox_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root: Path = tmp_path_factory.mktemp("conformance-sandbox")
    with FakeOpenAI(SCRIPTS) as fake:
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake",
            "KAIZEN_MODEL_API_KEY": "sk-model-key-not-for-kernels",
            "KAIZEN_KERNEL_POOL_SIZE": "1",
            # The sample plugin's guardrail denies carol the roster (also from a kernel).
            "KAIZEN_PLUGINS": "tests.support.sample_plugin",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH")])),
        })
        try:
            yield server
        finally:
            server.stop()


def _root(server: ServerProcess) -> Path:
    return Path(server.env["JUPYTER_DATA_DIR"]).parent


def _run_code_settled(client: httpx.Client, room: str, run_id: str) -> dict[str, Any]:
    settled = [e for e in _events(client, room, run_id)
               if e["type"] == "tool.settled" and e["data"]["name"] == "run_code"]
    assert len(settled) == 1, _events(client, room, run_id)
    return dict(settled[0]["data"])


def _wait_for_file(root: Path, name: str, timeout: float = 60) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p for p in root.rglob(name) if p.is_file()]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"{name} never appeared under {root}")


def _run_row(server: ServerProcess, run_id: str) -> dict[str, Any]:
    with sqlite3.connect(_root(server) / "kaizen.db") as db:
        db.row_factory = sqlite3.Row
        row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
    assert row is not None
    return dict(row)


@pytest.mark.rule("R-172")
def test_the_code_process_never_holds_the_run_capability_or_descriptor_digests(
        sandbox_server: ServerProcess) -> None:
    with sandbox_server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "dump what you see")
        run = _settled(alice, accepted["run_id"], timeout=90)
        call = _run_code_settled(alice, room, accepted["run_id"])
        assert call["outcome"] == "ok", call
        dump_path = _wait_for_file(_root(sandbox_server), "capability-dump.json", timeout=5)
        dump = dump_path.read_text()
    seen = json.loads(dump)
    assert seen["sandbox_names"], "the dump did not reach the sandbox module"
    row = _run_row(sandbox_server, accepted["run_id"])
    # The run's admitted authority: the catalog (descriptor) digest, the resource digest, the
    # run itself and its agent version; and the server's own credentials.
    assert row["catalog_digest"] and len(row["catalog_digest"]) == 64
    withheld = {
        "catalog digest": row["catalog_digest"],
        "resource digest": row["resource_digest"],
        "run id": accepted["run_id"],
        "run id (from the run record)": run["id"],
        "agent version": row["agent_version_id"],
        "server token": SERVER_TOKEN,
        "member token": member_token("alice"),
        "model key": "sk-model-key-not-for-kernels",
    }
    leaked = {what: value for what, value in withheld.items() if value and value in dump}
    assert leaked == {}
    # What the kernel does hold is a per-lease bridge token, which names a lease, not a run.
    state = seen["sandbox_state"]
    assert "'token':" in state and "kernel-bridge" in state


@pytest.mark.rule("R-173")
def test_a_kernel_callback_is_re_checked_against_the_members_current_permissions(
        sandbox_server: ServerProcess) -> None:
    with sandbox_server.client("alice") as alice, sandbox_server.client("dave") as admin:
        room = _room(alice)
        accepted = _send(alice, room, "loop until revoked")
        _wait_for_file(_root(sandbox_server), "revoked-flag", timeout=90)
        # The run_code call is in flight and its first callback passed; now an admin revokes
        # the roster for alice. The bridge's own checks (lease, advertised read tool) still
        # pass; only the backend's re-check of the member's permission can refuse.
        revoked = admin.put("admin/tool-policies/list_available_agents/alice",
                            json={"allowed": False})
        assert revoked.status_code == 200, revoked.text
        try:
            _settled(alice, accepted["run_id"], timeout=90)
            call = _run_code_settled(alice, room, accepted["run_id"])
        finally:
            admin.delete("admin/tool-policies/list_available_agents/alice")
    assert call["outcome"] == "ok", call
    outcome = json.loads(_wait_for_file(_root(sandbox_server), "revoked-flag.json",
                                        timeout=10).read_text())
    assert outcome["first"] and outcome["refused"] is not None, outcome
    assert outcome["refused"]["message"].endswith(
        "You do not currently have permission to use that tool."), outcome


@pytest.mark.rule("R-173")
def test_a_kernel_callback_is_re_checked_against_the_run_snapshot(
        sandbox_server: ServerProcess) -> None:
    """The room's audience changes while the call runs: the admitted snapshot no longer
    holds, so the next callback is refused even though its lease token is still valid."""
    with sandbox_server.client("alice") as alice:
        room = _room(alice, shared=True)
        accepted = _send(alice, room, "loop until the room changes")
        _wait_for_file(_root(sandbox_server), "audience-flag", timeout=90)
        added = alice.post(f"conversations/{room}/participants", json={"member": "bob"})
        assert added.status_code == 200, added.text
        _settled(alice, accepted["run_id"], timeout=90)
    outcome = json.loads(_wait_for_file(_root(sandbox_server), "audience-flag.json",
                                        timeout=10).read_text())
    assert outcome["first"] and outcome["refused"] is not None, outcome
    # Refused by the backend's re-check after the bridge admitted the token and the name.
    assert outcome["refused"]["code"] == "run_authority_changed", outcome
    # An expected refusal, not a fault with an operator traceback.
    assert "bridge dispatch of list_available_agents raised" not in sandbox_server.log()


@pytest.mark.rule("R-173")
def test_a_kernel_callback_passes_the_descriptor_check_and_the_shared_guardrail_chain(
        sandbox_server: ServerProcess) -> None:
    results = {}
    for member in ("carol", "alice"):
        with sandbox_server.client(member) as client:
            room = _room(client)
            accepted = _send(client, room, "call the roster from code")
            _settled(client, accepted["run_id"], timeout=90)
            call = _run_code_settled(client, room, accepted["run_id"])
            assert call["outcome"] == "ok", call
            results[member] = str(call["content"])
    # The plugin guardrail denies carol the roster; the kernel's callback meets the same rule.
    assert "roster refused" in results["carol"]
    assert "The roster is not available to you here." in results["carol"]
    assert "roster: allowed" in results["alice"]
    for content in results.values():
        # Only the frozen catalog's read tools are callable from a kernel.
        assert "manage_library refused: unknown_tool" in content
        assert "delete_everything refused: unknown_tool" in content


@pytest.mark.rule("R-276")
def test_a_failed_call_that_saved_a_file_says_so_instead_of_nothing_happened(
        sandbox_server: ServerProcess) -> None:
    with sandbox_server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "make the partial report")
        run = _settled(alice, accepted["run_id"], timeout=90)
        call = _run_code_settled(alice, room, accepted["run_id"])
        assert run["status"] == "completed"
        # The program's failure is the call's outcome...
        assert call["outcome"] == "error" and call["failure_domain"] == "caller", call
        body = json.loads(str(call["content"]))
        assert "the south region is missing" in json.dumps(body)
        # ...and what the model is grounded with names the saved file, says the call exited
        # with an error and that the change may be incomplete.
        note = body["saved_files_note"]
        assert "partial.csv" in note and "exited with an error" in note
        assert "may be incomplete" in note
        saved = [f for f in body["files"] if f["name"] == "partial.csv"]
        assert len(saved) == 1 and saved[0]["saved"] is True
        # The member can indeed open it already.
        download = alice.get(f"artifacts/{saved[0]['artifact_id']}/download")
        assert download.status_code == 200
        assert download.content == b"region,total\nnorth,12\n"
