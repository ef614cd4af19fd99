"""The runtime decides whether a call failed, and whose failure it was."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kaizen_server_extension.protocol.tools import FailureDomain
from kaizen_server_extension.tools.outcomes import (
    FAILED_VOCABULARY,
    MAX_JSON_TEXT_CHARS,
    advice_for,
    failure_details,
    reports_failure,
)


@pytest.mark.rule("R-274")
@pytest.mark.parametrize("body", [
    {"status": "error"}, {"ok": False}, {"error": {"code": "x"}}, {"success": False},
    {"state": "FAILED"}, {"outcome": "timed-out"}, {"error": "boom", "status": "ok"},
    {"errors": [{"message": "bad"}]}, {"isError": True, "content": []},
    '{"status": "error"}', b'{"ok": false}', "  {\"success\": \"false\"}  ",
    [{"type": "text", "text": '{"status": "failed"}'}],
    {"content": [{"type": "text", "text": "plain"}, {"type": "text", "text": '{"ok": false}'}]},
])
def test_a_body_reporting_failure_is_an_error(body: object):
    assert reports_failure(body)


@pytest.mark.rule("R-274")
@pytest.mark.parametrize("body", [
    None, "", "done", {"status": "ok"}, {"error": None}, {"error": ""}, {"error": {}},
    {"ok": True}, {"ok": 0}, {"errors": []}, {"items": [{"status": "failed"}]},
    {"result": {"status": "error"}}, '["error"]', "{not json", 42, [1, 2],
    {"content": [{"type": "image", "text": '{"ok": false}'}]},
])
def test_a_body_that_does_not_report_failure_is_not_an_error(body: object):
    assert not reports_failure(body)


def test_an_oversized_json_text_is_read_as_plain_text_not_parsed():
    big = json.dumps({"status": "error", "pad": "x" * MAX_JSON_TEXT_CHARS})
    assert not reports_failure(big)


def test_failure_details_carry_codes_and_exit_status_but_never_free_text():
    details = failure_details({"ok": False, "failure_domain": "caller", "exit_code": 2,
                               "code": "program_error", "stderr": "secret"})
    assert details is not None
    assert (details.reason_code, details.domain, details.exit_status) == (
        "program_error", FailureDomain.CALLER, 2)
    prose = failure_details({"status": "error", "reason": "the password was hunter2"})
    assert prose is not None and prose.reason_code == "body_status_failed"
    assert failure_details({"ok": True}) is None


@pytest.mark.rule("R-272")
@pytest.mark.parametrize("message", [
    "PermissionError: [Errno 13] permission denied: 'x.csv'",
    "TimeoutError: timed out waiting for socket",
    "HTTPError: 429 Too Many Requests",
])
def test_a_caller_failure_is_exempt_from_every_text_matching_rule(message: str):
    assert advice_for(message, FailureDomain.CALLER) is None
    assert advice_for(message, FailureDomain.TOOL) is not None


# --- property: reports_failure over generated bodies --------------------------------------

_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
_json = st.recursive(_json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=10)
_failed_word = st.sampled_from(sorted(FAILED_VOCABULARY)).map(
    lambda w: w.upper() if len(w) % 2 else w.replace("_", "-"))
_failure_member = st.one_of(
    st.tuples(st.sampled_from(["status", "state", "outcome"]), _failed_word),
    st.tuples(st.sampled_from(["ok", "success"]), st.just(False)),
    st.tuples(st.just("error"), st.one_of(
        st.text(min_size=1), st.dictionaries(st.text(), _json, min_size=1), st.just(True))),
)
_neutral_keys = st.text(max_size=6).filter(
    lambda k: k not in {"status", "state", "outcome", "ok", "success", "error", "errors",
                        "isError", "is_error", "content"})


def _wrap(body: dict[str, Any], how: int) -> object:
    if how == 0:
        return body
    text = json.dumps(body)
    if how == 1:
        return text
    if how == 2:
        return [{"type": "text", "text": text}]
    return {"content": [{"type": "text", "text": "note"}, {"type": "text", "text": text}],
            "isError": False}


@pytest.mark.rule("R-274", "R-275")
@given(extra=st.dictionaries(_neutral_keys, _json, max_size=4), member=_failure_member,
       how=st.integers(0, 3))
def test_property_any_body_whose_own_member_reports_failure_is_an_error(extra, member, how):
    key, value = member
    assert reports_failure(_wrap({**extra, key: value}, how))


@given(extra=st.dictionaries(_neutral_keys, _json, max_size=4), how=st.integers(0, 3),
       status=st.sampled_from(["ok", "done", "completed", "success", "running"]))
def test_property_a_body_without_a_failure_member_is_not_an_error(extra, how, status):
    assert not reports_failure(_wrap({**extra, "status": status, "ok": True}, how))


@given(st.one_of(_json, st.text(), st.binary()))
def test_property_reports_failure_is_total(body: object):
    assert reports_failure(body) in (True, False)
