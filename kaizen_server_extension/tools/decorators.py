"""The ``@tool(...)`` decorator: one declaration, next to the implementation, of everything the
trusted side needs to know about a tool (capability, bounds, room class, write category).

The declaration is the trusted wrapper's, never the model's: nothing a call passes can change it.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pydantic

from kaizen_server_extension.protocol.tools import Capability, WriteCategory
from kaizen_server_extension.tools.types import (
    DEFAULT_TIMEOUT_S,
    AuthorizeImpl,
    RegisteredTool,
    RoomClass,
    ToolDescriptor,
    ToolImpl,
)

# What OpenAI-compatible providers accept as a function name; anything else fails the whole
# provider request, so it is refused at declaration rather than at the first turn.
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolDeclarationError(ValueError):
    """A ``@tool`` declaration that cannot be a tool (a programming error, raised at import)."""


def tool(
    *,
    name: str | None = None,
    capability: Capability | str = Capability.UNDECLARED,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    room_class: RoomClass | str = RoomClass.UNKNOWN,
    write_category: WriteCategory | str = WriteCategory.NONE,
    repeat_creates_object: bool = False,
    protocol_group: str | None = None,
    surface: str = "general",
    explicit_grant_only: bool = False,
    input_schema: Mapping[str, Any] | None = None,
    description: str | None = None,
    authorize: AuthorizeImpl | None = None,
    withheld_arguments: Iterable[str] = (),
    requires: Iterable[str] = (),
    private_room_only: bool = False,
    delegates: bool = False,
) -> Callable[[ToolImpl], RegisteredTool]:
    """Declare an async tool implementation ``async def f(ctx, **arguments)``.

    The input schema is ``input_schema`` when given, else derived from the pydantic-annotated
    parameters after ``ctx``; the description is ``description`` or the docstring. The pipeline
    calls ``impl(ctx, **arguments)`` with the arguments already validated against the schema.

    ``authorize`` is the tool's own resource authorization: ``async def authorize(ctx,
    arguments) -> ResourceVerdict``, run just before execution against a read-only store.

    ``withheld_arguments`` name top-level arguments whose values stay in the trusted backend:
    observers (the journal's ``tool.requested``, approval requests) see only their size, never
    their text (artifact content, R-225). The tool itself gets them whole.

    ``requires`` names tools without which this one is pointless or unsafe: a run's catalog
    admits it only when every one of them was admitted too (request_document needs search
    and run_code, R-180). ``private_room_only`` keeps a tool out of a durable-shared room even
    while its owner is alone in it: what it returns is the member's alone, and the room's
    transcript is read by whoever joins later.

    ``delegates`` marks a tool that hands work to another agent: its results are delegated
    evidence, and a turn that used it may have done things its own calls do not show (the
    fallback asks the member to check the activity, R-049).
    """

    def decorate(fn: ToolImpl) -> RegisteredTool:
        tool_name = name or fn.__name__
        if not TOOL_NAME_RE.fullmatch(tool_name):
            raise ToolDeclarationError(f"tool name {tool_name!r} must match {TOOL_NAME_RE.pattern}")
        if not inspect.iscoroutinefunction(fn):
            raise ToolDeclarationError(f"tool {tool_name!r} must be an async function")
        if timeout_s <= 0:
            raise ToolDeclarationError(f"tool {tool_name!r}: timeout_s must be positive")
        if authorize is not None and not inspect.iscoroutinefunction(authorize):
            raise ToolDeclarationError(f"tool {tool_name!r}: authorize must be an async function")
        text = description if description is not None else inspect.getdoc(fn)
        if not text:
            raise ToolDeclarationError(f"tool {tool_name!r} needs a docstring or description=")
        schema = dict(input_schema) if input_schema is not None else schema_from_signature(fn)
        withheld = frozenset(withheld_arguments)
        unknown = withheld - set(schema.get("properties", {}))
        if unknown:
            raise ToolDeclarationError(
                f"tool {tool_name!r}: withheld_arguments {sorted(unknown)} are not parameters")
        try:
            descriptor = ToolDescriptor(
                name=tool_name,
                description=text,
                input_schema=schema,
                capability=Capability(capability),
                timeout_s=float(timeout_s),
                repeat_creates_object=repeat_creates_object,
                room_class=RoomClass(room_class),
                write_category=WriteCategory(write_category),
                protocol_group=protocol_group,
                surface=surface,
                explicit_grant_only=explicit_grant_only,
                withheld_arguments=withheld,
                requires_tools=frozenset(requires),
                private_room_only=private_room_only,
                extra={"delegates": True} if delegates else {},
            )
        except ValueError as exc:  # an unknown enum value: say which tool declared it
            raise ToolDeclarationError(f"tool {tool_name!r}: {exc}") from exc
        return RegisteredTool(descriptor=descriptor, impl=fn, authorize=authorize)

    return decorate


def schema_from_signature(fn: Callable[..., Any]) -> dict[str, Any]:
    """A JSON Schema (Draft 2020-12, as pydantic emits it) for the parameters after ``ctx``.

    ``extra="forbid"`` makes the schema closed, so a model inventing an argument is told so
    instead of the argument being silently dropped.
    """
    hints = typing.get_type_hints(fn, include_extras=True)
    params = list(inspect.signature(fn).parameters.values())[1:]  # the first is the context
    fields: dict[str, Any] = {}
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ToolDeclarationError(
                f"{fn.__name__}: parameter {param.name!r} must be a plain keyword parameter"
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model = pydantic.create_model(
        f"{fn.__name__}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **fields,
    )
    schema: dict[str, Any] = model.model_json_schema()
    schema.pop("title", None)
    return schema
