"""The member's notebook through a real server, real kernels and a scripted model: attaching
it (the prompt gets a bounded outline, never base64), read_notebook on the pinned version,
inspect_notebook_kernel refused without the member's permission and bounded with it, and
propose_notebook_edit's proposals, decisions, outcomes and stale refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.notebook.support import (
    code,
    execute,
    markdown,
    notebook_kernel,
    png,
    settled_call,
    user_names,
    wait_idle,
    wait_state,
    write_notebook,
)
from tests.support.server import ServerProcess

IMAGE = png(640, 480)
CELLS = [
    markdown("intro", "# Sales analysis\nQuarterly numbers."),
    code("load", "import pandas as pd\nsales = pd.read_csv('sales.csv')", count=1, outputs=[
        {"output_type": "stream", "name": "stdout", "text": "loaded 3 rows\n"},
        {"output_type": "display_data", "metadata": {},
         "data": {"image/png": IMAGE, "text/plain": "<Figure size 640x480 with 1 Axes>"}}]),
    code("describe", "sales.describe()", count=2, outputs=[
        {"output_type": "execute_result", "execution_count": 2, "metadata": {},
         "data": {"text/plain": "       total\ncount    3.0\n" + "x" * 5000}}]),
]

EDITS = {"edits": [
    {"op": "replace", "cell_id": "describe", "source": "sales.head()"},
    {"op": "insert", "after_cell_id": "load", "source": "print(len(sales))"},
    {"op": "delete", "cell_id": "intro"}], "summary": "Shorter look at the data"}


def _script(match: str, call: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"match": match, "responses": [
        {"tool_calls": [{"name": call, "arguments": arguments}]}, {"text": f"Done: {match}."}]}


SCRIPTS = [
    _script("what is in my notebook", "read_notebook", {"start": 1, "limit": 5}),
    _script("look at my variables", "inspect_notebook_kernel", {}),
    _script("tidy the notebook", "propose_notebook_edit", EDITS),
    _script("propose a nul cell", "propose_notebook_edit", {"edits": [
        {"op": "replace", "cell_id": "describe", "source": "print('a\x00b')"}]}),
    _script("a notebook I did not attach", "read_notebook", {"notebook": "analysis.ipynb"}),
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="module", params=BACKENDS)
def nb_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[ServerProcess, FakeOpenAI, Path]]:
    root: Path = tmp_path_factory.mktemp(f"notebook-{request.param}")
    with FakeOpenAI(SCRIPTS) as fake, served_by(str(request.param), root, fake) as server:
        yield server, fake, root


def _attach(client: Any, room: str, path: str) -> dict[str, Any]:
    response = client.post(f"conversations/{room}/notebooks", json={"path": path})
    assert response.status_code == 201, response.text
    return dict(response.json())


def _turn(client: Any, room: str, text: str, attachments: list[str]) -> list[dict[str, Any]]:
    accepted = _send(client, room, text, attachments=attachments)
    run = _settled(client, accepted["run_id"], timeout=90)
    assert run["status"] == "completed", run
    return _events(client, room, accepted["run_id"])


def _content(settled: dict[str, Any]) -> Any:
    try:
        return json.loads(settled["content"])
    except ValueError:
        return settled["content"]


def test_an_attached_notebook_is_an_outline_in_the_prompt_and_read_by_range(
        nb_server: tuple[ServerProcess, FakeOpenAI, Path]) -> None:
    server, fake, root = nb_server
    write_notebook(root, "reports/analysis.ipynb", CELLS)
    with server.client("alice") as alice:
        room = _room(alice)
        attached = _attach(alice, room, "reports/analysis.ipynb")
        assert attached["cells"] == 3 and attached["version"] == 1
        # The same bytes again: the same pinned version, no second copy.
        again = _attach(alice, room, "reports/analysis.ipynb")
        assert (again["artifact_id"], again["version"], again["reused"]) == (
            attached["artifact_id"], 1, True)
        fake.reset()
        events = _turn(alice, room, "what is in my notebook?", [attached["artifact_id"]])
        prompt = next(m["content"] for m in reversed(fake.requests()[0]["messages"])
                      if m["role"] == "user")
        assert prompt.startswith("what is in my notebook?")
        assert '<notebook path="reports/analysis.ipynb"' in prompt and "cells=3" in prompt
        assert "[1] code id=load (run 1)" in prompt and "stdout: loaded 3 rows" in prompt
        assert "[image/png image, 640x480 px" in prompt
        assert IMAGE[:40] not in prompt and IMAGE[-40:] not in prompt
        body = _content(settled_call(events, "read_notebook"))
        assert [c["id"] for c in body["cells"]] == ["load", "describe"]
        assert body["total_cells"] == 3 and body["next_start"] is None
        assert body["cells"][0]["outputs"][1].startswith("display: <Figure size 640x480")
        assert IMAGE[:40] not in json.dumps(body)
        journal = _events(alice, room)
        reads = [e for e in journal if e["type"] == "notebook.attached"]
        assert len(reads) == 2 and reads[0]["data"]["path"] == "reports/analysis.ipynb"


def test_attaching_refuses_what_is_not_a_readable_notebook(
        nb_server: tuple[ServerProcess, FakeOpenAI, Path]) -> None:
    server, _fake, root = nb_server
    (root / "broken.ipynb").write_text("{not json")
    (root / "old.ipynb").write_text(json.dumps({"nbformat": 3, "worksheets": []}))
    with server.client("alice") as alice, server.client("bob") as bob:
        room = _room(alice)
        for path, status, code_ in (("missing.ipynb", 404, "notebook_not_found"),
                                    ("../outside.ipynb", 404, "notebook_not_found"),
                                    ("broken.ipynb", 422, "not_a_notebook"),
                                    ("old.ipynb", 422, "not_a_notebook")):
            refused = alice.post(f"conversations/{room}/notebooks", json={"path": path})
            assert (refused.status_code, refused.json()["error"]["code"]) == (status, code_)
        not_ipynb = alice.post(f"conversations/{room}/notebooks", json={"path": "a.txt"})
        assert not_ipynb.status_code == 422
        # Another member's conversation is not there at all.
        write_notebook(root, "mine.ipynb", CELLS)
        foreign = bob.post(f"conversations/{room}/notebooks", json={"path": "mine.ipynb"})
        assert foreign.status_code == 404
        assert not [e for e in _events(alice, room) if e["type"] == "notebook.attached"]


def test_the_notebook_tools_see_only_a_notebook_attached_to_the_message(
        nb_server: tuple[ServerProcess, FakeOpenAI, Path]) -> None:
    server, _fake, root = nb_server
    write_notebook(root, "analysis.ipynb", CELLS)
    with server.client("alice") as alice:
        room = _room(alice)
        _attach(alice, room, "analysis.ipynb")  # attached to the room, not to this message
        events = _turn(alice, room, "read a notebook I did not attach", [])
        settled = settled_call(events, "read_notebook")
        assert settled["outcome"] == "error"
        assert "No notebook is attached to the message" in settled["content"]


@pytest.mark.rule("R-187", "R-072")
def test_the_kernel_probe_needs_the_members_permission_and_is_bounded_and_redacted(
        nb_server: tuple[ServerProcess, FakeOpenAI, Path]) -> None:
    server, _fake, root = nb_server
    write_notebook(root, "kernel.ipynb", CELLS)
    with server.client("alice") as alice, \
            notebook_kernel(server, root, "kernel.ipynb") as (kernel_id, kernel):
        execute(kernel, "import pandas as pd\n"
                        "sales = pd.DataFrame({'region': ['north', 'south'], 'total': [12, 30],"
                        " 'api_token': ['sk-live-1', 'sk-live-2']})\n"
                        "api_key = 'sk-secret-value'\nnote = 'x' * 5000\nrows = list(range(9))")
        room = _room(alice)
        attached = _attach(alice, room, "kernel.ipynb")
        # Without the member's permission: refused, and the kernel never saw a request.
        refused = settled_call(_turn(alice, room, "look at my variables",
                                     [attached["artifact_id"]]), "inspect_notebook_kernel")
        assert refused["outcome"] == "error" and "has not allowed" in refused["content"]

        allowed = alice.put(f"conversations/{room}/notebook-kernel-access")
        assert allowed.status_code == 200 and allowed.json()["allowed"] is True
        wait_idle(server, kernel_id)
        count_before = execute(kernel, "1")["content"]["execution_count"]
        before = user_names(kernel)
        settled = settled_call(_turn(alice, room, "look at my variables again",
                                     [attached["artifact_id"]]), "inspect_notebook_kernel")
        assert settled["outcome"] == "ok", settled
        body = _content(settled)
        by_name = {v["name"]: v for v in body["variables"]}
        frame = by_name["sales"]
        assert frame["type"] == "pandas.DataFrame" and frame["shape"] == [2, 3]
        assert [c["name"] for c in frame["columns"]] == ["region", "total", "api_token"]
        assert frame["head"][0]["region"] == "north" and frame["head"][0]["total"] == 12
        # The existing redaction rules: a credential-shaped name or column keeps no value.
        assert by_name["api_key"]["value"] == "[REDACTED]"
        assert frame["head"][0]["api_token"] == "[REDACTED]"
        assert "sk-secret-value" not in settled["content"] and "sk-live" not in settled["content"]
        assert by_name["note"]["length"] == 5000 and len(by_name["note"]["value"]) <= 201
        assert by_name["rows"] == {"name": "rows", "type": "list", "length": 9}
        assert "pd" in body["modules"]
        # No new name, no history: the next cell runs with the very next count.
        assert user_names(kernel) == before
        assert execute(kernel, "1")["content"]["execution_count"] == count_before + 1

        # Revoked: refused again. The permission is the member's, over REST, never a tool.
        revoked = alice.delete(f"conversations/{room}/notebook-kernel-access")
        assert revoked.json()["allowed"] is False
        again = settled_call(_turn(alice, room, "look at my variables once more",
                                   [attached["artifact_id"]]), "inspect_notebook_kernel")
        assert again["outcome"] == "error" and "has not allowed" in again["content"]
        kinds = [e["data"]["allowed"] for e in _events(alice, room)
                 if e["type"] == "notebook.kernel_access"]
        assert kinds == [True, False]


def test_the_kernel_probe_is_refused_while_the_kernel_is_busy_or_not_running(
        nb_server: tuple[ServerProcess, FakeOpenAI, Path]) -> None:
    server, _fake, root = nb_server
    write_notebook(root, "busy.ipynb", CELLS)
    with server.client("alice") as alice:
        room = _room(alice)
        attached = _attach(alice, room, "busy.ipynb")
        assert alice.put(f"conversations/{room}/notebook-kernel-access").status_code == 200
        no_kernel = settled_call(_turn(alice, room, "look at my variables (no kernel)",
                                       [attached["artifact_id"]]), "inspect_notebook_kernel")
        assert no_kernel["outcome"] == "error" and "no running kernel" in no_kernel["content"]
        with notebook_kernel(server, root, "busy.ipynb") as (kernel_id, kernel):
            wait_idle(server, kernel_id)
            kernel.execute("import time; time.sleep(15)")
            wait_state(server, kernel_id, "busy")
            busy = settled_call(_turn(alice, room, "look at my variables (busy)",
                                      [attached["artifact_id"]]), "inspect_notebook_kernel")
            assert busy["outcome"] == "error" and "busy running a cell" in busy["content"], busy


@pytest.mark.rule("R-438")
def test_a_proposal_changes_nothing_until_each_cell_is_decided_once(
        nb_server: tuple[ServerProcess, FakeOpenAI, Path]) -> None:
    server, _fake, root = nb_server
    path = write_notebook(root, "tidy.ipynb", CELLS)
    on_disk = path.read_bytes()
    with server.client("alice") as alice, server.client("bob") as bob:
        room = _room(alice)
        attached = _attach(alice, room, "tidy.ipynb")
        events = _turn(alice, room, "tidy the notebook", [attached["artifact_id"]])
        settled = settled_call(events, "propose_notebook_edit")
        assert settled["outcome"] == "ok", settled
        proposal_id = _content(settled)["proposal_id"]
        proposed = next(e for e in events if e["type"] == "notebook.edit.proposed")["data"]
        assert proposed["id"] == proposal_id and proposed["path"] == "tidy.ipynb"
        ops = [(c["op"], c["cell_id"], c["decision"]) for c in proposed["cells"]]
        assert ops[0] == ("replace", "describe", "pending") and ops[2][:2] == ("delete", "intro")
        assert proposed["cells"][0]["base_source"] == "sales.describe()"
        assert proposed["cells"][1]["after_cell_id"] == "load"
        assert path.read_bytes() == on_disk  # proposing changed nothing

        base = f"notebook-edits/{proposal_id}/cells"
        # Another member cannot see, decide or report on it.
        assert bob.get(f"notebook-edits/{proposal_id}").status_code == 404
        assert bob.post(f"{base}/0/decision", json={"decision": "accept"}).status_code == 404
        # An outcome before a decision is out of order; run-after only for inserted code.
        early = alice.post(f"{base}/0/result", json={"outcome": "applied"})
        assert (early.status_code, early.json()["error"]["code"]) == (
            409, "outcome_out_of_order")
        wrong = alice.post(f"{base}/0/decision", json={"decision": "accept", "run_after": True})
        assert wrong.status_code == 409

        accepted = alice.post(f"{base}/0/decision", json={"decision": "accept"})
        assert accepted.status_code == 200 and accepted.json()["decision"] == "accepted"
        twice = alice.post(f"{base}/0/decision", json={"decision": "reject"})
        assert (twice.status_code, twice.json()["error"]["code"]) == (409, "already_decided")
        run_after = alice.post(f"{base}/1/decision",
                               json={"decision": "accept", "run_after": True})
        assert run_after.json()["run_after"] is True
        assert alice.post(f"{base}/2/decision", json={"decision": "reject"}).status_code == 200
        assert alice.post(f"{base}/2/result", json={"outcome": "applied"}).status_code == 409

        assert alice.post(f"{base}/0/result", json={"outcome": "applied"}).status_code == 200
        assert alice.post(f"{base}/0/result", json={"outcome": "applied"}).status_code == 409
        assert alice.post(f"{base}/1/result", json={"outcome": "undone"}).status_code == 409
        assert alice.post(f"{base}/1/result", json={"outcome": "stale",
                                                    "detail": "cell moved"}).status_code == 200
        assert alice.post(f"{base}/0/result", json={"outcome": "undone"}).status_code == 200

        view = alice.get(f"notebook-edits/{proposal_id}").json()
        assert [(c["decision"], c["outcome"]) for c in view["cells"]] == [
            ("accepted", "undone"), ("accepted", "stale"), ("rejected", None)]
        journal = _events(alice, room)
        decided = [(e["data"]["ordinal"], e["data"]["decision"]) for e in journal
                   if e["type"] == "notebook.edit.decided"]
        results = [(e["data"]["ordinal"], e["data"]["outcome"]) for e in journal
                   if e["type"] == "notebook.edit.result"]
        assert decided == [(0, "accepted"), (1, "accepted"), (2, "rejected")]
        assert results == [(0, "applied"), (1, "stale"), (0, "undone")]
        assert path.read_bytes() == on_disk  # the server never writes the notebook


def test_a_proposal_for_a_notebook_changed_since_it_was_read_is_refused_as_stale(
        nb_server: tuple[ServerProcess, FakeOpenAI, Path]) -> None:
    server, _fake, root = nb_server
    write_notebook(root, "stale.ipynb", CELLS)
    with server.client("alice") as alice:
        room = _room(alice)
        attached = _attach(alice, room, "stale.ipynb")
        changed = [*CELLS[:2], code("describe", "sales.describe(include='all')")]
        write_notebook(root, "stale.ipynb", changed)  # the member edited a cell meanwhile
        events = _turn(alice, room, "tidy the notebook (stale)", [attached["artifact_id"]])
        settled = settled_call(events, "propose_notebook_edit")
        assert settled["outcome"] == "error" and "stale" in settled["content"]
        assert not [e for e in events if e["type"] == "notebook.edit.proposed"]
        # Outputs are not cells' identity: running a cell does not make a proposal stale.
        write_notebook(root, "stale.ipynb", [
            *CELLS[:2], code("describe", "sales.describe()", count=7, outputs=[])])
        fresh = _attach(alice, room, "stale.ipynb")
        assert fresh["version"] == 2
        write_notebook(root, "stale.ipynb", [
            *CELLS[:2], code("describe", "sales.describe()", count=8, outputs=[
                {"output_type": "stream", "name": "stdout", "text": "again\n"}])])
        ok = settled_call(_turn(alice, room, "tidy the notebook (fresh)",
                                [fresh["artifact_id"]]), "propose_notebook_edit")
        assert ok["outcome"] == "ok", ok


@pytest.mark.rule("R-267")
def test_a_proposed_cell_holding_nul_is_refused_and_the_turn_goes_on(
        nb_server: tuple[ServerProcess, FakeOpenAI, Path]) -> None:
    """A cell source is a text column, which holds no U+0000 on either database: the proposal
    is a definite, repairable refusal with nothing recorded, not an unknown write outcome."""
    server, _fake, root = nb_server
    write_notebook(root, "nul.ipynb", CELLS)
    with server.client("alice") as alice:
        room = _room(alice)
        attached = _attach(alice, room, "nul.ipynb")
        events = _turn(alice, room, "propose a nul cell", [attached["artifact_id"]])
        settled = settled_call(events, "propose_notebook_edit")
        assert settled["outcome"] == "error", settled
        assert "cannot be stored" in settled["content"]
        assert not [e for e in events if e["type"] == "notebook.edit.proposed"]
