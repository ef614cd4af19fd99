"""Inline chat canvas: show bounded Markdown to the room, without saving anything."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from kaizen_server_extension.tools import Capability, RoomClass, ToolContext, hookimpl, tool
from kaizen_server_extension.tools.hookspecs import ToolRegistrar

MAX_CANVAS_CHARS = 20_000


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
    title: Annotated[str | None, Field(max_length=200, description="Optional heading.")] = None,
) -> dict[str, Any]:
    """Show Markdown on the chat canvas, inline in this conversation. Nothing is saved: to
    save, version, share or download content, use the artifact tools instead."""
    # No Library row, no external action. Raw HTML in the Markdown is rendered as text
    # by the panel's safe renderer, never executed; the payload says so explicitly.
    return {
        "presentation": {
            "kind": "canvas",
            "format": "markdown",
            "title": title,
            "markdown": markdown,
            "html": "escape",
        },
        "persisted": False,
        "summary": "The canvas is shown on screen; refer to it rather than repeating it.",
    }


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(show_chat_canvas)
