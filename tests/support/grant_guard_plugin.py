"""An operator plugin (KAIZEN_PLUGINS) for the "allow for this conversation" tests: a call
guardrail that denies any artifact titled with a marker, one that demands approval for another
marker, a sensitive tool, and an agent that has both tools and a read."""

from __future__ import annotations

from typing import Any

from kaizen_server_extension.policy.guardrails import (
    ALLOW,
    Deny,
    GuardrailCall,
    GuardrailVerdict,
    NeedsApproval,
)
from kaizen_server_extension.protocol.tools import WriteCategory
from kaizen_server_extension.tools import Capability, RoomClass, ToolContext, hookimpl, tool
from kaizen_server_extension.tools.hookspecs import Registrar, ToolRegistrar

#: An artifact title the deny guardrail refuses, whatever the member allowed.
DENIED_TITLE = "FORBIDDEN"
#: An artifact title the operator guardrail wants approved call by call.
REVIEWED_TITLE = "REVIEW"


def no_forbidden_titles(call: GuardrailCall) -> GuardrailVerdict:
    if call.request.name == "create_artifact" and DENIED_TITLE in str(
            call.arguments.get("title", "")):
        return Deny("That title is not allowed on this server.", code="title_blocked")
    return ALLOW


def review_marked_titles(call: GuardrailCall) -> GuardrailVerdict:
    if call.request.name == "create_artifact" and REVIEWED_TITLE in str(
            call.arguments.get("title", "")):
        return NeedsApproval("The operator reviews these one by one.")
    return ALLOW


@tool(name="launch_probe", capability=Capability.SENSITIVE,
      room_class=RoomClass.ACTOR_BOUND_WRITE, write_category=WriteCategory.EXTERNAL_EFFECT)
async def launch_probe(ctx: ToolContext, target: str) -> dict[str, Any]:
    """Send a probe to an external system (asks every time)."""
    return {"launched": target}


@hookimpl
def kaizen_register_guardrails(register: Registrar) -> None:
    register(no_forbidden_titles)
    register(review_marked_titles)


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(launch_probe)


@hookimpl
def kaizen_register_agents(register: Registrar) -> None:
    register({"agent_id": "granted", "name": "Granted", "mode": "chat",
              "persona": "You save notes and launch probes.",
              "tool_ceiling": ["create_artifact", "launch_probe", "search_about"]})
