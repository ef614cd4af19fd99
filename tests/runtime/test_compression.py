"""Tool-result compression at the tool boundary (spec: Compression at the tool boundary).

The pure seam: what it shortens, what it never touches, and that a failure keeps the
original. The end-to-end path (opt-in over REST, the model's copy against the journal's) is
in tests/lanes/test_tool_result_compression.py.
"""

from __future__ import annotations

import json
import logging

import pytest

from kaizen_server_extension.protocol.tools import ToolCallResult, ToolOutcome
from kaizen_server_extension.runtime.compression import compress_output, model_bound


def _result(name: str, body: object) -> ToolCallResult:
    content = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    return ToolCallResult(call_id="c1", name=name, outcome=ToolOutcome.OK, content=content)


def test_a_progress_bar_keeps_only_what_the_terminal_showed() -> None:
    bar = "".join(f"\rdownloading {p}%" for p in range(0, 101, 5))
    assert compress_output(f"start\n{bar}\ndone") == "start\ndownloading 100%\ndone"


def test_ansi_escapes_go_and_the_text_stays() -> None:
    assert compress_output("\x1b[1;31mError\x1b[0m: bad") == "Error: bad"


def test_a_repeated_line_becomes_one_line_and_a_count() -> None:
    text = "\n".join(["begin", *["warning: deprecated"] * 50, "end"])
    assert compress_output(text) == ("begin\nwarning: deprecated\n"
                                     "[previous line repeated 49 more times]\nend")
    # Two in a row are left alone: there is nothing to gain.
    assert compress_output("a\na\nb") == "a\na\nb"


def test_a_long_run_of_look_alike_lines_keeps_its_first_and_last_lines() -> None:
    log_lines = [f"epoch {i} loss {1 / (i + 1):.4f}" for i in range(100)]
    out = compress_output("\n".join(["training", *log_lines, "finished"])).split("\n")
    assert out[:4] == ["training", *log_lines[:3]]
    assert out[4] == "[... 94 similar lines omitted ...]"
    assert out[5:] == [*log_lines[-3:], "finished"]
    # A short run is kept whole.
    short = "\n".join(log_lines[:9])
    assert compress_output(short) == short


def test_text_with_nothing_to_condense_is_returned_unchanged() -> None:
    text = "x = 1\nthe mean is 4.2\n\nsecond paragraph"
    assert compress_output(text) == text


@pytest.mark.rule("R-470")
def test_only_run_code_streams_are_compressed_and_only_when_opted_in() -> None:
    noisy = "\n".join(["same line"] * 40)
    body = {"status": "ok", "stdout": noisy, "stderr": noisy, "result": noisy}
    run_code = _result("run_code", body)
    assert model_bound(run_code, enabled=False) == run_code.content  # not opted in
    shorter = json.loads(model_bound(run_code, enabled=True))
    assert shorter["stdout"] == shorter["stderr"] == (
        "same line\n[previous line repeated 39 more times]")
    assert shorter["result"] == noisy  # only the two streams
    assert len(model_bound(run_code, enabled=True)) < len(run_code.content)


@pytest.mark.rule("R-471")
def test_search_retrieval_and_other_evidence_pass_byte_for_byte() -> None:
    noisy = "\n".join(["same passage"] * 40)
    for name in ("search", "query_document", "conversation_history_search",
                 "request_document", "search_about", "read_artifact"):
        result = _result(name, {"stdout": noisy, "hits": [{"excerpt": noisy}]})
        assert model_bound(result, enabled=True) == result.content


@pytest.mark.rule("R-472")
def test_a_failing_compressor_keeps_the_original_and_logs_no_result_text(
        caplog: pytest.LogCaptureFixture) -> None:
    secretish = "\n".join(["customer 4411 balance"] * 30)
    result = _result("run_code", {"status": "ok", "stdout": secretish})

    def broken(_: str) -> str:
        raise RuntimeError(secretish)

    with caplog.at_level(logging.WARNING):
        assert model_bound(result, enabled=True, compress=broken) == result.content
    assert "compression failed (RuntimeError)" in caplog.text
    assert "4411" not in caplog.text


@pytest.mark.rule("R-472")
def test_a_projection_that_is_not_an_object_or_would_grow_is_kept() -> None:
    cut = _result("run_code", '{"status": "ok", "stdout": "aaa\n[truncated: showing')
    assert model_bound(cut, enabled=True) == cut.content
    plain = _result("run_code", {"status": "ok", "stdout": "42\n"})
    assert model_bound(plain, enabled=True) == plain.content

    def longer(text: str) -> str:
        return text + " and more"

    assert model_bound(plain, enabled=True, compress=longer) == plain.content
