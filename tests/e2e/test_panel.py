"""End to end: the JupyterLab panel in headless Chromium against a real server + fake model.

Runs ``tests/e2e/panel_driver.mjs`` (playwright-core from ``labextension``'s devDependencies)
against a Jupyter server started with the Kaizen extension and JupyterLab. Needs the built
panel (``scripts/setup`` builds it), Node.js and ``/usr/bin/chromium`` (or
``KAIZEN_E2E_CHROMIUM``). Outside CI a missing Chromium skips; with ``CI=true`` it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.support.server import SERVER_TOKEN, ServerProcess, start_server

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("panel_driver.mjs")
CHROMIUM = os.environ.get("KAIZEN_E2E_CHROMIUM", "/usr/bin/chromium")
IN_CI = os.environ.get("CI") == "true"

CODE_ANSWER = (
    "## Plot it\n\nRun this:\n\n```python\nimport math\nprint(math.pi)\n```\n\n"
    "<img src=\"x\" onerror=\"window.__kaizenInjected=true\">"
    "<script>window.__kaizenInjected = true</script>\n"
)

SCRIPTS: list[dict[str, Any]] = [
    {"match": "stream please", "responses": [
        {"thinking": ["Let ", "me ", "think ", "about ", "it."],
         "text": ["This ", "answer ", "is ", "**streamed** ", "to ", "the ", "end", "."],
         "usage": {"prompt_tokens": 40, "completion_tokens": 8, "cost": 0.0012},
         "chunk_delay_ms": 250}]},
    {"match": "What does this print?", "responses": [{"text": "It prints pi."}]},
    {"match": "who can help", "responses": [
        {"tool_calls": [{"name": "list_available_agents", "arguments": {}}]},
        {"text": "You can use General and Search."}]},
    {"match": "show code", "responses": [{"text": CODE_ANSWER}]},
    {"match": "slow answer", "responses": [{"delay_ms": 20000, "text": "Finally."}]},
    {"match": "queued", "responses": [{"delay_ms": 150, "text": "Answered in order."}]},
    {"match": "say hello", "responses": [{"text": "Hello from the model."}]},
    {"responses": [{"text": "Default answer."}]},
]

ASKED = "What does this print?\n\nFrom notebook `Untitled.ipynb`, cell 1, id `"
ASKED_CODE = "\nprint(math.pi)\n```"
SENT = ["stream please", "who can help", "show code", ASKED, "slow answer", "queued after slow",
        "say hello\n(keyboard)"]


@pytest.fixture
def node() -> str:
    """Node.js, the built panel and playwright-core must be there; Chromium may skip."""
    if not Path(CHROMIUM).exists():
        if IN_CI:
            pytest.fail(f"CI must provide Chromium at {CHROMIUM} (apt-get install -y chromium)")
        pytest.skip(f"Chromium not found at {CHROMIUM} (apt-get install -y chromium)")
    node = shutil.which("node")
    assert node, "Node.js is needed to drive the browser"
    built = REPO / "kaizen_server_extension" / "labextension" / "package.json"
    assert built.exists(), "build the panel first: scripts/setup (or jlpm build:prod)"
    assert (REPO / "labextension" / "node_modules" / "playwright-core").exists(), (
        "install the panel's dev dependencies: cd labextension && jlpm install")
    return node


@pytest.fixture
def lab_server(node: str, tmp_path: Path) -> Iterator[ServerProcess]:
    fake = FakeOpenAI(SCRIPTS)
    root = tmp_path / "server"
    # No "get notified about Jupyter news?" toast over the panel.
    settings = root / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    server = start_server(root, sqlite_url_for(root / "kaizen.db"), None, extra_env={
        "KAIZEN_MODEL_BASE_URL": fake.base_url,
        "KAIZEN_MODEL": "fake-model",
    })
    try:
        yield server
    finally:
        server.stop()
        fake.close()


@pytest.mark.timeout(300)
def test_panel_end_to_end(node: str, lab_server: ServerProcess, tmp_path: Path) -> None:
    shots = Path(os.environ.get("KAIZEN_E2E_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "KAIZEN_E2E_BASE_URL": lab_server.base_url,
           "KAIZEN_E2E_TOKEN": SERVER_TOKEN, "KAIZEN_E2E_SCREENSHOTS": str(shots),
           "KAIZEN_E2E_CHROMIUM": CHROMIUM}
    owner = {"Authorization": f"token {SERVER_TOKEN}"}
    # The member's approval mode lives on the server; the panel mirrors it into JupyterLab's
    # settings registry when it starts.
    put = httpx.put(lab_server.base_url + "kaizen/api/members/me/settings", headers=owner,
                    json={"approval_mode": "never_ask"}, timeout=30)
    assert put.status_code == 200, put.text
    started = time.monotonic()
    result = subprocess.run([node, str(DRIVER)], env=env, capture_output=True, text=True,
                            timeout=240, cwd=REPO)
    steps = [json.loads(line) for line in result.stdout.splitlines()
             if line.startswith("{")]
    perf = next((s for s in steps if s["step"] == "long-conversation"), None)
    if perf:
        print(f"long conversation: {perf['events']} events in {perf['pages']} pages, latest "
              f"message rendered {perf['firstRenderMs']} ms after opening; {perf['rendered']} "
              f"runs in the DOM; next frame {perf['frameMs']} ms, typing echo {perf['typeMs']} ms")
    report = "\n".join(result.stdout.splitlines()[-20:]) + "\n" + result.stderr[-2000:]
    assert result.returncode == 0, (
        f"driver failed after {time.monotonic() - started:.0f}s "
        f"(screenshots in {shots}):\n{report}\n--- server log ---\n{lab_server.log()[-3000:]}")
    done = steps[-1]
    assert done["step"] == "done", report
    names = [s["step"] for s in steps]
    for step in ("conversation-created", "streaming-seen", "committed-seen", "tool-seen",
                 "markdown-seen", "inserted-into-notebook", "queue-seen", "stop-and-dequeue",
                 "reloaded", "keyboard-send", "approval-fixture", "usage-seen",
                 "ask-about-cell", "long-conversation", "settings-editor"):
        assert step in names, report

    # The server saw each message exactly once (idempotent sends, no duplicates).
    with httpx.Client(base_url=lab_server.base_url, headers=owner, timeout=30) as api:
        page = api.get(f"kaizen/api/conversations/{done['conversationId']}/journal",
                       params={"limit": 1000}).json()
        lab_settings = api.get("lab/api/settings/kaizen-jupyter:plugin").json()
        member_settings = api.get("kaizen/api/members/me/settings").json()
    # Changed in the Settings Editor at the end: saved to the registry and to the server.
    assert lab_settings["settings"].get("approvalMode") == "always_ask", lab_settings
    assert member_settings["approval_mode"] == "always_ask", member_settings
    inputs = [e["data"]["text"] for e in page["events"] if e["type"] == "input.accepted"]
    # "Ask about this cell": the selection, the notebook path, the cell index and id.
    asked = inputs[SENT.index(ASKED)]
    assert asked.startswith(ASKED) and asked.endswith(ASKED_CODE), asked
    assert ", selection on line 2:\n\n```" in asked, asked
    assert "import math" not in asked, asked
    inputs[SENT.index(ASKED)] = ASKED
    assert inputs == SENT
    terminals = [e["data"]["status"] for e in page["events"] if e["type"] == "run.terminal"]
    assert terminals.count("cancelled") == 1
    assert len(terminals) == len(SENT)


CONSOLE_SCRIPTS: list[dict[str, Any]] = [
    {"match": "keep x in the kernel", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": "x = 41", "language": "python", "persistent": True,
            "artifact_targets": []}}]},
        {"text": "x is in the kernel."}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture
def kernel_lab_server(node: str, tmp_path: Path) -> Iterator[ServerProcess]:
    """A JupyterLab server whose run_code kernels start (one warm), for the console."""
    fake = FakeOpenAI(CONSOLE_SCRIPTS)
    root = tmp_path / "server"
    settings = root / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    server = start_server(root, sqlite_url_for(root / "kaizen.db"), None, extra_env={
        "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model",
        "KAIZEN_KERNEL_POOL_SIZE": "1",
    })
    try:
        yield server
    finally:
        server.stop()
        fake.close()


@pytest.mark.timeout(300)
def test_panel_opens_the_persistent_kernel_as_a_console(
        node: str, kernel_lab_server: ServerProcess, tmp_path: Path) -> None:
    shots = Path(os.environ.get("KAIZEN_E2E_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "KAIZEN_E2E_BASE_URL": kernel_lab_server.base_url,
           "KAIZEN_E2E_TOKEN": SERVER_TOKEN, "KAIZEN_E2E_SCREENSHOTS": str(shots),
           "KAIZEN_E2E_CHROMIUM": CHROMIUM, "KAIZEN_E2E_SCENARIO": "kernel-console"}
    owner = {"Authorization": f"token {SERVER_TOKEN}"}
    put = httpx.put(kernel_lab_server.base_url + "kaizen/api/members/me/settings",
                    headers=owner, json={"approval_mode": "never_ask"}, timeout=30)
    assert put.status_code == 200, put.text
    result = subprocess.run([node, str(DRIVER)], env=env, capture_output=True, text=True,
                            timeout=240, cwd=REPO)
    steps = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    report = "\n".join(result.stdout.splitlines()[-20:]) + "\n" + result.stderr[-2000:]
    assert result.returncode == 0, (
        f"driver failed (screenshots in {shots}):\n{report}\n--- server log ---\n"
        f"{kernel_lab_server.log()[-3000:]}")
    assert steps[-1]["step"] == "done", report
    [disabled] = [s for s in steps if s["step"] == "console-disabled-without-kernel"]
    assert "No persistent run_code kernel" in disabled["hint"]
    [opened] = [s for s in steps if s["step"] == "kernel-console"]
    # The console's session is on the member's run_code kernel, listed by the kernels API.
    assert opened["kernelId"] and opened["kernelId"] in opened["kernels"], opened
    assert (shots / "panel-kernel-console.png").exists()


# The page's script would retitle it and flag the parent window; the sandbox stops both.
ARTIFACT_PAGE = (
    "<!doctype html><title>Demo</title><h1 id=\"greeting\">Hello from the artifact</h1>"
    "<script>document.getElementById('greeting').textContent = 'SCRIPT RAN';"
    "try { parent.__kaizenFrameScript = true } catch (e) {}</script>"
    "<img src=\"x\" onerror=\"parent.__kaizenFrameScript = true\">"
)
ARTIFACT_NOTE = ("# Notes\n\n- **A bold point**\n\n"
                 "<script>window.__kaizenInjected = true</script>\n")
ARTIFACT_SVG = ("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"120\" height=\"60\">"
                "<circle cx=\"30\" cy=\"30\" r=\"20\" fill=\"teal\"/>"
                "<script>parent.__kaizenFrameScript = true</script></svg>")

ARTIFACT_SCRIPTS: list[dict[str, Any]] = [
    {"match": "make the artifacts", "responses": [
        {"tool_calls": [
            {"name": "create_artifact", "arguments": {
                "title": "Demo page", "kind": "html", "content": ARTIFACT_PAGE}},
            {"name": "create_artifact", "arguments": {
                "title": "Notes", "kind": "markdown", "content": ARTIFACT_NOTE}},
            {"name": "create_artifact", "arguments": {
                "title": "Chart", "kind": "svg", "content": ARTIFACT_SVG}}]},
        {"text": "Made three artifacts."}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture
def artifacts_lab_server(node: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, FakeOpenAI]]:
    fake = FakeOpenAI(ARTIFACT_SCRIPTS)
    root = tmp_path / "server"
    settings = root / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    server = start_server(root, sqlite_url_for(root / "kaizen.db"), None, extra_env={
        "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model",
    })
    try:
        yield server, fake
    finally:
        server.stop()
        fake.close()


@pytest.mark.rule("R-121", "R-113")
@pytest.mark.timeout(300)
def test_panel_artifacts_pane(node: str, artifacts_lab_server: tuple[ServerProcess, FakeOpenAI],
                              tmp_path: Path) -> None:
    """The agent makes an html page, a Markdown note and an svg: the pane lists them, frames
    the page and the svg with ``sandbox=""`` (their scripts never run), renders the note
    through the sanitizer, follows a new version, downloads, and shows a governed result as
    native text and a table only."""
    server, fake = artifacts_lab_server
    shots = Path(os.environ.get("KAIZEN_E2E_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "KAIZEN_E2E_BASE_URL": server.base_url,
           "KAIZEN_E2E_TOKEN": SERVER_TOKEN, "KAIZEN_E2E_SCREENSHOTS": str(shots),
           "KAIZEN_E2E_CHROMIUM": CHROMIUM, "KAIZEN_E2E_SCENARIO": "artifacts",
           "KAIZEN_E2E_FAKE_URL": fake.root_url}
    owner = {"Authorization": f"token {SERVER_TOKEN}"}
    put = httpx.put(server.base_url + "kaizen/api/members/me/settings", headers=owner,
                    json={"approval_mode": "never_ask"}, timeout=30)
    assert put.status_code == 200, put.text
    result = subprocess.run([node, str(DRIVER)], env=env, capture_output=True, text=True,
                            timeout=240, cwd=REPO)
    steps = {s["step"]: s for s in (json.loads(line) for line in result.stdout.splitlines()
                                    if line.startswith("{"))}
    report = "\n".join(result.stdout.splitlines()[-20:]) + "\n" + result.stderr[-2000:]
    assert result.returncode == 0 and "done" in steps, (
        f"driver failed (screenshots in {shots}):\n{report}\n--- server log ---\n"
        f"{server.log()[-3000:]}")

    assert sorted(steps["artifacts-listed"]["titles"]) == ["Chart", "Demo page", "Notes"]
    framed = steps["html-sandboxed"]
    assert framed["sandbox"] == ""  # no allow-scripts, no allow-same-origin: no permission
    assert framed["greeting"] == "Hello from the artifact"  # the page's script did not run
    assert framed["leaked"] == {"parentFlag": False, "injected": False}
    assert steps["svg-sandboxed"]["sandbox"] == ""
    downloaded = steps["downloaded"]
    assert downloaded["filename"] == "Demo page.html"
    assert downloaded["route"]["status"] == 200
    assert downloaded["route"]["disposition"].startswith("attachment;")
    assert steps["versions"]["versions"] == ["1", "2 (latest)"]
    assert steps["markdown-rendered"]["heading"] == "Notes"
    governed = steps["governed-native"]
    assert governed["frames"] == 0
    # No script of any preview (page, note, svg, table cell) ran, in the frame or the panel.
    assert governed["scriptRan"] is False
    assert governed["cells"] == ["1", '<img src=x onerror="window.__kaizenInjected=true">',
                                 "2", "two"]  # producer data as text nodes, not markup
    assert governed["fallback"] == "<b>12 rows</b> elsewhere"
    assert "jobs:j-8:result" in governed["ref"]
    for shot in ("panel-artifacts-light.png", "panel-artifacts-governed.png",
                 "panel-artifacts-dark.png"):
        assert (shots / shot).exists(), shot

    # The server holds exactly what the agent wrote: two versions of the page.
    artifact_id = steps["done"]["artifactId"]
    with httpx.Client(base_url=server.base_url, headers=owner, timeout=30) as api:
        view = api.get(f"kaizen/api/artifacts/{artifact_id}").json()
    assert view["versions"] == [1, 2] and view["content"].startswith("<h1 id=\"greeting\">Second")
