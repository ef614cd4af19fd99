"""Constrained tool calling: the reply schema, the prompt, and incremental reply parsing."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kaizen_server_extension.models.constrained import (
    ConstrainedReply,
    answer_closed,
    arguments_grammar,
    decided_tool,
    decision_choices,
    decision_grammar,
    grammar_schema,
    render_messages,
    reply_schema,
    step_schema,
    validate_arguments,
)
from kaizen_server_extension.protocol.model import ChatMessage, ModelStepError
from kaizen_server_extension.protocol.tools import AdvertisedTool, Capability, ToolCall
from tests.models.helpers import SEARCH_TOOL, WEATHER_TOOL, snapshot_for

RUN_CODE = AdvertisedTool(
    name="run_code",
    description="Execute code.",
    parameters={
        "type": "object",
        "properties": {
            "code": {"type": "string", "minLength": 1, "description": "The program."},
            "language": {"type": "string", "enum": ["python", "node"], "default": "python"},
            "artifact_targets": {
                "type": "array", "maxItems": 16, "uniqueItems": True,
                "items": {"type": "string", "minLength": 1, "maxLength": 200,
                          "pattern": r"^[^/\\~\x00-\x1f][^\\\x00-\x1f]*$"},
            },
        },
        "required": ["code", "artifact_targets"],
        "additionalProperties": False,
    },
    capability=Capability.UNDECLARED,
)
NO_ARGS = AdvertisedTool("list_available_agents", "List agents.",
                         {"type": "object", "properties": {}, "additionalProperties": False},
                         Capability.READ)
TOOLS = (WEATHER_TOOL, SEARCH_TOOL, RUN_CODE, NO_ARGS)


def _valid(schema: object, value: object) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)  # type: ignore[arg-type]


# --- the schema -----------------------------------------------------------------------------


def test_the_reply_is_an_answer_or_a_call_to_one_advertised_tool() -> None:
    schema = reply_schema(TOOLS)
    assert schema is not None
    jsonschema.Draft202012Validator.check_schema(schema)
    assert _valid(schema, {"tool": "none", "answer": "Hello."})
    assert _valid(schema, {"tool": "get_weather", "arguments": {"city": "Paris"}})
    assert _valid(schema, {"tool": "list_available_agents", "arguments": {}})
    assert _valid(schema, {"tool": "run_code",
                           "arguments": {"code": "print(1)", "artifact_targets": []}})
    assert not _valid(schema, {"tool": "none", "answer": ""})
    assert not _valid(schema, {"answer": "Hello."})
    assert not _valid(schema, {"tool": "run_shell", "arguments": {}})
    assert not _valid(schema, {"tool": "get_weather", "arguments": {}})
    assert not _valid(schema, {"tool": "run_code", "arguments": {"code": "x"}})
    assert not _valid(schema, {"tool": "get_weather", "answer": "Hi"})
    assert not _valid(schema, {"tool": "get_weather", "arguments": {"city": "P", "x": 1}})


def test_a_required_tool_narrows_the_reply_to_that_one_call() -> None:
    schema = reply_schema(TOOLS, required_tool="run_code")
    assert schema is not None
    assert _valid(schema, {"tool": "run_code",
                           "arguments": {"code": "print(1)", "artifact_targets": []}})
    assert not _valid(schema, {"tool": "none", "answer": "I would rather not."})
    assert not _valid(schema, {"tool": "get_weather", "arguments": {"city": "Paris"}})


def test_a_step_without_tools_is_not_constrained() -> None:
    assert reply_schema(()) is None
    assert step_schema(snapshot_for("hi", tools=())) is None


def test_a_required_tool_outside_the_catalog_is_refused_like_the_http_gateway() -> None:
    with pytest.raises(ModelStepError) as caught:
        step_schema(snapshot_for("hi", required_tool="run_shell"))
    assert caught.value.code == "required_tool_not_in_catalog"
    with pytest.raises(ValueError):
        reply_schema(TOOLS, required_tool="run_shell")


def test_the_grammar_copy_drops_what_a_grammar_cannot_say_and_closes_objects() -> None:
    copy = grammar_schema(RUN_CODE.parameters)
    assert copy["additionalProperties"] is False
    items = copy["properties"]["artifact_targets"]["items"]
    assert "pattern" not in items and "maxLength" not in items and items["minLength"] == 1
    assert "uniqueItems" not in copy["properties"]["artifact_targets"]
    assert copy["properties"]["artifact_targets"]["maxItems"] == 16
    assert "description" not in copy["properties"]["code"]
    assert "default" not in copy["properties"]["language"]
    open_object = grammar_schema({"type": "object", "properties": {"a": {"type": "object"}}})
    assert open_object["additionalProperties"] is False
    assert open_object["properties"]["a"]["additionalProperties"] is False


def test_the_grammar_copy_only_narrows() -> None:
    """Whatever satisfies the grammar's copy of a schema satisfies what the grammar kept."""
    copy = grammar_schema(WEATHER_TOOL.parameters)
    assert _valid(copy, {"city": "Paris"}) and not _valid(copy, {"city": "Paris", "x": 1})
    assert _valid(WEATHER_TOOL.parameters, {"city": "Paris", "x": 1})


def test_arguments_are_validated_against_the_advertised_schema() -> None:
    assert validate_arguments(RUN_CODE, {"code": "print(1)", "artifact_targets": []})
    assert not validate_arguments(RUN_CODE, {"code": "print(1)", "artifact_targets": ["/x"]})


# --- the prompt -----------------------------------------------------------------------------


def test_the_prompt_names_the_tools_and_the_reply_format_in_the_system_message() -> None:
    history = (
        ChatMessage("assistant", "", (ToolCall("c1", "get_weather", '{"city": "Oslo"}'),)),
        ChatMessage("tool", '{"temp": 3}', tool_call_id="c1", name="get_weather"),
    )
    messages = render_messages(snapshot_for("weather?", history=history), constrained=True)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    system = messages[0]["content"]
    assert system.startswith("You are a helpful assistant.")
    assert '{"tool": "none", "answer": "<your reply>"}' in system
    assert "- none: no tool." in system
    assert "- get_weather: Current weather for a city." in system
    assert json.loads(messages[2]["content"]) == {"tool": "get_weather",
                                                  "arguments": {"city": "Oslo"}}
    assert messages[3]["content"].startswith('Result of the tool `get_weather`:\n{"temp": 3}')
    assert "do not call the tool again" in messages[3]["content"]


def test_earlier_answers_are_shown_in_the_format_only_when_constrained() -> None:
    history = (ChatMessage("assistant", "It is sunny."), ChatMessage("user", "thanks"))
    constrained = render_messages(snapshot_for("q", history=history), constrained=True)
    assert json.loads(constrained[2]["content"]) == {"tool": "none", "answer": "It is sunny."}
    free = render_messages(snapshot_for("q", history=history, tools=()), constrained=False)
    assert free[2]["content"] == "It is sunny."
    assert "Reply with one JSON object" not in free[0]["content"]


def test_a_required_tool_is_named_in_the_prompt() -> None:
    messages = render_messages(snapshot_for("q", required_tool="search_docs"), constrained=True)
    assert "requires the tool `search_docs`" in messages[0]["content"]
    assert "- get_weather" not in messages[0]["content"]  # narrowed: only that tool
    assert "- none" not in messages[0]["content"]


def test_the_decision_grammar_names_only_the_choices() -> None:
    assert decision_choices(snapshot_for("q")) == ("get_weather", "search_docs", "none")
    assert decision_choices(snapshot_for("q", required_tool="search_docs")) == ("search_docs",)
    assert decision_choices(snapshot_for("q", tools=())) == ()
    grammar = decision_grammar(("get_weather", "none"))
    assert grammar == ('root ::= "{" " "? "\\"tool\\"" " "? ":" " "? '
                       '("\\"get_weather\\"" | "\\"none\\"")\n')
    assert decided_tool('{"tool": "get_weather"') == "get_weather"
    assert decided_tool('{"tool": "get_wea') is None


def test_the_arguments_grammar_continues_the_decision() -> None:
    grammar = arguments_grammar('root ::= "{" space "}"\nspace ::= " "?')
    assert grammar.startswith('root ::= "," " "? "\\"arguments\\"" " "? ":" " "? '
                              'kz-arguments "}"\n')
    assert 'kz-arguments ::= "{" space "}"' in grammar


def test_the_answer_closes_at_the_first_unescaped_quote() -> None:
    assert not answer_closed('Say \\"hi\\" and')
    assert answer_closed('Done."}')
    assert not answer_closed("ends in a backslash \\")


# --- parsing the reply as it streams ------------------------------------------------------


def _feed_all(pieces: list[str]) -> tuple[list[str], ConstrainedReply]:
    reply = ConstrainedReply(TOOLS, step=4)
    return [reply.feed(p) for p in pieces], reply


def test_answer_text_streams_as_the_string_is_written() -> None:
    out, reply = _feed_all(['{"', 'tool": "', 'none"', ', "answer": "', "Hel", "lo", ', wor',
                            'ld."', "}"])
    assert out == ["", "", "", "", "Hel", "lo", ", wor", "ld.", ""]
    assert reply.answer == "Hello, world." and reply.finish() is None


def test_escapes_split_across_tokens_are_decoded_once_complete() -> None:
    out, _ = _feed_all(['{"tool":"none","answer":"a', "\\", 'nb \\"q\\', '" \\u00', "e9 \\ud83d",
                            "\\ude00", ' \\\\"}'])
    assert "".join(out) == 'a\nb "q" é 😀 \\'
    assert out[1] == ""  # a lone backslash waits for its escape


def test_a_tool_reply_is_held_and_emitted_whole_at_the_end() -> None:
    pieces = ['{"tool": "get_', 'weather", "arguments": {"city": ', '"Paris"}}']
    out, reply = _feed_all(pieces)
    assert out == ["", "", ""] and reply.mode == "tool"
    assert reply.finish() == ToolCall("call_4_0", "get_weather", '{"city": "Paris"}')


def test_a_cut_or_unknown_tool_reply_yields_no_call() -> None:
    _, cut = _feed_all(['{"tool": "get_weather", "argu'])
    assert cut.finish() is None
    _, unknown = _feed_all(['{"tool": "run_shell", "arguments": {}}'])
    assert unknown.finish() is None


def test_whitespace_the_grammar_allows_does_not_confuse_the_parser() -> None:
    out, _ = _feed_all(["\n{ ", '"tool" :"none" ,', '"answer" :', ' "ok"', " }"])
    assert "".join(out) == "ok"


@given(st.text(max_size=60), st.lists(st.integers(min_value=1, max_value=7), max_size=40))
def test_any_answer_split_anywhere_decodes_to_itself(text: str, cuts: list[int]) -> None:
    raw = json.dumps({"tool": "none", "answer": text}, ensure_ascii=bool(len(text) % 2))
    pieces, i = [], 0
    for cut in cuts:
        pieces.append(raw[i:i + cut])
        i += cut
    pieces.append(raw[i:])
    out, reply = _feed_all(pieces)
    assert "".join(out) == text == reply.answer


def test_a_tool_result_is_shown_without_empty_members_or_the_calls_own_arguments() -> None:
    """Prompt tokens are what a CPU model pays for: a result keeps what it says."""
    body = {"status": "ok", "code": "print(42)", "stdout": "42\n", "stderr": "",
            "outputs": [], "truncated": False, "duration_ms": 12,
            "repair_instruction": None}
    history = (
        ChatMessage("assistant", "", (ToolCall("c1", "run_code", '{"code": "print(42)"}'),)),
        ChatMessage("tool", json.dumps(body), tool_call_id="c1", name="run_code"),
    )
    messages = render_messages(snapshot_for("q", history=history), constrained=True)
    shown = messages[3]["content"].split("\n", 1)[1].split("\n\n", 1)[0]
    assert json.loads(shown) == {"status": "ok", "stdout": "42\n", "duration_ms": 12}


def test_a_failed_result_asks_to_fix_or_say_plainly_what_failed() -> None:
    body = {"status": "error", "repair_instruction": "The run failed with X. Fix the code."}
    history = (
        ChatMessage("assistant", "", (ToolCall("c1", "run_code", '{"code": "x"}'),)),
        ChatMessage("tool", json.dumps(body), tool_call_id="c1", name="run_code"),
    )
    messages = render_messages(snapshot_for("q", history=history), constrained=True)
    assert "This call failed." in messages[3]["content"]
    assert "do not call the tool again" not in messages[3]["content"]
