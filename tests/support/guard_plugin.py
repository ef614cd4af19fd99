"""An operator plugin (KAIZEN_PLUGINS) for the result-stage guardrail and failed-write tests:
a result guardrail that withholds any result carrying a marker, a read tool whose result
carries it, and a write tool that raises. Each tool call appends its name to the file named by
KAIZEN_TEST_TOOL_LOG, so a test can tell the tool really ran."""

from __future__ import annotations

import os
from typing import Any

from kaizen_server_extension.policy.guardrails import (
    ALLOW,
    Deny,
    GuardrailResult,
    ResultVerdict,
    result_guardrail,
)
from kaizen_server_extension.protocol.tools import WriteCategory
from kaizen_server_extension.tools import Capability, RoomClass, ToolContext, hookimpl, tool
from kaizen_server_extension.tools.hookspecs import Registrar, ToolRegistrar

#: What the guardrail withholds wherever it appears in a projected result.
MARKER = "WITHHOLD-ME-7731"


def _note(name: str) -> None:
    path = os.environ.get("KAIZEN_TEST_TOOL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(name + "\n")


def withhold_marked_results(result: GuardrailResult) -> ResultVerdict:
    if MARKER in result.content:
        return Deny("it contains material this deployment does not publish",
                    code="marked_result")
    return ALLOW


@tool(name="peek_secret", capability=Capability.READ, room_class=RoomClass.ACTOR_BOUND_READ)
async def peek_secret(ctx: ToolContext) -> dict[str, Any]:
    """Read the team's current code word."""
    _note("peek_secret")
    return {"code_word": f"the code word is {MARKER}"}


@tool(name="explode_write", capability=Capability.WRITE,
      room_class=RoomClass.ACTOR_BOUND_WRITE, write_category=WriteCategory.MEMBER_STORE)
async def explode_write(ctx: ToolContext, note: str) -> dict[str, Any]:
    """Save a note to the member's notebook."""
    _note("explode_write")
    raise RuntimeError("connection to internal-notes.corp.example:5432 refused")


@hookimpl
def kaizen_register_guardrails(register: Registrar) -> None:
    register(result_guardrail(withhold_marked_results))


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(peek_secret)
    register(explode_write)


@hookimpl
def kaizen_register_agents(register: Registrar) -> None:
    register({"agent_id": "guarded", "name": "Guarded", "mode": "chat",
              "persona": "You use the team's tools.",
              "tool_ceiling": ["peek_secret", "explode_write"]})
