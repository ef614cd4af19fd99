"""Tool input schemas: admission, the advertised projection, and execution-time validation.

Three rules live here (spec: Request-scoped platform tools):

* A descriptor's input schema must pass the JSON Schema 2020-12 meta-schema and our size, depth
  and reference bounds before it enters a catalog. One that does not is omitted by itself,
  logged once, and never repaired into a weaker contract (R-328..R-331).
* The schema the model sees strips length bounds at or above 2,000. A local model server turns
  the catalog into a grammar and rejects the *whole* grammar when one repetition bound reaches
  that size, silently dropping structured output for every tool (R-335). Both ``max*`` and
  ``min*`` length/count keywords become grammar repetition counts, so both are stripped; numeric
  ``minimum``/``maximum`` are values, not repetitions, and stay.
* The original schema, stripped bounds included, is what a call is validated against (R-336).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.tools.types import ToolDescriptor

log = logging.getLogger(__name__)

STRIP_THRESHOLD = 2000
LENGTH_BOUND_KEYWORDS = frozenset(
    {
        "maxLength", "maxItems", "maxProperties", "maxContains",
        "minLength", "minItems", "minProperties", "minContains",
    }
)
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_DESCRIPTION_CHARS = 16 * 1024
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# Keywords whose value is one subschema, a name → subschema map, or a list of subschemas. Only
# these positions are schemas: a *property* called "maxLength" or a ``const``/``default`` value
# that happens to contain one is data, and must never be touched.
_ONE = ("items", "contains", "additionalProperties", "propertyNames", "not", "if", "then",
        "else", "unevaluatedItems", "unevaluatedProperties", "contentSchema", "additionalItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")


def _map_subschemas(
    schema: Mapping[str, Any], fn: Callable[[Any], Any]
) -> dict[str, Any]:
    """A copy of ``schema`` with ``fn`` applied to every direct subschema."""
    out: dict[str, Any] = dict(schema)
    for key in _ONE:
        if key in out:
            value = out[key]
            # Draft 4-7 array-form "items" is a list of schemas.
            out[key] = [fn(v) for v in value] if isinstance(value, list) else fn(value)
    for key in _MAP:
        if isinstance(out.get(key), Mapping):
            out[key] = {name: fn(sub) for name, sub in out[key].items()}
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [fn(sub) for sub in out[key]]
    return out


def iter_subschemas(schema: Any) -> Iterator[Mapping[str, Any]]:
    """Every schema object in ``schema`` (itself included), keyword-aware, depth first."""
    if not isinstance(schema, Mapping):
        return
    yield schema
    children: list[Any] = []
    _map_subschemas(schema, lambda sub: children.append(sub))
    for child in children:
        yield from iter_subschemas(child)


def project_schema(schema: Any) -> Any:
    """The advertised copy of ``schema``: length bounds ≥ :data:`STRIP_THRESHOLD` removed at
    every schema position; everything else, including smaller bounds, kept as is."""
    if not isinstance(schema, Mapping):
        return schema  # boolean schemas carry no bounds
    out = _map_subschemas(schema, project_schema)
    for key in LENGTH_BOUND_KEYWORDS & out.keys():
        value = out[key]
        if isinstance(value, int | float) and not isinstance(value, bool) \
                and value >= STRIP_THRESHOLD:
            del out[key]
    return out


# --- admission --------------------------------------------------------------------------


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` may not be a tool input contract, or None when it may."""
    if not isinstance(schema, Mapping):
        return "input schema is not an object"
    try:
        raw = json.dumps(schema, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return "input schema is not JSON"
    # Catalogs are frozen at every admission; the meta-schema check is the expensive part
    # and depends only on the schema's canonical text.
    return _schema_problem_of_text(raw)


@functools.lru_cache(maxsize=8192)
def _schema_problem_of_text(raw: str) -> str | None:
    schema = json.loads(raw)
    if len(raw.encode()) > MAX_SCHEMA_BYTES:
        return f"input schema exceeds {MAX_SCHEMA_BYTES} bytes"
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        return f"input schema nests deeper than {MAX_SCHEMA_DEPTH}"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return f"input schema fails the 2020-12 meta-schema at {_pointer(exc.absolute_path)}"
    if schema.get("type") != "object":
        # Providers accept only object-typed function parameters; one bad tool would fail the
        # whole provider request.
        return 'input schema must have "type": "object" at the top level'
    return _reference_problem(schema)


def _reference_problem(root: Mapping[str, Any]) -> str | None:
    """Only acyclic local JSON-pointer references; nothing is ever fetched or re-based."""
    edges: dict[str, set[str]] = {}

    def refs_in(node: Any) -> set[str]:
        found: set[str] = set()
        for sub in iter_subschemas(node):
            for key in ("$dynamicRef", "$recursiveRef"):
                if key in sub:
                    raise _Refused(f"{key} is not supported")
            if sub is not node and "$id" in sub:
                raise _Refused("nested $id is not supported")
            ref = sub.get("$ref")
            if isinstance(ref, str):
                if ref != "#" and not ref.startswith("#/"):
                    raise _Refused(f"non-local $ref {ref[:80]!r}")
                found.add(ref)
        return found

    try:
        pending = list(refs_in(root))
        while pending:
            ref = pending.pop()
            if ref in edges:
                continue
            target = _resolve_pointer(root, ref)
            edges[ref] = refs_in(target)
            pending.extend(edges[ref])
        if _has_cycle(edges):
            return "input schema is recursive"
    except _Refused as exc:
        return f"input schema {exc}"
    return None


class _Refused(Exception):
    pass


def _resolve_pointer(root: Mapping[str, Any], ref: str) -> Any:
    node: Any = root
    for token in ref[2:].split("/") if ref != "#" else ():
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise _Refused(f"$ref {ref[:80]!r} does not resolve")
    return node


def _has_cycle(edges: Mapping[str, set[str]]) -> bool:
    # A reference to "#" or to a pointer that contains the referring node is a cycle too; a
    # pointer edge a → b with b a prefix of a (b contains a) closes one.
    state: dict[str, int] = {}

    def visit(node: str) -> bool:
        state[node] = 1
        for nxt in edges.get(node, ()):
            if nxt == "#" or node.startswith(nxt + "/") or node == nxt:
                return True
            if state.get(nxt) == 1 or (state.get(nxt) is None and visit(nxt)):
                return True
        state[node] = 2
        return False

    return any(state.get(n) is None and visit(n) for n in edges) or "#" in edges


def _depth(value: Any, level: int = 1) -> int:
    if isinstance(value, Mapping):
        return max((_depth(v, level + 1) for v in value.values()), default=level)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level)
    return level - 1


def descriptor_problem(descriptor: ToolDescriptor) -> str | None:
    """Why ``descriptor`` may not enter a catalog, or None."""
    if not TOOL_NAME_RE.fullmatch(descriptor.name):
        return "tool name is not a valid function name"
    if not descriptor.description or len(descriptor.description) > MAX_DESCRIPTION_CHARS:
        return "description is empty or too long"
    return schema_problem(descriptor.input_schema)


@dataclass(frozen=True)
class Omitted:
    name: str
    reason: str


_logged: set[tuple[str, str]] = set()
_MAX_LOGGED = 10_000


def admit_descriptors(
    descriptors: Iterable[ToolDescriptor],
) -> tuple[list[ToolDescriptor], list[Omitted]]:
    """Split ``descriptors`` into the admissible and the omitted. Each omission is logged once
    per (descriptor content, reason); the descriptor is dropped as is, never repaired."""
    admitted: list[ToolDescriptor] = []
    omitted: list[Omitted] = []
    for descriptor in descriptors:
        reason = descriptor_problem(descriptor)
        if reason is None:
            admitted.append(descriptor)
            continue
        omitted.append(Omitted(descriptor.name, reason))
        key = (_fingerprint(descriptor), reason)
        if key not in _logged:
            if len(_logged) >= _MAX_LOGGED:  # dynamic sources must not grow this forever
                _logged.clear()
            _logged.add(key)
            log.warning("tool descriptor omitted: name=%r reason=%s", descriptor.name[:80], reason)
    return admitted, omitted


def _fingerprint(descriptor: ToolDescriptor) -> str:
    raw = json.dumps([descriptor.name, descriptor.description, descriptor.input_schema],
                     sort_keys=True, default=repr)
    return hashlib.sha256(raw.encode()).hexdigest()


def _pointer(path: Iterable[Any]) -> str:
    return "/" + "/".join(str(p) for p in path)


# --- execution-time validation -----------------------------------------------------------


class InvalidArguments(MemberSafeError):
    """The model's arguments do not satisfy the tool's declared (unprojected) schema."""

    def __init__(self, message: str, *, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message, code="invalid_arguments", domain="caller")
        self.problems = problems


MAX_REPORTED_PROBLEMS = 5


def parse_arguments(raw: str) -> dict[str, Any]:
    """Parse tool-call argument text: one JSON object, no duplicate keys, no NaN/Infinity.

    A duplicate key is refused because JSON makes the *last* one authoritative, so a checker
    and an executor reading the text differently could disagree about what was asked.
    """
    if not raw.strip():
        # Models commonly send an empty string for a call without arguments.
        return {}

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise InvalidArguments(f"arguments repeat the key {key[:80]!r}")
            seen[key] = value
        return seen

    def no_constant(token: str) -> Any:
        raise InvalidArguments(f"arguments contain the non-JSON number {token}")

    try:
        value = json.loads(raw, object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise InvalidArguments(f"arguments are not valid JSON ({exc.msg} at {exc.pos})") from None
    except RecursionError:
        raise InvalidArguments("arguments nest too deeply") from None
    if not isinstance(value, dict):
        raise InvalidArguments("arguments must be a JSON object")
    return value


@functools.lru_cache(maxsize=512)
def _validator(canonical_schema: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(canonical_schema))


def validator_for(schema: Mapping[str, Any]) -> Draft202012Validator:
    return _validator(json.dumps(schema, sort_keys=True, separators=(",", ":")))


def validate_arguments(descriptor: ToolDescriptor, raw_json_text: str) -> dict[str, Any]:
    """The parsed arguments when they satisfy the descriptor's *original* schema, else
    :class:`InvalidArguments` naming each failing path (values are not echoed)."""
    arguments = parse_arguments(raw_json_text)
    errors = sorted(
        validator_for(descriptor.input_schema).iter_errors(arguments),
        key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path], e.validator),
    )
    if not errors:
        return arguments
    problems = tuple(_describe(e) for e in errors[:MAX_REPORTED_PROBLEMS])
    more = len(errors) - len(problems)
    message = f"Invalid arguments for {descriptor.name}: " + "; ".join(problems)
    if more > 0:
        message += f"; and {more} more"
    raise InvalidArguments(message, problems=problems)


_BOUND_WORDS = {
    "maxLength": "is longer than {} characters",
    "minLength": "is shorter than {} characters",
    "maxItems": "has more than {} items",
    "minItems": "has fewer than {} items",
    "maxProperties": "has more than {} properties",
    "minProperties": "has fewer than {} properties",
    "maximum": "is greater than {}",
    "minimum": "is less than {}",
    "exclusiveMaximum": "is not less than {}",
    "exclusiveMinimum": "is not greater than {}",
    "type": "is not of type {}",
    "pattern": "does not match the pattern {}",
}


def _describe(error: jsonschema.ValidationError) -> str:
    path = "$" + "".join(
        f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
    )
    template = _BOUND_WORDS.get(str(error.validator))
    if template is not None:
        text = template.format(json.dumps(error.validator_value)[:80])
    else:
        # required / additionalProperties / enum... name keys, not the offending values.
        text = error.message if error.validator in ("required", "additionalProperties") \
            else f"fails {error.validator}"
    return f"{path} {text}"[:240]
