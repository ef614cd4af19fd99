"""No model-visible goal, sleep, wait, polling, consent, checkpoint or process-control tool
(spec: The closed built-in registry; R-187).

Waiting, checkpoints, approvals (consent) and the run's lifecycle belong to the runtime and
the trusted backend, never to a tool the model could call. This is a trip-wire over everything
Kaizen itself can show a model: every name in the closed built-in manifest and every tool the
first-party plugins register, by name, parameter names and description. The checker is tried
against look-alikes first, so it is known to catch them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from kaizen_server_extension.tools.catalog import freeze_catalog
from kaizen_server_extension.tools.manifest import BUILTIN_TOOLS
from kaizen_server_extension.tools.registry import ToolRegistry
from kaizen_server_extension.tools.types import ToolDescriptor

# Words that make a name (split on _ - and case changes) a runtime-control tool.
FORBIDDEN_NAME_WORDS = frozenset({
    "goal", "goals", "sleep", "wait", "await", "poll", "polling", "consent", "checkpoint",
    "checkpoints", "kill", "terminate", "signal", "restart", "shutdown", "suspend", "pause",
    "resume", "interrupt", "exit", "spawn", "fork", "pid", "process", "heartbeat", "delay",
    "timer",
})

# What a description says the tool *does*; a passing mention (a run "is interrupted" when it
# runs out of time) is not a purpose.
FORBIDDEN_PURPOSES = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"\b(?:sleep|wait|pause|delay)s?\s+(?:for|until|while|\d)",
    r"\bpoll(?:s|ing|ed)?\b",
    r"\b(?:set|sets|update|updates|track|tracks|pursue|manage|manages|record|records)\s+"
    r"(?:a\s+|the\s+|your\s+|its\s+)?goals?\b",
    r"\bconsent\b",
    r"\bcheckpoints?\b",
    r"\b(?:kill|terminate|restart|suspend|signal|interrupt|stop|cancel|shut\s*down|resume)s?"
    r"\s+(?:a|an|the|this|its|your)?\s*(?:process|kernel|run|turn|job|task|server|loop)",
))


def _words(name: str) -> set[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return {w.lower() for w in re.split(r"[\s_\-.]+", spaced) if w}


def _parameter_names(schema: Mapping[str, Any]) -> Iterable[str]:
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        for key, value in properties.items():
            yield str(key)
            if isinstance(value, Mapping):
                yield from _parameter_names(value)


def runtime_control_reasons(name: str, description: str,
                            schema: Mapping[str, Any] | None = None) -> list[str]:
    """Why a tool would be a runtime-control tool; empty when it is not one."""
    reasons = [f"name word {w!r}" for w in sorted(_words(name) & FORBIDDEN_NAME_WORDS)]
    for parameter in _parameter_names(schema or {}):
        reasons += [f"parameter {parameter!r}"
                    for _ in sorted(_words(parameter) & FORBIDDEN_NAME_WORDS)]
    reasons += [f"description {m.group(0)!r}" for pattern in FORBIDDEN_PURPOSES
                if (m := pattern.search(description))]
    return reasons


@pytest.mark.rule("R-187")
@pytest.mark.parametrize(("name", "description", "schema"), [
    ("sleep", "Pause the turn.", {}),
    ("wait_for_run", "Returns when a run settles.", {}),
    ("poll_job", "Look at a background job.", {}),
    ("checkJobStatus", "Polls the job until it is done.", {}),
    ("set_goal", "Remember what the member wants.", {}),
    ("run_helper", "Sets the goal the agent pursues next.", {}),
    ("record_consent", "Note the member's approval.", {}),
    ("approve_step", "Records the member's consent to continue.", {}),
    ("save_checkpoint", "Store progress.", {}),
    ("store_progress", "Write a checkpoint of the turn so far.", {}),
    ("kill_process", "End a program.", {}),
    ("restart_kernel", "Start over.", {}),
    ("helper", "Wait until the job finishes, then return its output.", {}),
    ("helper", "Stop the run when you are done.", {}),
    ("fetch", "Fetch a page.",
     {"type": "object", "properties": {"wait_seconds": {"type": "integer"}}}),
])
def test_the_checker_catches_runtime_control_look_alikes(
        name: str, description: str, schema: dict[str, Any]) -> None:
    assert runtime_control_reasons(name, description, schema), (name, description)


@pytest.mark.rule("R-187")
def test_no_built_in_name_is_a_runtime_control_tool() -> None:
    offending = {name: reasons for name in BUILTIN_TOOLS
                 if (reasons := runtime_control_reasons(name, ""))}
    assert offending == {}


def _first_party() -> list[ToolDescriptor]:
    registry = ToolRegistry.from_plugins(load_entrypoints=False)
    return [d for d in registry.descriptors() if d.first_party]


@pytest.mark.rule("R-187")
def test_no_first_party_tool_is_a_runtime_control_tool_by_name_parameters_or_description(
        ) -> None:
    descriptors = _first_party()
    # Every built-in the server can show a model is looked at, not a subset.
    assert {d.name for d in descriptors} == set(BUILTIN_TOOLS)
    offending = {d.name: reasons for d in descriptors
                 if (reasons := runtime_control_reasons(d.name, d.description,
                                                        d.input_schema))}
    assert offending == {}


@pytest.mark.rule("R-187")
def test_what_a_model_is_shown_has_no_runtime_control_tool() -> None:
    # The projection the model actually receives (an agent granted every built-in, in a
    # private room, discovery on so tool_search is in), not only the descriptors behind it.
    descriptors = ToolRegistry.from_plugins(load_entrypoints=False).descriptors()
    catalog = freeze_catalog(descriptors, agent_ceiling=set(BUILTIN_TOOLS), room_shared=False,
                             roster_is_only_initiator=True, discovery_enabled=True)
    shown = catalog.projected.values()
    assert {t.name for t in shown} == set(BUILTIN_TOOLS)
    offending = {t.name: reasons for t in shown
                 if (reasons := runtime_control_reasons(t.name, t.description,
                                                        t.parameters))}
    assert offending == {}
