"""Constrained tool calling for small local models.

A small model picks tools well when its reply is held to a JSON schema, and badly when it
free-writes a tool-call syntax. Each step with advertised tools is constrained to exactly one
JSON object whose *first* key is the decision::

    {"tool": "<one advertised name>", "arguments": {<that tool's parameters>}}
    {"tool": "none", "answer": "<text for the member>"}

(:func:`reply_schema`: ``anyOf`` of the shapes; a required tool narrows it to that one tool,
with no ``none``). Putting the decision first matters: asked to choose between
``{"answer": ...}`` and ``{"tool": ...}`` objects, Qwen2.5-Coder-0.5B answered every time; asked
to name ``"tool"`` first (a name or ``none``), it chose right on all ten probe requests.

How the local gateway generates it ("decide first, then generate"):

1. *Decision*: a tiny grammar admits only ``{"tool": "<name or none>"``: a handful of tokens.
2. *A tool*: the rest, ``, "arguments": {...}}``, is generated under the grammar of that tool's
   argument schema, so the name is advertised and the arguments have the advertised shape.
   The call is emitted once, complete.
3. *none*: ``, "answer": "`` is appended and the model writes the answer **without a grammar**
   (a grammar over free text checks the whole 150k-token vocabulary at every token and ran
   5-10x slower here). The JSON string is decoded incrementally and streamed character by
   character as the model writes it; generation stops when the string closes.

Steps without tools (the synthesis step) are not constrained at all: plain text streams.

The argument schema given to the grammar is a *narrowing* of the advertised one: keywords the
grammar cannot express (``pattern``, ``format``, ``uniqueItems``) are dropped and large length
bounds are left to validation, while objects get ``additionalProperties: false``. Anything the
grammar lets through that the real schema refuses is refused by the tool pipeline, which
reports a schema error to the model like for any provider.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema

from kaizen_server_extension.models.payload import advertised_tools, to_plain_json
from kaizen_server_extension.protocol.model import ChatMessage, StepSnapshot
from kaizen_server_extension.protocol.model_facing import directives_in
from kaizen_server_extension.protocol.tools import AdvertisedTool, ToolCall

ANSWER_KEY = "answer"
TOOL_KEY = "tool"
ARGUMENTS_KEY = "arguments"
NO_TOOL = "none"
#: Follows each tool result in a constrained step.
RESULT_NUDGE = ('If this result answers the request, do not call the tool again: reply with "none" '
                "and give the answer.")
#: Follows a tool result that carries a repair instruction (a failed run): the model should
#: fix and call again, or tell the member plainly; the instruction itself is model-facing.
FAILED_RESULT_NUDGE = ("This call failed. Fix the cause and call the tool again, or reply with "
                       '"none" and tell the member in your own words what failed and why.')
#: Appended after a ``none`` decision: the model then writes the answer string freely.
ANSWER_OPENER = ', "answer": "'
#: Written after a call's decision, before its arguments.
ARGUMENTS_OPENER = ', "arguments": {'
#: A string argument without a bound or with one at least this long is "long text".
LONG_TEXT_MIN_CHARS = 1000

#: Length/size bounds above this are enforced by validation, not spelled out in the grammar
#: (a bound of N becomes N nested optional rules).
GRAMMAR_BOUND_LIMIT = 64

# Keywords the grammar keeps; everything else (pattern, format, uniqueItems, default,
# description, title, examples, ...) is dropped from the grammar's copy only.
_STRUCTURAL = frozenset({
    "type", "properties", "required", "items", "prefixItems", "enum", "const", "anyOf",
    "oneOf", "allOf", "additionalProperties", "minItems", "maxItems", "minLength", "maxLength",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "$ref", "$defs",
    "definitions",
})
_BOUNDS = frozenset({"minItems", "maxItems", "minLength", "maxLength"})


def grammar_schema(schema: Any) -> Any:
    """A copy of a tool's parameter schema that llama.cpp's JSON-schema grammar can express
    and that accepts only values the original could accept (modulo dropped keywords)."""
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key not in _STRUCTURAL:
            continue
        if key in _BOUNDS and (not isinstance(value, int) or value > GRAMMAR_BOUND_LIMIT):
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, Mapping):
            out[key] = {str(k): grammar_schema(v) for k, v in value.items()}
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(value, Sequence):
            out[key] = [grammar_schema(v) for v in value]
        elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
            out[key] = grammar_schema(value)
        else:
            out[key] = to_plain_json(value)
    is_object = out.get("type") == "object" or "properties" in out
    if is_object and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if is_object:
        out.setdefault("type", "object")
        out.setdefault("properties", {})
    return out


def answer_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {TOOL_KEY: {"const": NO_TOOL},
                       ANSWER_KEY: {"type": "string", "minLength": 1}},
        "required": [TOOL_KEY, ANSWER_KEY],
        "additionalProperties": False,
    }


def tool_schema(tool: AdvertisedTool) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {TOOL_KEY: {"const": tool.name}, ARGUMENTS_KEY: arguments_schema(tool)},
        "required": [TOOL_KEY, ARGUMENTS_KEY],
        "additionalProperties": False,
    }


def reply_schema(tools: Sequence[AdvertisedTool], *, required_tool: str | None = None
                 ) -> dict[str, Any] | None:
    """The JSON schema one step's reply must satisfy, or None for an unconstrained step.

    ``tools`` are the step's advertised tools (already projected). With ``required_tool`` the
    reply must call exactly that tool: the answer alternative disappears."""
    if required_tool is not None:
        chosen = [t for t in tools if t.name == required_tool]
        if not chosen:
            raise ValueError("the required tool is not advertised")
        return tool_schema(chosen[0])
    if not tools:
        return None
    return {"anyOf": [*(tool_schema(t) for t in tools), answer_schema()]}


def step_schema(snapshot: StepSnapshot) -> dict[str, Any] | None:
    """:func:`reply_schema` for a step (raises ``ModelStepError`` for a required tool the
    catalog lacks, exactly like the HTTP gateway)."""
    return reply_schema(advertised_tools(snapshot), required_tool=snapshot.required_tool)


def decision_choices(snapshot: StepSnapshot) -> tuple[str, ...]:
    """What the decision may name: the advertised tools, plus ``none`` unless a tool is
    required. Empty for a step without tools (no constraint)."""
    names = tuple(t.name for t in advertised_tools(snapshot))
    if not names or snapshot.required_tool is not None:
        return names
    return (*names, NO_TOOL)


def decision_grammar(choices: Sequence[str]) -> str:
    """GBNF admitting only ``{"tool": "<one of choices>"`` (the grammar's spacing is the one
    llama.cpp's JSON-schema grammars use: at most one space)."""
    alternatives = " | ".join(_gbnf_literal(json.dumps(c)) for c in choices)
    return (f'root ::= "{{" " "? {_gbnf_literal(json.dumps(TOOL_KEY))} " "? ":" " "? '
            f"({alternatives})\n")


def arguments_grammar(arguments_gbnf: str) -> str:
    """GBNF for the rest of a call after its decision: ``, "arguments": <args>}``, given
    the GBNF of the argument schema (whose ``root`` rule is renamed)."""
    renamed = re.sub(r"^root ::=", "kz-arguments ::=", arguments_gbnf, flags=re.MULTILINE)
    return (f'root ::= "," " "? {_gbnf_literal(json.dumps(ARGUMENTS_KEY))} " "? ":" " "? '
            f'kz-arguments "}}"\n{renamed}')


def arguments_schema(tool: AdvertisedTool) -> dict[str, Any]:
    """The grammar's copy of a tool's argument schema."""
    parameters = grammar_schema(tool.parameters) if tool.parameters else {}
    return parameters or {"type": "object", "properties": {}, "additionalProperties": False}


def _gbnf_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


_DECISION = re.compile(r'\s*\{\s*"tool"\s*:\s*"(?P<name>[^"\\]*)"')


def decided_tool(text: str) -> str | None:
    """The name a complete decision prefix chose (``none`` included), else None."""
    match = _DECISION.match(text)
    return match.group("name") if match else None


# --- the prompt ------------------------------------------------------------------------------


def protocol_prompt(tools: Sequence[AdvertisedTool], *, required_tool: str | None = None) -> str:
    """Tells the model the tools and the reply format (appended to the system message)."""
    lines = ["# Tools"]
    if required_tool is None:
        # Listed like a tool, "none" competes on equal terms (without it the model picked
        # some loosely related tool for small talk and general questions).
        lines.append(f"- {NO_TOOL}: no tool. Answer directly from your own knowledge: "
                     "greetings, facts, explanations, writing.")
    for tool in tools:
        parameters = json.dumps(_described(tool.parameters), separators=(",", ":"),
                                ensure_ascii=False)
        lines.append(f"- {tool.name}: {tool.description.strip()} Arguments: {parameters}")
    lines += [
        "",
        "# Reply format",
        'Reply with one JSON object whose first key is "tool".',
        'To call a tool: {"tool": "<tool name>", "arguments": {...}}',
    ]
    if required_tool is not None:
        lines.append(f"This request requires the tool `{required_tool}`: call it now.")
    else:
        lines += [
            'To answer without a tool: {"tool": "none", "answer": "<your reply>"}',
            "Call a tool when the member asks for it or when the request needs code to run "
            'or information to look up; use "none" when no tool is needed. When a tool '
            'result already answers the request, use "none" and answer with what it '
            "returned.",
        ]
    return "\n".join(lines)


def _described(schema: Any) -> Any:
    """Parameter schema for the prompt: shape and descriptions, no validation noise."""
    if not isinstance(schema, Mapping):
        return to_plain_json(schema)
    keep = {"type", "properties", "required", "items", "enum", "description", "anyOf",
            "default"}
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key not in keep:
            continue
        if key == "properties" and isinstance(value, Mapping):
            out[key] = {str(k): _described(v) for k, v in value.items()}
        elif key == "items" and isinstance(value, Mapping):
            out[key] = _described(value)
        elif key == "anyOf" and isinstance(value, Sequence):
            out[key] = [_described(v) for v in value]
        else:
            out[key] = to_plain_json(value)
    return out


def render_messages(snapshot: StepSnapshot, *, constrained: bool) -> list[dict[str, str]]:
    """Chat messages for a local model's own chat template (roles system/user/assistant).

    Assistant tool calls are written in the reply format, tool results become user messages
    naming the tool, and in a constrained step earlier answers are shown as
    ``{"tool": "none", "answer": ...}`` so the history teaches the format it is held to."""
    tools = advertised_tools(snapshot)
    messages: list[dict[str, str]] = []
    arguments: dict[str, Any] = {}
    for message in snapshot.messages:
        for call in message.tool_calls:
            arguments[call.call_id] = _arguments(call.arguments)
        if message.role == "tool":
            message = ChatMessage(role="tool", content=compact_result(
                message.content, arguments.get(message.tool_call_id or "")),
                tool_call_id=message.tool_call_id, name=message.name)
        messages.append(_render(message, constrained=constrained))
    protocol = protocol_prompt(tools, required_tool=snapshot.required_tool) if constrained \
        else ""
    if protocol:
        if messages and messages[0]["role"] == "system":
            messages[0] = {"role": "system",
                           "content": messages[0]["content"].rstrip() + "\n\n" + protocol}
        else:
            messages.insert(0, {"role": "system", "content": protocol})
    return messages


def compact_result(content: str, arguments: Any = None) -> str:
    """A tool result as a small local model reads it: a JSON object without its empty
    members (``""``, ``[]``, ``{}``, null, false) and without members that only repeat the
    call's own arguments (run_code's ``code``). Every prompt token costs a CPU model time;
    these carry nothing. Anything else is passed as it is."""
    try:
        body = json.loads(content)
    except ValueError:
        return content
    if not isinstance(body, dict):
        return content
    given = arguments if isinstance(arguments, Mapping) else {}
    kept = {key: value for key, value in body.items()
            if value not in ("", [], {}, None, False)
            and not (key in given and given[key] == value)}
    if len(kept) == len(body):
        return content
    return json.dumps(kept, ensure_ascii=False, separators=(",", ":"))


def _render(message: ChatMessage, *, constrained: bool) -> dict[str, str]:
    if message.role == "tool":
        content = f"Result of the tool `{message.name or 'tool'}`:\n{message.content}"
        if constrained:
            # Without this a small model calls the same tool again, result after result.
            failed = bool(directives_in(message.content))
            content += "\n\n" + (FAILED_RESULT_NUDGE if failed else RESULT_NUDGE)
        return {"role": "user", "content": content}
    if message.role == "assistant" and message.tool_calls:
        calls = [json.dumps({TOOL_KEY: c.name, ARGUMENTS_KEY: _arguments(c.arguments)},
                            ensure_ascii=False) for c in message.tool_calls]
        return {"role": "assistant", "content": "\n".join(calls)}
    if message.role == "assistant" and constrained:
        return {"role": "assistant", "content": json.dumps(
            {TOOL_KEY: NO_TOOL, ANSWER_KEY: message.content}, ensure_ascii=False)}
    return {"role": message.role, "content": message.content}


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return raw


# --- parsing the constrained reply incrementally ----------------------------------------------

_ANSWER_OPEN = re.compile(r'\s*\{\s*"tool"\s*:\s*"none"\s*,\s*"answer"\s*:\s*"')
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r",
            "t": "\t"}


@dataclass
class ConstrainedReply:
    """Feeds on the raw text of a constrained reply; hands back answer text as soon as it is
    decodable and, at the end, the tool call when the reply was one.

    ``tools`` are the step's advertised tools: a call naming anything else is dropped."""

    tools: Sequence[AdvertisedTool]
    step: int
    raw: str = ""
    mode: Literal["pending", "answer", "tool", "other"] = "pending"
    _cursor: int = 0
    _closed: bool = False
    _answer: list[str] = field(default_factory=list)

    def feed(self, text: str) -> str:
        """Append raw model output; returns the answer text newly decoded (maybe "")."""
        self.raw += text
        if self.mode == "pending":
            self._decide()
        if self.mode == "answer" and not self._closed:
            decoded = self._decode()
            self._answer.append(decoded)
            return decoded
        return ""

    @property
    def answer(self) -> str:
        return "".join(self._answer)

    def finish(self) -> ToolCall | None:
        """The tool call the complete reply makes, or None (an answer, or unusable output)."""
        if self.mode != "tool":
            return None
        try:
            reply = json.loads(self.raw, strict=False)  # the grammar admits raw newlines
        except ValueError:
            return None  # cut short (max tokens): an empty step the controller retries
        if not isinstance(reply, dict):
            return None
        name = reply.get(TOOL_KEY)
        arguments = reply.get(ARGUMENTS_KEY, {})
        if not isinstance(name, str) or name not in {t.name for t in self.tools}:
            return None
        return ToolCall(call_id=f"call_{self.step}_0", name=name,
                        arguments=json.dumps(arguments, ensure_ascii=False))

    def _decide(self) -> None:
        if (match := _ANSWER_OPEN.match(self.raw)) is not None:
            self.mode, self._cursor = "answer", match.end()
            return
        name = decided_tool(self.raw)
        if name is not None and name != NO_TOOL:
            self.mode = "tool"
        elif not _could_open(self.raw):
            self.mode = "other"

    def _decode(self) -> str:
        """Decode the answer string from the cursor up to what is complete."""
        out: list[str] = []
        raw, i = self.raw, self._cursor
        while i < len(raw):
            char = raw[i]
            if char == '"':
                self._closed = True
                i += 1
                break
            if char != "\\":
                out.append(char)
                i += 1
                continue
            if i + 1 >= len(raw):
                break  # an escape split across tokens: wait for the rest
            code = raw[i + 1]
            if code in _ESCAPES:
                out.append(_ESCAPES[code])
                i += 2
                continue
            if code != "u":
                out.append(code)  # invalid escape (cannot pass the grammar): keep the char
                i += 2
                continue
            decoded = _unicode_escape(raw, i)
            if decoded is None:
                break
            text, i = decoded
            out.append(text)
        self._cursor = i
        return "".join(out)


def answer_closed(text: str) -> bool:
    """True once ``text`` (the answer string's body as written so far) holds the closing,
    unescaped quote."""
    escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            return True
    return False


def long_text_split(tool: AdvertisedTool) -> tuple[str, tuple[tuple[str, Any], ...]] | None:
    """(the tool's long free-text argument, the grammar schemas of its other arguments in
    schema order), or None. The long one is the schema's first property, required, a string
    without enum, pattern, format or a bound under :data:`LONG_TEXT_MIN_CHARS` (run_code's
    ``code``): a local model writes it first and without a grammar, then each other argument
    under its own (``models/local.py``)."""
    schema = arguments_schema(tool)
    properties = tool.parameters.get("properties") if tool.parameters else None
    required = tool.parameters.get("required") if tool.parameters else None
    if not isinstance(properties, Mapping) or not properties or \
            not isinstance(required, Sequence):
        return None
    name = next(iter(properties))
    prop = properties[name]
    bound = prop.get("maxLength") if isinstance(prop, Mapping) else None
    if name not in required or not isinstance(prop, Mapping) or prop.get("type") != "string" \
            or {"enum", "const", "pattern", "format"} & set(prop) \
            or (isinstance(bound, int) and bound < LONG_TEXT_MIN_CHARS):
        return None
    grammar_properties = schema.get("properties") or {}
    others = tuple((k, v) for k, v in grammar_properties.items() if k != name)
    return str(name), others


def string_end(body: str) -> int | None:
    """The index of the unescaped quote that closes a JSON string whose opening quote came
    before ``body``, or None while it is open."""
    escaped = False
    for i, char in enumerate(body):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            return i
    return None


def long_text_value(body: str) -> str | None:
    """The long text from its string body as written (up to the closing quote), or None
    while it is unfinished or not a JSON string."""
    end = string_end(body)
    if end is None:
        return None
    try:
        text = json.loads('"' + body[:end] + '"', strict=False)
    except ValueError:
        return None
    return text if isinstance(text, str) else None


def call_reply(tool: AdvertisedTool, arguments: Mapping[str, Any]) -> str | None:
    """The rest of a call (``, "arguments": {...}}``), or None when ``arguments`` do not
    satisfy the tool's schema."""
    if not validate_arguments(tool, dict(arguments)):
        return None
    return f", {json.dumps(ARGUMENTS_KEY)}: {json.dumps(arguments, ensure_ascii=False)}}}"


def _unicode_escape(raw: str, i: int) -> tuple[str, int] | None:
    """Decode ``\\uXXXX`` (and a following low surrogate) at ``i``; None until complete."""
    hex1 = raw[i + 2:i + 6]
    if len(hex1) < 4:
        return None
    try:
        first = int(hex1, 16)
    except ValueError:
        return "\ufffd", i + 6
    if 0xD800 <= first < 0xDC00:
        tail = raw[i + 6:i + 12]
        if len(tail) < 6 and "\\u".startswith(tail[:2]):
            return None  # the low half may still arrive
        if tail.startswith("\\u"):
            try:
                second = int(tail[2:6], 16)
            except ValueError:
                second = -1
            if 0xDC00 <= second < 0xE000:
                return chr(0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)), i + 12
        return "\ufffd", i + 6
    if 0xDC00 <= first < 0xE000:
        return "\ufffd", i + 6
    return chr(first), i + 6


def _could_open(raw: str) -> bool:
    """True while ``raw`` may still become the start of an answer or a tool call."""
    compact = re.sub(r"\s+", "", raw)
    answer = '{"tool":"none","answer":"'
    return answer.startswith(compact) or compact.startswith('{"tool":"') \
        or '{"tool":"'.startswith(compact)


def validate_arguments(tool: AdvertisedTool, arguments: Any) -> bool:
    """True when ``arguments`` satisfy the tool's advertised parameter schema."""
    schema = to_plain_json(tool.parameters) or {"type": "object"}
    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator = validator_class(schema)
        return not any(True for _ in validator.iter_errors(arguments))
    except (jsonschema.SchemaError, TypeError, ValueError):
        return False
