"""A third-party plugin as an operator would load it (KAIZEN_PLUGINS): an agent and a
guardrail, registered through the same hooks as first-party code."""

from __future__ import annotations

from kaizen_server_extension.policy.guardrails import ALLOW, Deny, GuardrailCall, GuardrailVerdict
from kaizen_server_extension.tools import hookimpl
from kaizen_server_extension.tools.hookspecs import Registrar


def no_roster_for_carol(call: GuardrailCall) -> GuardrailVerdict:
    if call.bundle.member == "carol" and call.request.name == "list_available_agents":
        return Deny("The roster is not available to you here.", code="roster_blocked")
    return ALLOW


@hookimpl
def kaizen_register_guardrails(register: Registrar) -> None:
    register(no_roster_for_carol)


@hookimpl
def kaizen_register_agents(register: Registrar) -> None:
    register({"agent_id": "analyst", "name": "Analyst", "mode": "chat",
              "persona": "You analyse data carefully.",
              "tool_ceiling": ["list_available_agents"]})
