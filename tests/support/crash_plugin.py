"""Tools that stay in flight long enough for a test to kill the server under them (crash
recovery tests). Each call appends its name to the file named by KAIZEN_TEST_TOOL_LOG before
it waits, so a test can count how many times a tool was really dispatched."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from kaizen_server_extension.protocol.tools import WriteCategory
from kaizen_server_extension.tools import Capability, RoomClass, ToolContext, hookimpl, tool
from kaizen_server_extension.tools.hookspecs import Registrar, ToolRegistrar

#: How long a slow tool waits: far longer than any test waits before killing the server.
SLOW_S = 120


def _note(name: str) -> None:
    path = os.environ.get("KAIZEN_TEST_TOOL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(name + "\n")


@tool(name="slow_lookup", capability=Capability.READ, room_class=RoomClass.ACTOR_BOUND_READ,
      timeout_s=SLOW_S + 60)
async def slow_lookup(ctx: ToolContext) -> dict[str, Any]:
    """Look something up (slowly)."""
    _note("slow_lookup")
    await asyncio.sleep(SLOW_S)
    return {"found": "nothing"}


@tool(name="slow_update", capability=Capability.WRITE, room_class=RoomClass.ACTOR_BOUND_WRITE,
      write_category=WriteCategory.MEMBER_STORE, timeout_s=SLOW_S + 60)
async def slow_update(ctx: ToolContext) -> dict[str, Any]:
    """Change something (slowly)."""
    _note("slow_update")
    await asyncio.sleep(SLOW_S)
    return {"updated": True}


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(slow_lookup)
    register(slow_update)


@hookimpl
def kaizen_register_agents(register: Registrar) -> None:
    register({"agent_id": "crasher", "name": "Crasher", "mode": "chat",
              "persona": "You use slow tools.",
              "tool_ceiling": ["slow_lookup", "slow_update"]})
