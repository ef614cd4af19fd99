"""The chat canvas: rich tool output shown to the room in place of the model's copy of it.

Spec: "A dropped canvas retracts its own claim". A tool moves rich output — show_chat_canvas's
Markdown, the PNG images a run_code program displayed — out of its model-facing payload onto
the canvas (``ToolCallResult.canvas``), and leaves one :data:`ON_SCREEN` marker per item in
the payload, so the model summarizes what the member sees instead of reproducing it.

The host materializes the canvas when it journals the call's ``tool.settled``
(:func:`materialize`): every item is validated and bounded (the limits below) and journaled as
the event's ``canvas``. Materializing is additive: when it fails for any reason — over a
bound, an image that is not a complete PNG, an exception while building or journaling it —
the whole canvas is dropped and the call's outcome stands as it was (R-277). The markers were
written before that point, so dropping the canvas also replaces every one of them in the
content with :data:`NOTHING_RENDERED` (R-278); otherwise the one remaining instruction about
the result would be to summarize something nobody was shown. The same withdrawal applies to
any marker in a result that has no canvas at all (a canvas a result guardrail removed, a call
made from kernel code, text that merely quotes the marker). One operator WARNING, without
content, records each drop.
"""

from __future__ import annotations

import base64
import binascii
import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from kaizen_server_extension.policy.redaction import redact_text
from kaizen_server_extension.protocol.tools import (
    MARKDOWN_MEDIA_TYPE,
    ON_SCREEN,
    PNG_MEDIA_TYPE,
    CanvasItem,
    ToolCallResult,
)

log = logging.getLogger("kaizen.canvas")

#: What replaces each marker when the canvas was dropped (R-278).
NOTHING_RENDERED = "nothing was rendered; do not describe rows or images you were not given"

# Bounds of one call's canvas. A canvas is journaled with its call's tool.settled and so is
# read back with every journal page and sent to every observer of the room: together they keep
# one event near a megabyte, whatever the tool produced.
#: Items in one call's canvas.
MAX_CANVAS_ITEMS = 8
#: Characters of one Markdown item (show_chat_canvas's own argument bound).
MAX_CANVAS_MARKDOWN_CHARS = 20_000
#: Decoded bytes of one image. Below SANDBOX_MAX_OUTPUT_BYTES' default (1 MiB of base64), so
#: a program can display an image the canvas will not take.
MAX_CANVAS_IMAGE_BYTES = 512 * 1024
#: Width and height of one image, in pixels: a small file can declare a huge bitmap, and the
#: browser, not the server, would pay for decoding it.
MAX_CANVAS_IMAGE_SIDE = 8192
#: Journaled characters of the whole canvas (Markdown plus base64 image data).
MAX_CANVAS_TOTAL_CHARS = 1024 * 1024
#: Characters of an item's title or alternative text.
MAX_CANVAS_LABEL_CHARS = 200

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The first chunk of every PNG: length 13, type IHDR (width, height, ...).
_PNG_IHDR = b"\x00\x00\x00\x0dIHDR"
# The last chunk of a complete PNG: length 0, type IEND and its fixed CRC.
_PNG_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"
_BASE64_WHITESPACE = str.maketrans("", "", " \t\r\n")


class CanvasRejected(Exception):
    """The canvas cannot be shown; ``code`` says why without quoting any of it."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def withdraw_claims(content: str) -> str:
    """``content`` with every on-screen marker replaced by :data:`NOTHING_RENDERED`."""
    return content.replace(ON_SCREEN, NOTHING_RENDERED)


def _label(value: str | None) -> str | None:
    if value is None:
        return None
    if len(value) > MAX_CANVAS_LABEL_CHARS:
        raise CanvasRejected("label_too_long")
    return redact_text(value)


def _png_dimensions(png: bytes) -> tuple[int, int]:
    """Width and height of a complete PNG; :class:`CanvasRejected` for anything else."""
    if (not png.startswith(_PNG_SIGNATURE) or png[8:16] != _PNG_IHDR
            or not png.endswith(_PNG_IEND) or len(png) < 33 + len(_PNG_IEND)):
        raise CanvasRejected("invalid_image")
    width, height = struct.unpack(">II", png[16:24])
    if not (0 < width <= MAX_CANVAS_IMAGE_SIDE and 0 < height <= MAX_CANVAS_IMAGE_SIDE):
        raise CanvasRejected("image_over_bounds")
    return width, height


def _image_data(item: CanvasItem) -> dict[str, Any]:
    if item.media_type != PNG_MEDIA_TYPE:
        raise CanvasRejected("unsupported_image")
    encoded = item.data.translate(_BASE64_WHITESPACE)
    # Checked before decoding: an oversized image costs no decode.
    if len(encoded) > (MAX_CANVAS_IMAGE_BYTES + 2) // 3 * 4:
        raise CanvasRejected("image_over_bounds")
    try:
        png = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise CanvasRejected("invalid_image") from None
    if len(png) > MAX_CANVAS_IMAGE_BYTES:
        raise CanvasRejected("image_over_bounds")
    width, height = _png_dimensions(png)
    # Re-encoded from the checked bytes: what the panel puts in its data: URI is exactly them.
    return {"kind": "image", "media_type": PNG_MEDIA_TYPE,
            "data": base64.b64encode(png).decode("ascii"),
            "alt": _label(item.title) or "An image the tool displayed",
            "width": width, "height": height}


def _markdown_data(item: CanvasItem) -> dict[str, Any]:
    if item.media_type != MARKDOWN_MEDIA_TYPE:
        raise CanvasRejected("unsupported_markdown")
    if not item.data.strip():
        raise CanvasRejected("empty_markdown")
    if len(item.data) > MAX_CANVAS_MARKDOWN_CHARS:
        raise CanvasRejected("markdown_over_bounds")
    # Credentials are scrubbed as in every projection; the panel's renderer is the one that
    # keeps model-authored HTML inert.
    return {"kind": "markdown", "title": _label(item.title), "markdown": redact_text(item.data)}


def canvas_data(items: Sequence[CanvasItem]) -> list[dict[str, Any]]:
    """The ``canvas`` of ``tool.settled``: every item validated and within bounds, or
    :class:`CanvasRejected`."""
    if len(items) > MAX_CANVAS_ITEMS:
        raise CanvasRejected("too_many_items")
    shown: list[dict[str, Any]] = []
    total = 0
    for item in items:
        if item.kind == "markdown":
            data = _markdown_data(item)
            total += len(data["markdown"])
        elif item.kind == "image":
            data = _image_data(item)
            total += len(data["data"])
        else:
            raise CanvasRejected("unknown_item")
        if total > MAX_CANVAS_TOTAL_CHARS:
            raise CanvasRejected("canvas_over_bounds")
        shown.append(data)
    return shown


@dataclass(frozen=True, slots=True)
class Materialized:
    """A settled result as the model and the journal get it, and its canvas."""

    #: The result to hand back: unchanged, or without its canvas and with its claims withdrawn.
    result: ToolCallResult
    #: The ``canvas`` to journal, or None when there is none to show.
    data: list[dict[str, Any]] | None = None
    #: True when the result had a canvas that could not be shown.
    dropped: bool = False


def without_canvas(result: ToolCallResult) -> ToolCallResult:
    """``result`` showing nothing: no canvas, and no marker claiming otherwise. The outcome and
    everything else stand (R-277, R-278)."""
    content = withdraw_claims(result.content)
    if not result.canvas and content == result.content:
        return result
    return replace(result, canvas=(), content=content)


def drop(result: ToolCallResult, reason: str, *, run_id: str) -> Materialized:
    """Drop ``result``'s canvas: one operator line naming the call and the reason code, never
    any of the canvas or the result."""
    log.warning("run %s: dropped the chat canvas of %s call %s (%s); the result stands",
                run_id, result.name, result.call_id, reason)
    return Materialized(without_canvas(result), None, dropped=True)


def materialize(result: ToolCallResult, *, run_id: str) -> Materialized:
    """Validate and bound ``result``'s canvas for the journal; on any failure, drop it."""
    if not result.canvas:
        # Nothing is shown, so nothing may be claimed as shown.
        return Materialized(without_canvas(result))
    try:
        return Materialized(result, canvas_data(result.canvas))
    except CanvasRejected as rejected:
        return drop(result, rejected.code, run_id=run_id)
    except Exception as exc:
        # Presentation is additive: whatever went wrong building it, the result stands.
        return drop(result, f"failed: {type(exc).__name__}", run_id=run_id)
