"""``visualize_read_me``: the presentation guidelines loader.

Before presenting a result visually, the agent reads the guideline for that kind of output.
The guidelines are Markdown files bundled with this package (``guidelines/<topic>.md``); the
tool only reads them: no database, network, identity argument or mutation, so it is the same
for every member and safe in any room.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from kaizen_server_extension.tools import Capability, RoomClass, ToolContext, hookimpl, tool
from kaizen_server_extension.tools.hookspecs import ToolRegistrar

MAX_GUIDELINE_CHARS = 8_000


def _load() -> dict[str, str]:
    folder = resources.files(__package__) / "guidelines"
    return {
        entry.name.removesuffix(".md"): entry.read_text(encoding="utf-8")[:MAX_GUIDELINE_CHARS]
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".md")
    }


# Read once at import: the set of topics is part of the tool's schema, so it is fixed for the
# process like any other descriptor.
GUIDELINES: dict[str, str] = _load()
if TYPE_CHECKING:
    Topic = str
else:  # an enum in the schema, so the model sees the topics it may ask for
    Topic = Literal[tuple(GUIDELINES)]


@tool(
    name="visualize_read_me",
    capability=Capability.READ,
    timeout_s=5,
    room_class=RoomClass.AUDIENCE_SAFE_READ,
    surface="presentation",
)
async def visualize_read_me(
    ctx: ToolContext,
    topic: Annotated[Topic, Field(description="Which kind of presentation to read about.")]
    = "overview",
) -> dict[str, Any]:
    """Read the presentation guidelines before showing a chart, table, diagram or canvas.
    Returns the guideline for one topic and the list of topics."""
    return {"topic": topic, "guideline": GUIDELINES[topic], "topics": sorted(GUIDELINES)}


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(visualize_read_me)
