"""The call pipeline's admission steps, the turn ledger as the pipeline applies it, outcome
classification and the member-safe projection. Each test tries the forbidden thing."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any

import pytest

from kaizen_server_extension.policy.errors import ApprovalPending
from kaizen_server_extension.protocol.authority import AuthorityRejected
from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.protocol.tools import (
    Capability,
    FailureDomain,
    ToolOutcome,
    WriteCategory,
)
from kaizen_server_extension.tools.ledger import TurnLedger
from kaizen_server_extension.tools.types import RoomClass
from tests.policy.fakes import BUNDLE, harness, make_tool, raising, returning

CREATE = dict(capability=Capability.WRITE, write_category=WriteCategory.MEMBER_STORE,
              repeat_creates_object=True)


def create_artifact(results: list[str] | None = None) -> Any:
    created: list[str] = results if results is not None else []

    async def impl(arguments: Mapping[str, Any]) -> object:
        created.append(arguments.get("title", ""))
        return {"artifact_id": f"art-{len(created)}", "title": arguments.get("title")}

    return make_tool("create_artifact", impl, **CREATE)


# --- 1. authority -------------------------------------------------------------------------


@pytest.mark.rule("R-007", "R-222")
@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(BUNDLE)])
async def test_a_bundle_differing_in_any_field_is_rejected_before_anything_runs(field: str):
    h = harness(make_tool("search", returning({"hits": []})))
    value = getattr(BUNDLE, field)
    other = dataclasses.replace(BUNDLE, **{field: value + 1 if isinstance(value, int)
                                           else value + "-x"})
    with pytest.raises(AuthorityRejected) as err:
        await h.call("search", bundle=other)
    assert err.value.fields == (field,)
    assert h.executed == [] and h.audit.entries == []
    assert h.permissions.calls == 0  # nothing after the bundle check ran


# --- 2-4. permissions, ceiling, room -------------------------------------------------------


@pytest.mark.rule("R-204", "R-005", "R-098")
async def test_a_permission_revoked_mid_turn_bites_on_the_next_call():
    h = harness(make_tool("search", returning({"hits": [1]})))
    assert (await h.call("search")).outcome is ToolOutcome.OK
    h.permissions.revoked.add("search")
    result = await h.call("search", '{"q": 2}')
    assert result.outcome is ToolOutcome.ERROR and result.closes_turn
    assert result.close_reason == "permission_denied"
    assert h.executed == ["search"]


@pytest.mark.rule("R-001", "R-098", "R-099")
async def test_a_tool_outside_the_agents_ceiling_never_runs_even_if_registered():
    h = harness(make_tool("search", returning("ok")), make_tool("delete_all", returning("gone")),
                ceiling=["search"])
    result = await h.call("delete_all")
    assert result.closes_turn and result.close_reason == "over_ceiling"
    assert h.executed == []
    # A model-invented name is neither executed nor allowed to become a metric label.
    invented = await h.call("totally_made_up_tool")
    assert invented.close_reason == "over_ceiling"
    assert h.count("_unknown", "undeclared", "error") == 1
    assert h.count("totally_made_up_tool", "undeclared", "error") == 0


@pytest.mark.rule("R-218", "R-219", "R-221")
@pytest.mark.parametrize("room_class", [RoomClass.ACTOR_PRIVATE_READ, RoomClass.UNKNOWN])
async def test_an_actor_private_tool_is_refused_once_the_room_has_a_collaborator(room_class):
    h = harness(make_tool("federated_read", returning("rows"), room_class=room_class))
    assert (await h.call("federated_read")).outcome is ToolOutcome.OK
    h.roster.only_initiator = False
    result = await h.call("federated_read", '{"again": true}')
    assert result.closes_turn and result.close_reason == "room_admission"
    assert h.executed == ["federated_read"]


@pytest.mark.rule("R-364")
async def test_a_failing_permission_resolver_fails_closed_as_an_internal_error(caplog):
    h = harness(make_tool("publish", returning("sent"), capability=Capability.WRITE,
                          write_category=WriteCategory.EXTERNAL_EFFECT))

    async def broken(member: str, tool_name: str, facts: object = None) -> bool:
        raise ConnectionError("directory at 10.1.2.3 unavailable")

    h.permissions.allowed = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="kaizen.tools.pipeline"):
        result = await h.call("publish")
    assert result.close_reason == "permission_check_failed" and h.executed == []
    # An internal error in the check, with its reference, and no claim about the outcome.
    assert "internal error" in result.content and "reference" in result.content
    assert "unknown" not in result.content and "not saved" not in result.content
    assert "permission to use that tool" not in result.content
    assert "10.1.2.3" not in result.content
    reference = result.content.rsplit("reference ", 1)[1].rstrip(").")
    assert any(reference in r.getMessage() for r in caplog.records)


async def test_an_unresolvable_approval_mode_is_treated_as_always_ask():
    h = harness(make_tool("manage_tasks", returning("ok"), capability=Capability.WRITE,
                          write_category=WriteCategory.MEMBER_STORE))

    class Broken:
        async def mode_for(self, member: str, facts: object = None) -> Any:
            raise ConnectionError("settings unavailable")

    h = harness(*h.tools.values(), modes=Broken())
    with pytest.raises(ApprovalPending):
        await h.call("manage_tasks")
    assert h.executed == []


@pytest.mark.parametrize("body,evidence", [
    ({"hits": [1]}, True), ({}, False), ("", False), ("  ", False), (None, False), (0, True),
])
async def test_only_a_successful_body_with_substance_is_evidence(body: object, evidence: bool):
    h = harness(make_tool("search", returning(body)))
    result = await h.call("search")
    assert result.outcome is ToolOutcome.OK and result.evidence is evidence


async def test_an_audience_safe_read_is_not_subject_to_the_roster_check():
    h = harness(make_tool("search", returning("hits")))
    h.roster.only_initiator = False
    assert (await h.call("search")).outcome is ToolOutcome.OK


# --- 5. arguments ---------------------------------------------------------------------------


@pytest.mark.rule("R-256")
async def test_invalid_arguments_are_an_error_the_turn_survives_and_the_tool_never_runs():
    h = harness(make_tool("search", returning("hits")))
    result = await h.call("search", "[1, 2]")
    assert result.outcome is ToolOutcome.ERROR and not result.closes_turn
    assert result.failure_domain is FailureDomain.CALLER
    assert h.executed == []


async def test_the_default_validator_is_the_schema_modules_and_enforces_the_schema():
    tool = make_tool("search", returning("hits"))
    tool = dataclasses.replace(tool, descriptor=dataclasses.replace(
        tool.descriptor, input_schema={"type": "object", "required": ["q"],
                                       "properties": {"q": {"type": "string"}}}))
    h = harness(tool, validator=None)
    result = await h.call("search", '{"q": 5}')
    assert result.outcome is ToolOutcome.ERROR and "q" in result.content
    assert h.executed == []
    assert (await h.call("search", '{"q": "x"}')).outcome is ToolOutcome.OK


# --- 6. the ledger as the pipeline applies it ----------------------------------------------


@pytest.mark.rule("R-279", "R-280")
async def test_a_repeated_create_in_a_later_step_is_suppressed_with_the_earlier_ids():
    created: list[str] = []
    h = harness(create_artifact(created))
    first = await h.call("create_artifact", '{"title": "Q3"}', step=1)
    again = await h.call("create_artifact", '{"title": "Q3"}', step=2)
    assert created == ["Q3"]
    assert again.outcome is ToolOutcome.SUPPRESSED and not again.failed
    assert "art-1" in again.content and first.content in again.content
    assert "Nothing new was created" in again.content
    assert not again.closes_turn


@pytest.mark.rule("R-287")
async def test_two_identical_creates_in_the_same_step_both_run():
    created: list[str] = []
    h = harness(create_artifact(created))
    a = await h.call("create_artifact", '{"title": "Q3"}', step=4)
    b = await h.call("create_artifact", '{"title": "Q3"}', step=4)
    assert created == ["Q3", "Q3"]
    assert a.outcome is b.outcome is ToolOutcome.OK


@pytest.mark.rule("R-283")
async def test_arguments_differing_in_any_byte_are_a_new_intent():
    created: list[str] = []
    h = harness(create_artifact(created))
    await h.call("create_artifact", '{"title": "Q3"}', step=1)
    await h.call("create_artifact", '{"title":"Q3"}', step=2)  # same JSON, other bytes
    assert created == ["Q3", "Q3"]


@pytest.mark.rule("R-285")
async def test_a_create_that_failed_may_be_retried_unchanged_after_something_succeeds():
    outcomes = iter([{"status": "error", "code": "store_busy"}, {"artifact_id": "art-9"}])

    async def flaky(arguments: Mapping[str, Any]) -> object:
        return next(outcomes)

    h = harness(make_tool("create_artifact", flaky, **CREATE),
                make_tool("search", returning("hits")))
    assert (await h.call("create_artifact", '{"t": 1}', step=1)).outcome is ToolOutcome.ERROR
    await h.call("search", step=2)
    retried = await h.call("create_artifact", '{"t": 1}', step=3)
    assert retried.outcome is ToolOutcome.OK and "art-9" in retried.content


@pytest.mark.rule("R-281")
async def test_a_write_that_did_not_declare_repeat_creates_object_is_never_deduplicated():
    runs: list[str] = []

    async def run_code(arguments: Mapping[str, Any]) -> object:
        runs.append("ran")
        return {"stdout": "42"}

    h = harness(make_tool("run_code", run_code, capability=Capability.WRITE,
                          write_category=WriteCategory.ISOLATED_EXECUTION))
    for step in (1, 2, 3):
        assert (await h.call("run_code", '{"code": "x"}', step=step)).outcome is ToolOutcome.OK
    assert runs == ["ran"] * 3


@pytest.mark.rule("R-284")
async def test_a_later_turn_gets_a_genuine_second_copy():
    created: list[str] = []
    first_turn = harness(create_artifact(created))
    await first_turn.call("create_artifact", '{"title": "Q3"}', step=1)
    next_turn = harness(create_artifact(created))  # a new run: a new ledger
    assert (await next_turn.call("create_artifact", '{"title": "Q3"}', step=1)).outcome \
        is ToolOutcome.OK
    assert created == ["Q3", "Q3"]


@pytest.mark.rule("R-273")
@pytest.mark.parametrize("domain", ["tool", "caller"])
async def test_byte_identical_input_that_just_failed_is_refused_whoever_failed(domain: str):
    h = harness(make_tool("run_code", raising(MemberSafeError("boom", domain=domain)),
                          capability=Capability.WRITE,
                          write_category=WriteCategory.ISOLATED_EXECUTION))
    await h.call("run_code", '{"code": "1/0"}', step=1)
    again = await h.call("run_code", '{"code": "1/0"}', step=2)
    assert h.executed == ["run_code"]
    assert again.outcome is ToolOutcome.ERROR and not again.closes_turn
    assert "same input" in again.content


@pytest.mark.rule("R-270")
async def test_a_tool_failing_on_different_requests_is_cut_off_for_the_rest_of_the_turn():
    h = harness(make_tool("connector_rag", returning({"error": "backend unavailable"})))
    for n in range(3):
        assert (await h.call("connector_rag", f'{{"q": {n}}}')).outcome is ToolOutcome.ERROR
    cut = await h.call("connector_rag", '{"q": "new"}')
    assert h.executed == ["connector_rag"] * 3
    assert "unavailable for the rest" in cut.content and not cut.closes_turn


@pytest.mark.rule("R-271")
async def test_relayed_caller_failures_never_cut_the_tool_off():
    body = {"ok": False, "failure_domain": "caller", "exit_status": 1, "traceback": "E"}
    h = harness(make_tool("run_code", returning(body), capability=Capability.WRITE,
                          write_category=WriteCategory.ISOLATED_EXECUTION))
    for n in range(5):
        result = await h.call("run_code", f'{{"code": "{n}"}}')
        assert result.failure_domain is FailureDomain.CALLER
    assert h.executed == ["run_code"] * 5


@pytest.mark.rule("R-272")
async def test_a_caller_failure_gets_no_text_matching_advice_but_a_tool_failure_does():
    program = {"ok": False, "failure_domain": "caller",
               "stderr": "PermissionError: [Errno 13] permission denied: 'data.csv'"}
    own = {"ok": False, "error": "upstream said: 401 unauthorized"}
    h = harness(make_tool("run_code", returning(program), capability=Capability.WRITE,
                          write_category=WriteCategory.ISOLATED_EXECUTION),
                make_tool("connector_rag", returning(own)))
    relayed = await h.call("run_code")
    assert "re-authorize" not in relayed.content
    assert "re-authorize" in (await h.call("connector_rag")).content


@pytest.mark.rule("R-289", "R-290")
async def test_repeated_refusals_stay_results_and_escalate_to_stop_calling():
    h = harness(make_tool("search", returning({"status": "failed"})))
    await h.call("search", '{"q": 1}')
    refusals = [await h.call("search", '{"q": 1}') for _ in range(4)]
    assert all(not r.closes_turn and r.outcome is ToolOutcome.ERROR for r in refusals)
    assert "Stop calling search" not in refusals[0].content
    assert "Stop calling search" in refusals[-1].content
    assert h.executed == ["search"]


@pytest.mark.rule("R-288")
async def test_a_suppressed_write_is_counted_under_its_own_outcome():
    h = harness(create_artifact())
    await h.call("create_artifact", '{"title": "a"}', step=1)
    await h.call("create_artifact", '{"title": "a"}', step=2)
    assert h.count("create_artifact", "write", "ok") == 1
    assert h.count("create_artifact", "write", "suppressed") == 1


# --- 9. outcome classification ---------------------------------------------------------------


@pytest.mark.rule("R-274", "R-275")
@pytest.mark.parametrize("body", [
    {"status": "error"}, {"ok": False}, {"error": {"code": "x"}}, '{"success": false}',
    {"content": [{"type": "text", "text": '{"state": "failed"}'}], "isError": False},
])
async def test_a_body_reporting_failure_is_an_error_outcome_despite_a_clean_envelope(body):
    h = harness(make_tool("mcp_tool", returning(body)))
    result = await h.call("mcp_tool")
    assert result.outcome is ToolOutcome.ERROR and result.failed
    assert not result.evidence


@pytest.mark.rule("R-260")
async def test_a_read_tool_that_raises_settles_as_an_error_with_only_the_message():
    h = harness(make_tool("search", raising(RuntimeError("index offline"))))
    result = await h.call("search")
    assert result.outcome is ToolOutcome.ERROR and not result.closes_turn
    assert result.content == "search failed: index offline"
    assert "Traceback" not in result.content


@pytest.mark.rule("R-261", "R-441")
@pytest.mark.parametrize("capability,category", [
    (Capability.WRITE, WriteCategory.MEMBER_STORE),
    (Capability.WRITE, WriteCategory.ISOLATED_EXECUTION),
])
async def test_a_write_or_undeclared_tool_that_raises_closes_the_turn(capability, category):
    h = harness(make_tool("manage_tasks", raising(RuntimeError("half-done")),
                          capability=capability, write_category=category))
    result = await h.call("manage_tasks")
    assert result.outcome is ToolOutcome.RAISED
    assert result.closes_turn and result.close_reason == "ambiguous_write"
    assert result.may_have_effect and "half-done" not in result.content


async def test_a_member_safe_error_from_a_write_is_an_ordinary_error_not_an_ambiguous_write():
    h = harness(make_tool("create_artifact",
                          raising(MemberSafeError("title ends with .docx; use run_code")),
                          **CREATE))
    result = await h.call("create_artifact")
    assert result.outcome is ToolOutcome.ERROR and not result.closes_turn
    assert "use run_code" in result.content


@pytest.mark.rule("R-229", "R-344", "R-072")
async def test_the_projection_is_redacted_and_the_raw_result_goes_only_to_audit():
    raw = {"rows": [{"name": "db", "password": "hunter2"}],
           "link": "https://b.s3.amazonaws.com/k?X-Amz-Signature=abc123sig",
           "note": "use Authorization: Bearer eyJhbGciOi.secret"}
    h = harness(make_tool("query_document", returning(raw)))
    result = await h.call("query_document")
    for secret in ("hunter2", "abc123sig", "eyJhbGciOi.secret"):
        assert secret not in result.content
    assert json.loads(result.content)["rows"][0]["name"] == "db"
    assert h.audit.entries == [("query_document", ToolOutcome.OK, raw)]


@pytest.mark.rule("R-229")
async def test_an_oversized_result_is_bounded_with_a_clear_truncation_note():
    h = harness(make_tool("search", returning("x" * 5000)), projection_limit=1000)
    result = await h.call("search")
    assert result.content.startswith("x" * 1000)
    assert len(result.content) < 1200
    assert "[truncated: showing the first 1000 of 5000 characters" in result.content


# --- metrics and the failed-result log --------------------------------------------------------


@pytest.mark.rule("R-267")
async def test_every_call_counts_exactly_one_outcome_labelled_by_tool_and_capability():
    h = harness(make_tool("search", returning("ok")),
                make_tool("lookup", returning({"status": "error"})),
                make_tool("manage_tasks", raising(RuntimeError("x")),
                          capability=Capability.WRITE, write_category=WriteCategory.MEMBER_STORE))
    await h.call("search")
    await h.call("lookup")
    await h.call("manage_tasks")
    assert h.count("search", "read", "ok") == 1
    assert h.count("lookup", "read", "error") == 1
    assert h.count("manage_tasks", "write", "raised") == 1
    assert h.count("search", "read", "error") == 0


@pytest.mark.rule("R-268")
async def test_a_failed_result_is_logged_once_with_codes_and_never_its_text(caplog):
    secret_output = "SECRET-PROGRAM-OUTPUT reading /home/alice/tax.csv"
    body = {"ok": False, "failure_domain": "caller", "exit_status": 3, "code": "program_error",
            "stderr": secret_output}
    h = harness(make_tool("run_code", returning(body), capability=Capability.WRITE,
                          write_category=WriteCategory.ISOLATED_EXECUTION))
    with caplog.at_level(logging.DEBUG):
        result = await h.call("run_code")
    assert secret_output in result.content  # the model still needs the traceback
    failures = [r for r in caplog.records if r.name == "kaizen.tools.failures"]
    assert len(failures) == 1
    line = failures[0].getMessage()
    assert "reason=program_error" in line and "exit_status=3" in line and "domain=caller" in line
    assert "SECRET" not in caplog.text and "tax.csv" not in caplog.text


@pytest.mark.rule("R-269")
async def test_a_raising_tool_is_not_written_to_the_failed_result_log(caplog):
    h = harness(make_tool("search", raising(RuntimeError("boom"))))
    with caplog.at_level(logging.DEBUG):
        await h.call("search")
    assert not [r for r in caplog.records if r.name == "kaizen.tools.failures"]


async def test_a_shared_ledger_can_be_injected_and_inspected():
    ledger = TurnLedger(health_limit=1)
    h = harness(make_tool("search", returning({"error": "down"})), ledger=ledger)
    await h.call("search", '{"q": 1}')
    assert h.pipeline.ledger is ledger and ledger.is_cut_off("search")
