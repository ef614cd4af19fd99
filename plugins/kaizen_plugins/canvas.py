"""Inline chat canvas: show bounded Markdown to the room, without saving anything."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kaizen_server_extension.protocol.tools import ON_SCREEN, markdown_item
from kaizen_server_extension.tools import (
    Capability,
    RoomClass,
    ToolContext,
    TrustedBody,
    hookimpl,
    tool,
)
from kaizen_server_extension.tools.canvas import MAX_CANVAS_LABEL_CHARS, MAX_CANVAS_MARKDOWN_CHARS
from kaizen_server_extension.tools.hookspecs import ToolRegistrar

MAX_CANVAS_CHARS = MAX_CANVAS_MARKDOWN_CHARS


@tool(
    name="show_chat_canvas",
    capability=Capability.READ,
    timeout_s=5,
    # It only re-presents what the model already wrote into the room's own conversation.
    room_class=RoomClass.AUDIENCE_SAFE_READ,
    surface="presentation",
)
async def show_chat_canvas(
    ctx: ToolContext,
    markdown: Annotated[
        str,
        Field(min_length=1, max_length=MAX_CANVAS_CHARS, description="The Markdown to show."),
    ],
    title: Annotated[str | None, Field(max_length=MAX_CANVAS_LABEL_CHARS,
                                       description="Optional heading.")] = None,
) -> TrustedBody:
    """Show Markdown on the chat canvas, inline in this conversation. Nothing is saved: to
    save, version, share or download content, use the artifact tools instead."""
    # No Library row, no external action. The Markdown leaves the payload for the
    # canvas, which the panel renders through its safe renderer (raw HTML stays inert, never
    # executed); the model keeps a marker saying it is on screen, which becomes
    # "nothing was rendered" should the canvas be dropped.
    return TrustedBody(
        {
            "presentation": {
                "kind": "canvas",
                "format": "markdown",
                "title": title,
                "html": "escape",
                "shown": ON_SCREEN,
            },
            "persisted": False,
        },
        canvas=[markdown_item(markdown, title)],
    )


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(show_chat_canvas)
