"""Prompt step attachments resolved against the facts of now (policy/prompt_attachments.py)."""

from __future__ import annotations

import pytest

from kaizen_server_extension.models.profiles import COMPACT
from kaizen_server_extension.policy.prompt_attachments import (
    MAX_ATTACHMENTS,
    AttachmentFacts,
    AttachmentRejected,
    resolve,
)
from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.tools.catalog import freeze_catalog
from kaizen_server_extension.tools.types import ToolDescriptor

FACTS = AttachmentFacts(
    registered={"list_available_agents": "agents", "run_code": "sandbox",
                "create_artifact": "artifacts", "manage_tasks": "tasks"},
    within_ceiling=frozenset({"list_available_agents", "run_code", "create_artifact"}),
    disabled=frozenset({"create_artifact"}),
)


@pytest.mark.rule("R-205")
def test_naming_a_tool_in_the_wording_attaches_nothing() -> None:
    resolved = resolve("Use run_code and list_available_agents to check the numbers.", FACTS)
    assert resolved.ok and resolved.tools == ()
    assert resolved.model_text == "Use run_code and list_available_agents to check the numbers."


@pytest.mark.rule("R-206", "R-211")
def test_a_structural_token_attaches_its_tool_and_reads_as_a_directive() -> None:
    resolved = resolve("Sum column b {{tool:sandbox/run_code}} then list "
                       "{{ tool : list_available_agents }}.", FACTS)
    assert resolved.ok, resolved.issues
    assert resolved.tools == ("run_code", "list_available_agents")
    # The model reads words, not the token; the words are not what authorizes anything.
    assert "{{" not in resolved.model_text
    assert "(use the tool run_code for this)" in resolved.model_text


@pytest.mark.rule("R-207")
@pytest.mark.parametrize(("prompt", "problem"), [
    ("{{tool:no_such_tool}}", "missing"),
    ("{{tool:artifacts/run_code}}", "missing"),        # the wrong surface is not a match
    ("{{tool:create_artifact}}", "disabled"),          # an administrator turned it off
    ("{{tool:tasks/manage_tasks}}", "over_ceiling"),   # not within the agent's ceiling here
    ("{{connector:warehouse}}", "missing"),            # no connector of that id
    ("{{tool:run code}}", "malformed"),
    ("{{tools:run_code}}", "malformed"),
])
def test_an_attachment_that_cannot_be_used_blocks(prompt: str, problem: str) -> None:
    resolved = resolve(f"Check it {prompt} please", FACTS)
    assert not resolved.ok
    assert [issue.problem for issue in resolved.issues] == [problem]
    assert resolved.tools == ()
    error = resolved.error()
    assert isinstance(error, AttachmentRejected) and error.code == "attachment_invalid"
    assert error.status == 422 and prompt in error.message


@pytest.mark.rule("R-207")
def test_one_bad_attachment_blocks_the_good_ones_too_and_the_count_is_bounded() -> None:
    mixed = resolve("{{tool:run_code}} {{tool:no_such_tool}}", FACTS)
    assert not mixed.ok and mixed.model_text == "{{tool:run_code}} {{tool:no_such_tool}}"
    many = resolve(" ".join(["{{tool:run_code}}"] * (MAX_ATTACHMENTS + 1)), FACTS)
    assert [issue.problem for issue in many.issues] == ["too_many"]


def _descriptor(name: str, first_party: bool = True) -> ToolDescriptor:
    return ToolDescriptor(name=name, description=f"{name} tool",
                          input_schema={"type": "object", "properties": {}},
                          capability=Capability.READ, first_party=first_party)


@pytest.mark.rule("R-208", "R-211")
def test_an_attached_deferred_tool_is_on_the_first_step_of_that_run_only() -> None:
    descriptors = [_descriptor("tool_search"), _descriptor("run_code"),
                   _descriptor("list_available_agents"), _descriptor("read_notebook")]
    ceiling = {"run_code", "list_available_agents"}

    def first_step(attached: tuple[str, ...]) -> set[str]:
        catalog = freeze_catalog(descriptors, agent_ceiling=ceiling, room_shared=False,
                                 roster_is_only_initiator=True, discovery_enabled=True,
                                 direct=COMPACT.direct_tools, attached=attached)
        return {tool.name for tool in catalog.first_step}

    assert "list_available_agents" not in first_step(())  # deferred behind tool_search
    assert "list_available_agents" in first_step(("list_available_agents",))
    # An attachment outside the catalog adds nothing callable: the catalog is the authority.
    assert "read_notebook" not in first_step(("read_notebook",))
    assert ceiling == {"run_code", "list_available_agents"}
