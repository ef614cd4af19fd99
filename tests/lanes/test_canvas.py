"""Materializing the chat canvas, and dropping it (spec: A dropped canvas retracts its own
claim; R-277, R-278).

A call's rich output travels on ``ToolCallResult.canvas`` while its payload keeps an on-screen
marker per item. The host validates and bounds the canvas as it journals ``tool.settled``;
any failure — over a bound, an image that is not a PNG, an exception building or journaling
it — drops the canvas, leaves the outcome as it was and replaces every marker with the
"nothing was rendered" statement. Here: the materialization itself, the pipeline carrying the
canvas, and the host's journaling, over a real store. Through REST with a real kernel:
``tests/lanes/test_canvas_rest.py``.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import struct
import zlib
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from kaizen_kernel.execute import DisplayItem
from kaizen_kernel.service import RunCodeResult
from kaizen_server_extension.host import run_host as host_module
from kaizen_server_extension.host.run_host import RunHost
from kaizen_server_extension.host.tool_backend import BridgeBinding
from kaizen_server_extension.policy.guardrails import (
    ALLOW,
    Deny,
    GuardrailResult,
    Redact,
    ResultVerdict,
    result_guardrail,
)
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.tools import (
    ON_SCREEN,
    CanvasItem,
    Capability,
    FailureDomain,
    ToolCallRequest,
    ToolCallResult,
    ToolOutcome,
    markdown_item,
    png_item,
)
from kaizen_server_extension.runtime.port import TraceEvent
from kaizen_server_extension.store import Store
from kaizen_server_extension.tools.canvas import (
    MAX_CANVAS_IMAGE_BYTES,
    MAX_CANVAS_IMAGE_SIDE,
    MAX_CANVAS_ITEMS,
    MAX_CANVAS_MARKDOWN_CHARS,
    MAX_CANVAS_TOTAL_CHARS,
    NOTHING_RENDERED,
    materialize,
)
from kaizen_server_extension.tools.types import TrustedBody
from tests.lanes.test_call_transactions import _no_model, _turn
from tests.policy.fakes import BUNDLE, harness, make_tool, returning


def png(width: int = 2, height: int = 2, *, noise: int = 0) -> bytes:
    """A complete PNG (8-bit RGB); ``noise`` adds incompressible bytes in a private chunk, so a
    small image can be made as large as a test needs."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    rows = b"".join(b"\x00" + b"\x80\x40\x20" * width for _ in range(height))
    extra = chunk(b"zzZz", random.Random(noise).randbytes(noise)) if noise else b""
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + extra + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _result(*items: CanvasItem, outcome: ToolOutcome = ToolOutcome.OK) -> ToolCallResult:
    """A settled call whose payload holds one on-screen marker per canvas item, as a tool
    that moved them out writes it."""
    content = json.dumps({"outputs": [f"[item {n}: {ON_SCREEN}]" for n in range(len(items))],
                          "stdout": "done"})
    return ToolCallResult(call_id="call-7", name="run_code", outcome=outcome, content=content,
                          failure_domain=(FailureDomain.NONE if outcome is ToolOutcome.OK
                                          else FailureDomain.CALLER),
                          evidence=True, canvas=items)


GOOD_IMAGE = png_item(b64(png(3, 2)), "Image 1 of 1 displayed by the program")
GOOD_MARKDOWN = markdown_item("# Totals\n\n| region | total |\n| --- | --- |\n| north | 12 |",
                              "Totals")


class _Broken(str):
    """Image data that breaks while the canvas is built (an unexpected exception)."""

    def translate(self, *args: Any) -> str:
        raise RuntimeError("secret-ish detail that must not reach the log")


DROPPED: dict[str, tuple[CanvasItem, ...]] = {
    "too many items": (GOOD_IMAGE,) * (MAX_CANVAS_ITEMS + 1),
    "image over the byte bound": (
        png_item(b64(png(noise=MAX_CANVAS_IMAGE_BYTES)), "big"),),
    "image over the side bound": (png_item(b64(png(MAX_CANVAS_IMAGE_SIDE + 1, 1)), "wide"),),
    "markdown over its bound": (markdown_item("x" * (MAX_CANVAS_MARKDOWN_CHARS + 1)),),
    "canvas over the total bound": tuple(
        png_item(b64(png(noise=MAX_CANVAS_IMAGE_BYTES - 1000)), f"part {n}")
        for n in range(MAX_CANVAS_TOTAL_CHARS // MAX_CANVAS_IMAGE_BYTES + 1)),
    "image that is not base64": (png_item("not base64 at all!", "x"),),
    "image that is not a PNG": (png_item(b64(b"GIF89a" + bytes(64)), "gif"),),
    "truncated PNG": (png_item(b64(png()[:-12]), "cut"),),
    "image of another type": (CanvasItem("image", b64(png()), "image/svg+xml", "svg"),),
    "exception while building": (GOOD_MARKDOWN, CanvasItem("image", _Broken("AAAA"),
                                                           "image/png", "x")),
}


@pytest.mark.rule("R-277", "R-278")
@pytest.mark.parametrize("items", list(DROPPED.values()), ids=list(DROPPED))
@pytest.mark.parametrize("outcome", [ToolOutcome.OK, ToolOutcome.ERROR])
def test_a_canvas_that_cannot_be_shown_is_dropped_and_its_claims_withdrawn(
        items: tuple[CanvasItem, ...], outcome: ToolOutcome,
        caplog: pytest.LogCaptureFixture) -> None:
    settled = _result(*items, outcome=outcome)
    with caplog.at_level(logging.WARNING, logger="kaizen.canvas"):
        shown = materialize(settled, run_id="run-1")
    assert shown.dropped and shown.data is None and shown.result.canvas == ()
    # The result stands: the outcome and everything but the claims are as they were.
    assert shown.result.outcome is outcome
    assert replace(shown.result, content=settled.content, canvas=items) == settled
    # Every on-screen marker now says nothing was rendered.
    assert ON_SCREEN not in shown.result.content
    assert shown.result.content.count(NOTHING_RENDERED) == len(items)
    assert json.loads(shown.result.content)["stdout"] == "done"
    # One operator line naming the call, with none of the canvas or the result in it.
    [line] = [r.getMessage() for r in caplog.records if r.name == "kaizen.canvas"]
    assert "call-7" in line and "dropped the chat canvas" in line
    assert "secret-ish" not in line and "done" not in line and "AAAA" not in line


@pytest.mark.rule("R-277")
def test_a_valid_canvas_is_journaled_bounded_and_the_markers_stay(
        caplog: pytest.LogCaptureFixture) -> None:
    wrapped = png_item("\n".join(textwrap_chunks(b64(png(3, 2)))), "Image 1 of 1")
    settled = _result(GOOD_MARKDOWN, wrapped)
    with caplog.at_level(logging.WARNING, logger="kaizen.canvas"):
        shown = materialize(settled, run_id="run-1")
    assert not shown.dropped and shown.result == settled
    assert shown.data == [
        {"kind": "markdown", "title": "Totals", "markdown": GOOD_MARKDOWN.data},
        # Line-wrapped base64 (as kernels send it) is checked and journaled canonical.
        {"kind": "image", "media_type": "image/png", "data": b64(png(3, 2)),
         "alt": "Image 1 of 1", "width": 3, "height": 2},
    ]
    assert not caplog.records


def textwrap_chunks(text: str, width: int = 16) -> list[str]:
    return [text[i:i + width] for i in range(0, len(text), width)]


@pytest.mark.rule("R-278")
def test_a_result_without_a_canvas_keeps_no_on_screen_claim(
        caplog: pytest.LogCaptureFixture) -> None:
    # e.g. text that merely quotes the marker, or a canvas a result guardrail removed.
    settled = replace(_result(GOOD_IMAGE), canvas=())
    with caplog.at_level(logging.WARNING, logger="kaizen.canvas"):
        shown = materialize(settled, run_id="run-1")
    assert not shown.dropped and shown.data is None
    assert ON_SCREEN not in shown.result.content and NOTHING_RENDERED in shown.result.content
    assert shown.result.outcome is ToolOutcome.OK
    assert not caplog.records  # no canvas was dropped
    plain = ToolCallResult(call_id="c", name="t", outcome=ToolOutcome.OK, content="{}")
    assert materialize(plain, run_id="run-1").result is plain


@pytest.mark.rule("R-277")
def test_run_code_moves_displayed_images_to_the_canvas_and_keeps_a_marker() -> None:
    image = b64(png(4, 4))
    result = RunCodeResult(status="ok", outcome=ToolOutcome.OK,
                           failure_domain=FailureDomain.NONE, language="python",
                           persistent=False, displays=[
                               DisplayItem(text_plain="<Figure size 4x4>", image_png_b64=image),
                               DisplayItem(text_plain="42")])
    payload = json.dumps(result.to_payload())
    assert image not in payload  # the model never gets the bytes
    assert payload.count(ON_SCREEN) == 1 and "[image/png, " in payload
    assert result.canvas() == (png_item(image, "Image 1 of 1 displayed by the program"),)


# --- the pipeline carries the canvas beside the projection --------------------------------

def _canvas_tool() -> Any:
    return make_tool("show", returning(TrustedBody({"shown": ON_SCREEN}, canvas=[GOOD_MARKDOWN])))


@pytest.mark.rule("R-277")
async def test_the_pipeline_carries_the_canvas_and_projects_only_the_marker() -> None:
    result = await harness(_canvas_tool()).call("show")
    assert result.outcome is ToolOutcome.OK and result.canvas == (GOOD_MARKDOWN,)
    assert json.loads(result.content) == {"shown": ON_SCREEN}


def _withhold(result: GuardrailResult) -> ResultVerdict:
    return Deny("not for this room", code="withheld")


def _rewrite(result: GuardrailResult) -> ResultVerdict:
    return Redact(result.content.replace('"shown"', '"display"'))


@pytest.mark.rule("R-278")
@pytest.mark.parametrize("check", [_withhold, _rewrite, lambda result: ALLOW])
async def test_a_canvas_the_result_guardrails_did_not_pass_whole_is_not_shown(
        check: Callable[[GuardrailResult], ResultVerdict]) -> None:
    """A result check judges the text alone: a canvas beside text it withheld or rewrote is
    not shown either, and the host then withdraws any claim left in the text."""
    result = await harness(_canvas_tool(), guardrails=[result_guardrail(check)]).call("show")
    if check is _withhold or check is _rewrite:
        assert result.canvas == ()
        assert ON_SCREEN not in materialize(result, run_id="r").result.content
    else:
        assert result.canvas == (GOOD_MARKDOWN,)


# --- the host journals the canvas, or drops it -------------------------------------------

async def _settle(store: Store, settled: ToolCallResult) -> tuple[ToolCallResult,
                                                                   dict[str, Any]]:
    """Settle one call whose backend returns ``settled`` through a real run's host; the
    returned result (what the model gets) and the journaled ``tool.settled`` data."""
    turn = await _turn(store)

    async def call_tool(bundle: AuthorityBundle, request: ToolCallRequest,
                        scope: object = None, /) -> ToolCallResult:
        return replace(settled, call_id=request.call_id)

    host = RunHost(store=store, lane=turn.lane, bundle=turn.bundle, model_stream=_no_model,
                   call_tool=call_tool, publish_live=lambda conversation, kind, data: None,
                   lease=timedelta(seconds=30))
    await host.publish(turn.bundle, TraceEvent("tool.requested", {
        "step": 1, "call_id": "c1", "name": "probe_read", "arguments": "{}"}))
    result = await host.call_tool(turn.bundle, ToolCallRequest("c1", "probe_read", "{}", 1))
    events = await store.journal.read(turn.bundle.conversation_id, "alice", limit=500)
    [journaled] = [e.data for e in events if e.type == "tool.settled"]
    return result, dict(journaled)


@pytest.mark.rule("R-277")
async def test_the_host_journals_the_canvas_with_the_settled_call(store: Store) -> None:
    result, journaled = await _settle(store, _result(GOOD_MARKDOWN, GOOD_IMAGE))
    assert journaled["outcome"] == "ok"
    assert [item["kind"] for item in journaled["canvas"]] == ["markdown", "image"]
    assert journaled["canvas"][1]["data"] == GOOD_IMAGE.data
    assert "canvas_dropped" not in journaled
    # The model gets exactly what is journaled: the markers, never the canvas.
    assert result.content == journaled["content"] and ON_SCREEN in result.content
    assert GOOD_IMAGE.data not in result.content


@pytest.mark.rule("R-277", "R-278")
async def test_the_host_drops_an_invalid_canvas_and_the_call_still_settles_ok(
        store: Store) -> None:
    result, journaled = await _settle(store, _result(png_item("bm90IGEgcG5n", "x")))
    assert result.outcome is ToolOutcome.OK and journaled["outcome"] == "ok"
    assert "canvas" not in journaled and journaled["canvas_dropped"] is True
    assert result.content == journaled["content"]
    assert ON_SCREEN not in result.content and NOTHING_RENDERED in result.content


@pytest.mark.rule("R-277", "R-278")
async def test_a_canvas_that_fails_to_journal_is_dropped_and_the_call_settles_without_it(
        store: Store, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    real_journal = host_module.journal_while_live

    def journal(run_id: str, fence: int, kind: str, actor: str, data: dict[str, Any],
                **kwargs: Any) -> Any:
        if "canvas" in data:
            def refused() -> Any:
                raise OverflowError("the database refused the event")
                yield  # a unit: the refusal comes when it runs
            return refused()
        return real_journal(run_id, fence, kind, actor, data, **kwargs)

    monkeypatch.setattr(host_module, "journal_while_live", journal)
    with caplog.at_level(logging.WARNING, logger="kaizen.canvas"):
        result, journaled = await _settle(store, _result(GOOD_MARKDOWN))
    assert result.outcome is ToolOutcome.OK and journaled["outcome"] == "ok"
    assert "canvas" not in journaled and journaled["canvas_dropped"] is True
    assert result.content == journaled["content"]
    assert ON_SCREEN not in result.content and NOTHING_RENDERED in result.content
    [line] = [r.getMessage() for r in caplog.records if r.name == "kaizen.canvas"]
    assert "journal_failed: OverflowError" in line and "refused" not in line


@pytest.mark.rule("R-278")
async def test_a_call_from_kernel_code_renders_nothing_and_claims_nothing() -> None:
    """A kernel's ``tools.call`` goes through the run's pipeline but never through the host's
    journaling, so nothing it returns is on screen."""
    async def call(bundle: AuthorityBundle, request: ToolCallRequest) -> ToolCallResult:
        return ToolCallResult(call_id=request.call_id, name=request.name,
                              outcome=ToolOutcome.OK, content=json.dumps({"shown": ON_SCREEN}),
                              canvas=(GOOD_MARKDOWN,))

    bridge = BridgeBinding(BUNDLE, call, {"show_chat_canvas": Capability.READ})
    assert await bridge.dispatch("show_chat_canvas", {"markdown": "# hi"}) == {
        "shown": NOTHING_RENDERED}
