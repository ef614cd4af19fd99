"""End to end: reviewing a notebook edit proposal in headless Chromium against a real server,
a real notebook kernel and a scripted model (``notebook_driver.mjs``). Screenshots go to
KAIZEN_E2E_SCREENSHOTS (default: the test's tmp dir)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.e2e.test_panel import CHROMIUM, REPO, node  # noqa: F401  (the fixture)
from tests.notebook.support import code, markdown, write_notebook
from tests.support.server import SERVER_TOKEN, start_server

DRIVER = Path(__file__).with_name("notebook_driver.mjs")
SCRIPTS = [
    {"match": "tidy this notebook", "responses": [
        {"tool_calls": [{"name": "propose_notebook_edit", "arguments": {
            "summary": "Double the printout, add a check, drop the intro", "edits": [
                {"op": "replace", "cell_id": "show", "source": "print(x * 2)"},
                {"op": "insert", "after_cell_id": "load", "source": "print('inserted ran')"},
                {"op": "delete", "cell_id": "intro"}]}}]},
        {"text": "Proposed three changes; review them in the card."}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.mark.timeout(300)
def test_accept_reject_and_undo_a_proposal_in_the_browser(node: str,  # noqa: F811
                                                          tmp_path: Path) -> None:
    root = tmp_path / "server"
    settings = root / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    write_notebook(root, "review.ipynb", [markdown("intro", "# Review me"),
                                          code("load", "x = 1"), code("show", "print(x)")])
    shots = Path(os.environ.get("KAIZEN_E2E_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    with FakeOpenAI(SCRIPTS) as fake:
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), None, extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model"})
        try:
            env = {**os.environ, "KAIZEN_E2E_BASE_URL": server.base_url,
                   "KAIZEN_E2E_TOKEN": SERVER_TOKEN, "KAIZEN_E2E_SCREENSHOTS": str(shots),
                   "KAIZEN_E2E_CHROMIUM": CHROMIUM}
            result = subprocess.run([node, str(DRIVER)], env=env, capture_output=True,
                                    text=True, timeout=280, cwd=REPO)
            steps = [json.loads(line) for line in result.stdout.splitlines()
                     if line.startswith("{")]
            report = "\n".join(result.stdout.splitlines()[-12:]) + result.stderr[-1500:]
            assert result.returncode == 0, f"{report}\n--- server ---\n{server.log()[-3000:]}"
            names = [s["step"] for s in steps]
            assert names[-1] == "done", report
            for step in ("proposal-shown", "accepted-replace", "rejected-delete",
                         "accepted-insert-and-ran", "undone", "kernel-access-allowed",
                         "kernel-access-revoked"):
                assert step in names, report
            room = steps[-1]["conversationId"]
            with httpx.Client(base_url=server.base_url + "kaizen/api/", timeout=30,
                              headers={"Authorization": f"token {SERVER_TOKEN}"}) as api:
                events = api.get(f"conversations/{room}/journal",
                                 params={"limit": 1000}).json()["events"]
        finally:
            server.stop()
    accepted = next(e for e in events if e["type"] == "input.accepted")
    assert accepted["data"]["attachments"][0]["filename"] == "review.ipynb"
    decided = [(e["data"]["ordinal"], e["data"]["decision"], e["data"]["run_after"])
               for e in events if e["type"] == "notebook.edit.decided"]
    results = [(e["data"]["ordinal"], e["data"]["outcome"]) for e in events
               if e["type"] == "notebook.edit.result"]
    assert decided == [(0, "accepted", False), (2, "rejected", False), (1, "accepted", True)]
    assert results == [(0, "applied"), (1, "applied"), (0, "undone")]
    access = [e["data"]["allowed"] for e in events if e["type"] == "notebook.kernel_access"]
    assert access == [True, False]
    for name in ("notebook-proposal.png", "notebook-accepted.png", "notebook-undone.png"):
        assert (shots / name).stat().st_size > 10_000
