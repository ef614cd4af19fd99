"""The shell reply is authoritative for an execution's success (kaizen_kernel/execute.py)."""

from __future__ import annotations

from kaizen_kernel.execute import ExecutionCapture, apply_reply_status, was_aborted_unrun


def _reply(**content: object) -> dict[str, object]:
    return {"content": content}


def test_error_reply_without_iopub_error_names_the_exception_from_stderr() -> None:
    cap = ExecutionCapture(stderr="evalmachine.<anonymous>:2\nthrow x;\n\nRangeError: too far\n"
                                  "    at evalmachine.<anonymous>:2:7\n")
    apply_reply_status(cap, _reply(status="error"))
    assert cap.status == "error" and cap.error is not None
    assert (cap.error.name, cap.error.value) == ("RangeError", "too far")


def test_type_check_diagnostic_is_a_compile_error() -> None:
    cap = ExecutionCapture(stderr="1:13 - Cannot find name 'undefinedName'.\n")
    apply_reply_status(cap, _reply(status="error"))
    assert cap.error is not None and cap.error.name == "CompileError"
    assert cap.error.value == "1:13 - Cannot find name 'undefinedName'."


def test_reply_ename_wins_and_ok_stays_ok() -> None:
    cap = ExecutionCapture()
    apply_reply_status(cap, _reply(status="error", ename="ValueError", evalue="bad"))
    assert cap.error is not None and (cap.error.name, cap.error.value) == ("ValueError", "bad")
    fine = ExecutionCapture(stdout="1\n")
    apply_reply_status(fine, _reply(status="ok"))
    apply_reply_status(fine, None)
    assert fine.status == "ok" and fine.error is None


def test_an_iopub_error_is_not_overwritten() -> None:
    cap = ExecutionCapture(status="error")
    apply_reply_status(cap, _reply(status="error", ename="Other"))
    assert cap.error is None  # collect() already recorded it from iopub


def test_only_an_unrun_abort_is_retried() -> None:
    assert was_aborted_unrun(ExecutionCapture(), _reply(status="aborted"))
    assert was_aborted_unrun(ExecutionCapture(), _reply(status="abort"))
    assert not was_aborted_unrun(ExecutionCapture(stdout="ran\n"), _reply(status="abort"))
    assert not was_aborted_unrun(ExecutionCapture(), _reply(status="error"))
    assert not was_aborted_unrun(ExecutionCapture(status="timeout"), _reply(status="abort"))
    aborted = ExecutionCapture()
    apply_reply_status(aborted, _reply(status="aborted"))
    assert aborted.error is not None and aborted.error.name == "ExecutionAborted"
