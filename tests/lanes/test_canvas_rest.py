"""The chat canvas through the REST API: a real server, a real kernel, a scripted model
(R-277, R-278).

A run_code program displays an image. The image is shown on the chat canvas — journaled with
the call's ``tool.settled`` as ``canvas`` — while the model's next request carries only a
marker saying it is on screen. An image over the canvas bound is dropped instead: the call is
still ``ok``, and the model is told nothing was rendered. The materialization's own rules are
tested in ``tests/lanes/test_canvas.py``; the panel's rendering in
``labextension/test/canvas.test.ts``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from kaizen_server_extension.protocol.tools import ON_SCREEN
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from kaizen_server_extension.tools.canvas import MAX_CANVAS_IMAGE_BYTES, NOTHING_RENDERED
from tests.conftest import BACKENDS, served_by
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.server import ServerProcess

# A chart drawn with matplotlib and shown the way an analyst would: the kernel's inline
# backend turns plt.show() into PNG display data.
CHART = """
import matplotlib.pyplot as plt
plt.figure(figsize=(2, 2), dpi=40)
plt.plot([1, 2, 3], [3, 1, 2])
plt.show()
print("drawn")
"""

# A valid PNG of incompressible pixels, larger than the canvas takes but within the sandbox's
# output budget, displayed as an image.
HUGE_PICTURE = f"""
import os, struct, zlib
from IPython.display import Image, display

def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

side = 420
rows = b"".join(b"\\x00" + os.urandom(side * 3) for _ in range(side))
header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
png = (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", header)
       + chunk(b"IDAT", zlib.compress(rows, 0)) + chunk(b"IEND", b""))
assert len(png) > {MAX_CANVAS_IMAGE_BYTES}
display(Image(data=png, format="png"))
print("displayed", len(png), "bytes")
"""


def _run_code(code: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_code", "arguments": {
        "code": code, "language": "python", "artifact_targets": []}}]}


SCRIPTS = [
    {"match": "draw a chart", "responses": [
        _run_code(CHART), {"text": "The chart shows a dip at x = 2."}]},
    {"match": "huge picture", "responses": [
        _run_code(HUGE_PICTURE), {"text": "The picture could not be shown."}]},
]


@dataclass
class CanvasServer:
    server: ServerProcess
    fake: FakeOpenAI

    def tool_message(self, prompt: str) -> str:
        """The run_code result the model received after the call made for ``prompt``."""
        for request in self.fake.requests():
            messages = request["messages"]
            users = [m for m in messages if m["role"] == "user"]
            tools = [m for m in messages if m["role"] == "tool"]
            if users and prompt in str(users[-1]["content"]) and tools:
                return str(tools[-1]["content"])
        raise AssertionError(f"the model never received a tool result for {prompt!r}")


@pytest.fixture(scope="module", params=BACKENDS)
def canvas_server(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[CanvasServer]:
    root = tmp_path_factory.mktemp(f"canvas-{request.param}")
    with FakeOpenAI(SCRIPTS) as fake, served_by(
            str(request.param), root, fake,
            extra_env={"KAIZEN_KERNEL_POOL_SIZE": "1"}) as server:
        yield CanvasServer(server, fake)


def _settled_call(client: httpx.Client, text: str) -> dict[str, Any]:
    """Send ``text``, wait for the run to complete, and return its run_code call's
    ``tool.settled`` data from the durable journal."""
    room = _room(client)
    accepted = _send(client, room, text)
    run = _settled(client, accepted["run_id"], timeout=90)
    assert run["status"] == "completed", run
    [settled] = [e["data"] for e in _events(client, room, accepted["run_id"])
                 if e["type"] == "tool.settled"]
    return dict(settled)


@pytest.mark.rule("R-277")
def test_a_displayed_image_is_shown_on_the_canvas_and_the_model_gets_only_a_marker(
        canvas_server: CanvasServer) -> None:
    with canvas_server.server.client("alice") as alice:
        settled = _settled_call(alice, "please draw a chart")
    assert settled["outcome"] == "ok", settled
    [image] = settled["canvas"]
    assert image["kind"] == "image" and image["media_type"] == "image/png"
    png = base64.b64decode(image["data"], validate=True)
    # An 80 px figure; the inline backend saves it with a "tight" box around what was drawn.
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert 40 <= image["width"] <= 160 and 40 <= image["height"] <= 160
    assert image["alt"] == "Image 1 of 1 displayed by the program"
    # The model got the journaled content: the program's output and a marker, not the image.
    received = canvas_server.tool_message("please draw a chart")
    assert received == settled["content"]
    assert ON_SCREEN in received and image["data"] not in received
    assert json.loads(received)["stdout"] == "drawn\n"


@pytest.mark.rule("R-277", "R-278")
def test_an_image_over_the_bound_is_dropped_the_call_stays_ok_and_the_model_is_told(
        canvas_server: CanvasServer) -> None:
    with canvas_server.server.client("alice") as alice:
        settled = _settled_call(alice, "show me a huge picture")
    # The presentation failed; the call did not.
    assert settled["outcome"] == "ok" and settled["failure_domain"] == "none", settled
    assert "canvas" not in settled and settled["canvas_dropped"] is True
    # The marker written before the drop is withdrawn from what the model reads.
    received = canvas_server.tool_message("show me a huge picture")
    assert received == settled["content"]
    assert ON_SCREEN not in received and NOTHING_RENDERED in received
    body = json.loads(received)
    assert body["status"] == "ok" and body["stdout"].startswith("displayed ")
    # One content-free operator line records the drop.
    log = canvas_server.server.log()
    assert log.count("dropped the chat canvas") == 1
    assert "image_over_bounds" in log and "displayed " not in log
