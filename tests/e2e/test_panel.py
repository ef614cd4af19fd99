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

from kaizen_server_extension.protocol.tools import ON_SCREEN
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


@pytest.fixture(scope="module")
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


# -- tests on a server with kernels (last in the module: the shared server lives until its end)

# Two declared files, one written after a pause long enough for the panel to show both as
# being generated; a 24 x 24 PNG built in place (no plotting library to import) is displayed.
GENERATING_PROGRAM = """
import struct, time, zlib
from IPython.display import Image, display

def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

side = 24
rows = b"".join(b"\\x00" + b"\\x00\\x80\\x80" * side for _ in range(side))
header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
png = (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", header)
       + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
time.sleep(2)
with open("summary.csv", "w") as f:
    f.write("region,total\\nnorth,12\\n")
# charts/plot.png is declared too, but this program only displays the chart.
display(Image(data=png, format="png"))
print("wrote the summary")
"""
GENERATED_TARGETS = ["summary.csv", "charts/plot.png"]
GENERATED_ANSWER = "The summary is ready; the chart is on screen."

# The member's file, attached from the file browser: run_code reads it by its own name with
# the csv module (no pandas needed) and writes a summary the Artifacts pane can save back.
SALES_CSV = "region,units\nnorth,12\nsouth,30\n"
SUM_SALES = """
import csv
with open("sales.csv", newline="") as f:
    rows = list(csv.DictReader(f))
total = sum(int(r["units"]) for r in rows)
with open("units.csv", "w") as out:
    out.write(f"total\\n{total}\\n")
print(f"TOTAL={total}")
"""


def _run_code_call(code: str, targets: list[str]) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_code", "arguments": {
        "code": code, "language": "python", "artifact_targets": targets}}]}


# The kernel server's model: one conversation per test, each with its own message.
KERNEL_SCRIPTS: list[dict[str, Any]] = [
    {"match": "How many units were sold in total?", "responses": [
        _run_code_call(SUM_SALES, ["units.csv"]), {"text": "42 units were sold in total."}]},
    {"match": "count the units again", "responses": [
        _run_code_call(SUM_SALES, []), {"text": "Still 42 units."}]},
    {"match": "and once more", "responses": [
        _run_code_call("print(6 * 7)", []), {"text": "42, once more."}]},
    {"match": "keep x in the kernel", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": "x = 41", "language": "python", "persistent": True,
            "artifact_targets": []}}]},
        {"text": "x is in the kernel."}]},
    {"match": "what changed in the numbers this week?", "responses": [
        _run_code_call("print(6 * 7)", []), {"text": "Nothing moved: 42."}]},
    {"match": "make the summary and chart", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": GENERATING_PROGRAM, "language": "python",
            "artifact_targets": GENERATED_TARGETS}}]},
        {"text": GENERATED_ANSWER}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="module")
def kernel_lab_server(node: str,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A JupyterLab server whose run_code kernels start (one warm), shared by the tests that
    need kernels: starting it is most of their cost."""
    fake = FakeOpenAI(KERNEL_SCRIPTS)
    root = tmp_path_factory.mktemp("kernel-lab") / "server"
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


def _run_driver(node: str, server: ServerProcess, shots: Path,
                scenario: str) -> tuple[dict[str, dict[str, Any]], str]:
    """Run one driver scenario against ``server``; its steps by name, and a failure report."""
    env = {**os.environ, "KAIZEN_E2E_BASE_URL": server.base_url,
           "KAIZEN_E2E_TOKEN": SERVER_TOKEN, "KAIZEN_E2E_SCREENSHOTS": str(shots),
           "KAIZEN_E2E_CHROMIUM": CHROMIUM, "KAIZEN_E2E_SCENARIO": scenario}
    put = httpx.put(server.base_url + "kaizen/api/members/me/settings",
                    headers={"Authorization": f"token {SERVER_TOKEN}"},
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
    return steps, report


def _shown(step: dict[str, Any]) -> dict[str, Any]:
    """What a driver step saw, without its name and time."""
    return {k: v for k, v in step.items() if k not in ("step", "ms")}


@pytest.mark.rule("R-236", "R-277")
@pytest.mark.timeout(300)
def test_panel_generation_placeholders_and_chat_canvas(
        node: str, kernel_lab_server: ServerProcess, tmp_path: Path) -> None:
    """R-236 and R-277 in a real browser. A run_code call declares two files, sleeps, writes
    one and displays a PNG. While it runs, the Artifacts pane shows both as "Generating …"
    with nothing to act on; once it settles, the written one is that exact stored version
    with a working Download button and the other is gone; the image is on the chat canvas
    under the call, as a checked ``data:image/png;base64,`` source, with the answer. A reload
    (every live frame lost) rebuilds the same state from the journal."""
    shots = Path(os.environ.get("KAIZEN_E2E_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    steps, report = _run_driver(node, kernel_lab_server, shots, "generation")

    # What the journal holds: the placeholders, the one stored file, the canvas image.
    conversation_id = steps["done"]["conversationId"]
    with httpx.Client(base_url=kernel_lab_server.base_url, timeout=30,
                      headers={"Authorization": f"token {SERVER_TOKEN}"}) as api:
        events = api.get(f"kaizen/api/conversations/{conversation_id}/journal",
                         params={"limit": 1000}).json()["events"]
    [requested] = [e["data"] for e in events
                   if e["type"] == "tool.requested" and e["data"]["name"] == "run_code"]
    [settled] = [e["data"] for e in events
                 if e["type"] == "tool.settled" and e["data"]["name"] == "run_code"]
    assert requested["placeholders"] == [{"target": t} for t in GENERATED_TARGETS]
    assert settled["outcome"] == "ok", settled
    [stored] = settled["files"]
    artifact_id = stored["artifact_id"]
    assert (stored["target"], stored["version"]) == ("summary.csv", 1), stored
    [image] = settled["canvas"]
    assert ON_SCREEN in settled["content"] and image["data"] not in settled["content"]

    # While the program ran: two placeholders, busy, with no control at all.
    generating = steps["generating"]
    assert generating["runCode"] == "running", report
    assert generating["generating"] == [
        {"target": t, "title": f"Generating {t}…", "busy": "true", "controls": 0}
        for t in GENERATED_TARGETS], report
    assert generating["generated"] == [] and generating["listed"] == [], report

    # Settled (the listing held back): the written file as its stored version, downloadable;
    # the placeholder of the file never written is gone.
    generated = steps["generated"]
    assert generated["runCode"] == "ok", report
    assert generated["generating"] == [], report
    assert generated["generated"] == [
        {"target": "summary.csv", "artifactId": artifact_id, "version": "1",
         "title": "summary.csv", "download": "Download"}], report
    downloaded = steps["generated-downloaded"]
    assert downloaded["filename"] == "summary.csv"
    assert downloaded["content"] == "region,total\nnorth,12\n"
    assert downloaded["route"] == f"/kaizen/api/artifacts/{artifact_id}/versions/1/download"
    assert downloaded["conversationId"] == conversation_id
    # Once the listing carries that version, its entry is the file.
    listed = steps["listed"]
    assert listed["generating"] == [] and listed["generated"] == [], report
    assert listed["listed"] == [{"artifactId": artifact_id, "title": "summary.csv"}], report

    # The chat canvas: the image the program displayed, under the run_code call, decoded by
    # the browser at its real size, and the answer.
    canvas = steps["canvas"]
    assert canvas["images"] == [{
        "src": f"data:image/png;base64,{image['data']}", "alt": image["alt"],
        "naturalWidth": 24, "naturalHeight": 24, "tool": "run_code"}], report
    assert canvas["answers"] == [GENERATED_ANSWER], report

    # After a reload, the journal alone gives the same pane and the same canvas.
    reloaded = steps["reloaded"]
    assert reloaded["generated"] == _shown(generated), report
    assert reloaded["listed"] == _shown(listed), report
    assert reloaded["canvas"] == _shown(canvas), report
    for shot in ("panel-generating.png", "panel-generated.png", "panel-canvas.png",
                 "panel-canvas-reloaded.png", "panel-generated-reloaded.png"):
        assert (shots / shot).exists(), shot


@pytest.mark.rule("R-454", "R-455", "R-223")
@pytest.mark.timeout(300)
def test_panel_attaches_a_csv_from_the_file_browser_and_run_code_reads_it(
        node: str, kernel_lab_server: ServerProcess, tmp_path: Path) -> None:
    """Issue 13 in a real browser, with the scripted model. "Attach to Kaizen" on sales.csv in
    JupyterLab's file browser makes a chip (the server read the file through its
    ContentsManager); the question's run_code reads ``sales.csv`` by name with the csv module,
    and the panel shows the answer and the tool's own output with the total. The generated
    units.csv is saved into the Jupyter folder, and refused over an existing file until
    "Overwrite". ``@sal`` completes to the file and attaches it; "Allow for this conversation"
    on the run_code card lets the next call run without one, until the grant is revoked."""
    root = Path(kernel_lab_server.env["JUPYTER_DATA_DIR"]).parent
    (root / "sales.csv").write_text(SALES_CSV)
    shots = Path(os.environ.get("KAIZEN_E2E_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    steps, report = _run_driver(node, kernel_lab_server, shots, "memberfiles")

    assert steps["file-attached"]["chip"] == "sales.csv", report
    answered = steps["file-answered"]
    assert answered["answer"] == "42 units were sold in total.", report
    assert answered["toolSaysTotal"] is True, report  # computed from the CSV, in the panel
    assert answered["chipsAfter"] == 0, report  # sent: the chip is gone

    saved = steps["saved-to-jupyter"]
    assert saved["proposed"] == "units.csv" and saved["savedPath"] == "units-copy.csv", report
    assert "already exists" in saved["existsText"], report
    assert (root / "units-copy.csv").read_text() == "total\n42\n"

    assert steps["allowed"]["completed"] == "count the units again in @sales.csv ", report
    assert "for this conversation" in steps["allowed"]["decidedText"], report
    used = steps["grant-used-and-revoked"]
    assert used["cardsAfter"] == used["cardsBefore"], report  # no new card for the next call

    conversation_id = steps["done"]["conversationId"]
    with httpx.Client(base_url=kernel_lab_server.base_url + "kaizen/api/", timeout=30,
                      headers={"Authorization": f"token {SERVER_TOKEN}"}) as api:
        events = api.get(f"conversations/{conversation_id}/journal",
                         params={"limit": 1000}).json()["events"]
        assert api.get(f"conversations/{conversation_id}/tool-grants").json() == []
    inputs = [e for e in events if e["type"] == "input.accepted"]
    # The file went with the first two messages, pinned; never with the third.
    assert [[a["filename"] for a in e["data"].get("attachments", [])] for e in inputs] == [
        ["sales.csv"], ["sales.csv"], []]
    settled = [json.loads(e["data"]["content"]) for e in events
               if e["type"] == "tool.settled" and e["data"]["name"] == "run_code"]
    assert [s["stdout"] for s in settled] == ["TOTAL=42\n", "TOTAL=42\n", "42\n"]
    decided = [e["data"] for e in events if e["type"] == "approval.decided"]
    assert [d["scope"] for d in decided] == ["conversation"]
    for shot in ("panel-file-attached.png", "panel-file-answer.png", "panel-save-exists.png",
                 "panel-allow-card.png", "panel-allowed-here.png"):
        assert (shots / shot).exists(), shot


@pytest.mark.rule("R-051", "R-055")
def test_panel_makes_a_task_runs_it_now_and_as_a_safe_test(
        node: str, kernel_lab_server: ServerProcess, tmp_path: Path) -> None:
    """Issue 20 in a real browser: a daily task made from the conversation's Tasks fold, run
    now and then as a safe test. Both runs are the owner's inputs in this room with their
    answers in the transcript; the safe test ran its run_code (isolated execution) and
    nothing else; the task is stored with its cadence."""
    shots = Path(os.environ.get("KAIZEN_E2E_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    steps, report = _run_driver(node, kernel_lab_server, shots, "tasks")
    assert "Weekly numbers" in steps["task-created"]["listed"], report
    assert "daily" in steps["task-created"]["listed"], report
    assert steps["task-tested"]["answers"] == ["Nothing moved: 42.", "Nothing moved: 42."], report
    conversation_id = steps["done"]["conversationId"]
    with httpx.Client(base_url=kernel_lab_server.base_url + "kaizen/api/", timeout=30,
                      headers={"Authorization": f"token {SERVER_TOKEN}"}) as api:
        (task,) = [t for t in api.get("tasks").json() if t["conversation_id"] == conversation_id]
        assert task["interval_seconds"] == 86400 and task["status"] == "active"
        firings = api.get(f"tasks/{task['id']}").json()["firings"]
        assert sorted((f["kind"], f["posture"], f["run_status"]) for f in firings) == [
            ("run_now", "task_run", "completed"), ("safe_test", "task_test", "completed")]
        events = api.get(f"conversations/{conversation_id}/journal",
                         params={"limit": 1000}).json()["events"]
    runs = [e["data"] for e in events if e["type"] == "tool.settled"]
    assert [r["name"] for r in runs] == ["run_code", "run_code"]
    assert all(r["outcome"] == "ok" for r in runs), runs
    assert (shots / "panel-tasks.png").exists()
