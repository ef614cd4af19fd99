"""An external OpenAPI document compiled into callable operations (docs/openapi-sources.md).

Pure and synchronous: the schema cache runs it in a worker thread, off the event loop (R-332).
The document is **untrusted metadata** (R-135): nothing in it becomes authority, and nothing
invalid is repaired into a weaker contract (R-331) — an operation that cannot be compiled
exactly is omitted by itself, with its reason, and the others are unaffected (R-330):

* JSON or YAML (YAML without anchors or aliases, so a small document cannot expand into a
  huge one), at most :data:`MAX_DOCUMENT_BYTES`; OpenAPI 3.0 or 3.1; at most
  :data:`MAX_OPERATIONS` admitted operations (R-401, R-329).
* Each operation needs an ``operationId`` that can be part of a tool name; it is never
  derived from the method or path.
* Effect class (R-340, R-341): an explicit ``x-effect`` of ``read``, ``write`` or
  ``sensitive`` is authoritative (R-338); without one, GET, HEAD and OPTIONS are reads, DELETE
  is sensitive and every other method is a write. Any other ``x-effect`` value omits the
  operation rather than guessing; the operation's name, summary or tags never make it safer.
* Arguments are the operation's path and query parameters and a JSON request body
  (``body``). Header and cookie parameters are never model-supplied (R-343): an optional one is
  left out, a required one omits the operation. ``servers`` is ignored: requests go to the API
  base the member registered.
* An operation whose parameters or body can carry a credential-shaped field or a
  ``writeOnly`` value is omitted (R-347).
* Authentication (``security`` / ``securitySchemes``) compiles into value-free plans,
  :class:`CompiledAuth`: every alternative made of one supported scheme, in the document's
  order — HTTP Bearer or Basic, an API key in a header, a cookie or the query string, OAuth 2
  / OpenID Connect access tokens (as Bearer), mutual TLS (a client certificate and key,
  ``tools/mtls.py``). Alternatives that combine schemes are not supported; an operation whose
  every alternative is unsupported or incomplete is omitted (R-385). The compiled document is
  shared by every member and cached, so it does not apply the deployment's ceilings:
  discovery picks the first alternative they allow (a query-string key only with
  ``KAIZEN_EXTERNAL_QUERY_AUTH_ENABLED``, R-384; ``OpenApiSources.offerable``). The plan names
  no value: the credential quarantine (docs/credentials.md) attaches the member's credential
  to the one request, and discovery offers such an operation only when credentials are
  enabled.
* The input schema is made self-contained (``#/components/schemas/…`` become ``$defs``) and
  must pass the catalog's own admission — the JSON Schema 2020-12 meta-schema and its size,
  depth and acyclic-reference bounds (``tools/schema.py``, R-328, R-329) — here and again when
  a run's catalog is frozen.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from kaizen_server_extension.policy.credential_arguments import RESERVED_CREDENTIAL_HEADERS
from kaizen_server_extension.policy.redaction import is_credential_key
from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.tools.schema import schema_problem

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
MAX_OPERATIONS = 2000
#: Omitted operations whose reasons are kept (the count is kept for all).
MAX_REPORTED_OMISSIONS = 50
METHODS = ("get", "put", "post", "delete", "options", "head", "patch")
EFFECT_KEY = "x-effect"
OPERATION_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_COMPONENT_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_PARAMETER_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_PATH_RE = re.compile(r"^/(?!/)[^\s?#\\]*$")
_TEMPLATE_RE = re.compile(r"\{([^{}/]+)\}")
#: Components one operation's schema may pull in, and how deep $ref chains may go.
MAX_DEFS = 256
MAX_REF_HOPS = 8
MAX_DESCRIPTION_CHARS = 1024
BODY = "body"

_DECLARED_EFFECTS = {"read": Capability.READ, "write": Capability.WRITE,
                     "sensitive": Capability.SENSITIVE}


class DocumentRejected(Exception):
    """The whole document cannot be used; ``code`` is stable and member-safe."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Omit(Exception):
    """One operation cannot be compiled exactly: it is omitted with this reason."""


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    location: Literal["path", "query"]
    required: bool


@dataclass(frozen=True, slots=True)
class CompiledAuth:
    """How an operation authenticates: a security scheme's name in the document, and how its
    value travels. Never a value (R-386)."""

    scheme: str
    kind: Literal["bearer", "basic", "header", "cookie", "query", "mtls"]
    #: The header, cookie or query parameter name (``header``, ``cookie``, ``query``).
    name: str = ""

    @property
    def in_query(self) -> bool:
        """A key that rides in the URL's query string: offered only under the query-auth
        ceiling (R-384)."""
        return self.kind == "query"

    def public(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "kind": self.kind, "name": self.name or None}


@dataclass(frozen=True, slots=True)
class CompiledOperation:
    operation_id: str
    method: str
    path: str
    parameters: tuple[Parameter, ...]
    #: Whether a JSON body is taken (``body`` argument), and whether it is required.
    takes_body: bool
    body_required: bool
    input_schema: Mapping[str, Any]
    effect: Capability
    description: str
    #: The authentication the operation needs, or None (an anonymous operation). As
    #: compiled: the first supported alternative; as offered (``OpenApiSources.offerable``):
    #: the first one the deployment's ceilings allow.
    auth: CompiledAuth | None = None
    #: Every supported alternative, in the document's order (empty when anonymous).
    auth_alternatives: tuple[CompiledAuth, ...] = ()

    def public(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"operation_id": self.operation_id, "method": self.method,
                                 "path": self.path, "effect": self.effect.value}
        if self.auth is not None:
            shown["auth"] = self.auth.public()
        return shown


@dataclass(frozen=True, slots=True)
class CompiledDocument:
    """What a document compiled into: schemas only, never responses or credentials (R-326)."""

    digest: str
    title: str
    operations: tuple[CompiledOperation, ...]
    omitted: tuple[tuple[str, str], ...] = ()
    omitted_count: int = 0
    by_id: Mapping[str, CompiledOperation] = field(default_factory=dict)


# --- parsing --------------------------------------------------------------------------


class _NoAliasLoader(yaml.SafeLoader):
    """Safe YAML that refuses anchors and aliases (a billion-laughs document stays small)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("YAML aliases are not accepted")
        event = self.peek_event()
        if getattr(event, "anchor", None):
            raise yaml.YAMLError("YAML anchors are not accepted")
        return super().compose_node(parent, index)


def parse_document(raw: bytes) -> Mapping[str, Any]:
    """The document as a mapping: JSON, else YAML 1.1 safe without aliases."""
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise DocumentRejected("schema_too_large",
                               f"The document is larger than {MAX_DOCUMENT_BYTES} bytes.")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DocumentRejected("schema_unreadable", "The document is not UTF-8.") from None
    try:
        if text.lstrip().startswith("{"):
            document = json.loads(text)
        else:
            document = yaml.load(text, Loader=_NoAliasLoader)
    except (ValueError, yaml.YAMLError, RecursionError):
        raise DocumentRejected("schema_unreadable",
                               "The document is neither valid JSON nor valid YAML.") from None
    if not isinstance(document, Mapping):
        raise DocumentRejected("schema_unreadable", "The document is not an object.")
    version = document.get("openapi")
    if not isinstance(version, str) or not re.fullmatch(r"3\.[01]\.\d+", version):
        raise DocumentRejected("not_openapi", "The document is not OpenAPI 3.0 or 3.1.")
    if not isinstance(document.get("paths", {}), Mapping):
        raise DocumentRejected("not_openapi", "The document's paths are not an object.")
    return document


def compile_document(raw: bytes) -> CompiledDocument:
    """Parse and compile ``raw``; raise :class:`DocumentRejected` for the whole document."""
    document = parse_document(raw)
    info = document.get("info")
    title = info.get("title") if isinstance(info, Mapping) else None
    operations: list[CompiledOperation] = []
    omitted: list[tuple[str, str]] = []
    count = 0
    seen: set[str] = set()
    for where, compiled in _operations(document):
        if isinstance(compiled, str):
            count += 1
            if len(omitted) < MAX_REPORTED_OMISSIONS:
                omitted.append((where, compiled))
            continue
        if compiled.operation_id in seen:
            count += 1
            if len(omitted) < MAX_REPORTED_OMISSIONS:
                omitted.append((where, "duplicate operationId"))
            continue
        if len(operations) >= MAX_OPERATIONS:
            count += 1
            if len(omitted) < MAX_REPORTED_OMISSIONS:
                omitted.append((where, f"more than {MAX_OPERATIONS} operations"))
            continue
        seen.add(compiled.operation_id)
        operations.append(compiled)
    return CompiledDocument(
        digest=hashlib.sha256(raw).hexdigest(),
        title=title[:200] if isinstance(title, str) else "",
        operations=tuple(operations), omitted=tuple(omitted), omitted_count=count,
        by_id={op.operation_id: op for op in operations})


def _operations(document: Mapping[str, Any]) -> Iterator[tuple[str, CompiledOperation | str]]:
    paths = document.get("paths") or {}
    root_security = document.get("security")
    components = document.get("components")
    components = components if isinstance(components, Mapping) else {}
    for path, item in paths.items():
        if not isinstance(item, Mapping):
            yield str(path)[:200], "path item is not an object"
            continue
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            where = f"{method.upper()} {str(path)[:200]}"
            try:
                yield where, _compile(str(path), method, item, operation, components,
                                      root_security)
            except _Omit as reason:
                yield where, str(reason)
            except RecursionError:
                yield where, "nested too deeply"


# --- one operation ----------------------------------------------------------------------


def _compile(path: str, method: str, item: Mapping[str, Any], operation: Any,
             components: Mapping[str, Any], root_security: Any) -> CompiledOperation:
    if not isinstance(operation, Mapping):
        raise _Omit("operation is not an object")
    if not _PATH_RE.fullmatch(path) or any(s in (".", "..") for s in path.split("/")):
        raise _Omit("path is not a plain absolute path")
    operation_id = operation.get("operationId")
    if not isinstance(operation_id, str) or not OPERATION_ID_RE.fullmatch(operation_id):
        raise _Omit("no operationId that can be a tool name")
    effect = _effect(method, operation)
    alternatives = _authentication(operation.get("security", root_security), components)

    properties: dict[str, Any] = {}
    required: list[str] = []
    parameters: list[Parameter] = []
    defs: dict[str, Any] = {}
    for parameter in _parameters(item, operation, components):
        name, location = parameter["name"], parameter["in"]
        if location in ("header", "cookie"):
            if parameter.get("required") is True:
                raise _Omit(f"requires a {location} parameter, which cannot be supplied")
            continue
        if location not in ("path", "query"):
            raise _Omit(f"parameter {name!r} is in an unknown location")
        if not _PARAMETER_NAME_RE.fullmatch(name) or name == BODY or name in properties:
            raise _Omit(f"parameter name {name[:64]!r} cannot be an argument")
        if is_credential_key(name):
            raise _Omit(f"parameter {name!r} can carry a credential")
        is_required = location == "path" or parameter.get("required") is True
        schema = parameter.get("schema", {})
        if not isinstance(schema, Mapping) or "content" in parameter:
            raise _Omit(f"parameter {name!r} has no plain schema")
        if location == "path" and schema.get("type") not in ("string", "integer", "number",
                                                             "boolean"):
            raise _Omit(f"path parameter {name!r} is not a scalar")
        schema = _localized(schema, components, defs)
        description = parameter.get("description")
        if isinstance(description, str) and description and "description" not in schema:
            schema = {**schema, "description": description[:300]}
        properties[name] = schema
        if is_required:
            required.append(name)
        parameters.append(Parameter(name, location, is_required))

    templated = set(_TEMPLATE_RE.findall(path))
    path_names = {p.name for p in parameters if p.location == "path"}
    if templated != path_names:
        raise _Omit("path template and path parameters disagree")

    takes_body, body_required = False, False
    body = _resolved(operation.get("requestBody"), components, "requestBodies")
    if body is not None:
        if not isinstance(body, Mapping):
            raise _Omit("requestBody is not an object")
        content = body.get("content")
        media = content.get("application/json") if isinstance(content, Mapping) else None
        body_required = body.get("required") is True
        if isinstance(media, Mapping) and isinstance(media.get("schema", {}), Mapping):
            properties[BODY] = _localized(media.get("schema", {}), components, defs)
            takes_body = True
            if body_required:
                required.append(BODY)
        elif body_required:
            raise _Omit("requires a body that is not JSON")

    input_schema: dict[str, Any] = {"type": "object", "properties": properties,
                                    "additionalProperties": False}
    if required:
        input_schema["required"] = required
    if defs:
        input_schema["$defs"] = defs
    _refuse_secrets(input_schema)
    problem = schema_problem(input_schema)
    if problem is not None:
        raise _Omit(f"input schema: {problem[:200]}")
    if alternatives:
        # A query key named like one of the operation's own query parameters would collide
        # with a model-supplied value: that alternative is not usable.
        own_query = {p.name for p in parameters if p.location == "query"}
        alternatives = tuple(a for a in alternatives
                             if not (a.in_query and a.name in own_query))
        if not alternatives:
            raise _Omit("requires authentication no supported scheme provides")
    return CompiledOperation(
        operation_id=operation_id, method=method.upper(), path=path,
        parameters=tuple(parameters), takes_body=takes_body, body_required=body_required,
        input_schema=input_schema, effect=effect, description=_description(operation),
        auth=alternatives[0] if alternatives else None, auth_alternatives=alternatives)


def _effect(method: str, operation: Mapping[str, Any]) -> Capability:
    """R-340, R-341: the declared effect, else the method's; never a guess."""
    if EFFECT_KEY in operation:
        declared = operation[EFFECT_KEY]
        if not isinstance(declared, str) or declared not in _DECLARED_EFFECTS:
            raise _Omit(f"{EFFECT_KEY} is not read, write or sensitive")
        return _DECLARED_EFFECTS[declared]
    if method in ("get", "head", "options"):
        return Capability.READ
    if method == "delete":
        return Capability.SENSITIVE
    return Capability.WRITE


def _authentication(security: Any,
                    components: Mapping[str, Any]) -> tuple[CompiledAuth, ...]:
    """The operation's authentication plans: none when it may be called anonymously (no
    requirement, or an empty alternative), else every alternative of one supported scheme in
    order; none supported omits the operation (R-385)."""
    if security is None:
        return ()
    if not isinstance(security, list):
        raise _Omit("security is not a list")
    if not security or any(isinstance(req, Mapping) and not req for req in security):
        return ()
    schemes = components.get("securitySchemes")
    schemes = schemes if isinstance(schemes, Mapping) else {}
    found: list[CompiledAuth] = []
    for requirement in security:
        # An alternative that combines schemes needs them all: not supported here.
        if not isinstance(requirement, Mapping) or len(requirement) != 1:
            continue
        [name] = requirement
        auth = _scheme(str(name), schemes.get(name))
        if auth is not None and auth not in found:
            found.append(auth)
    if not found:
        raise _Omit("requires authentication no supported scheme provides")
    return tuple(found)


def _scheme(name: str, scheme: Any) -> CompiledAuth | None:
    """One security scheme as a plan, or None when it is unknown, incomplete or unsupported."""
    if not isinstance(scheme, Mapping) or not _COMPONENT_NAME_RE.fullmatch(name):
        return None
    kind = scheme.get("type")
    if kind == "http":
        http = str(scheme.get("scheme", "")).lower()
        return CompiledAuth(name, "bearer") if http == "bearer" else (
            CompiledAuth(name, "basic") if http == "basic" else None)
    if kind in ("oauth2", "openIdConnect"):
        return CompiledAuth(name, "bearer")  # an access token, sent as Bearer
    if kind == "apiKey":
        where, key = scheme.get("in"), scheme.get("name")
        if not isinstance(key, str) or not _PARAMETER_NAME_RE.fullmatch(key):
            return None
        if where == "header" and key.lower() not in RESERVED_CREDENTIAL_HEADERS:
            return CompiledAuth(name, "header", key)
        if where == "cookie":
            return CompiledAuth(name, "cookie", key)
        if where == "query":
            # Compiled, but offered only under the query-auth ceiling.
            return CompiledAuth(name, "query", key)
        return None
    if kind == "mutualTLS":
        return CompiledAuth(name, "mtls")  # a client certificate on the request's connection
    return None  # anything unknown


def _parameters(item: Mapping[str, Any], operation: Mapping[str, Any],
                components: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Path-item parameters overridden by the operation's, keyed by (name, in)."""
    merged: dict[tuple[str, str], Mapping[str, Any]] = {}
    for source in (item.get("parameters") or [], operation.get("parameters") or []):
        if not isinstance(source, list):
            raise _Omit("parameters is not a list")
        for raw in source:
            parameter = _resolved(raw, components, "parameters")
            if not isinstance(parameter, Mapping) or not isinstance(parameter.get("name"), str) \
                    or not isinstance(parameter.get("in"), str):
                raise _Omit("a parameter has no name or location")
            merged[(parameter["name"], parameter["in"])] = parameter
    return list(merged.values())


def _resolved(value: Any, components: Mapping[str, Any], kind: str) -> Any:
    """``value``, or what its ``#/components/<kind>/<name>`` reference names (bounded hops)."""
    for _ in range(MAX_REF_HOPS):
        if not isinstance(value, Mapping) or "$ref" not in value:
            return value
        ref = value["$ref"]
        prefix = f"#/components/{kind}/"
        if not isinstance(ref, str) or not ref.startswith(prefix):
            raise _Omit(f"reference {str(ref)[:100]!r} is not a local {kind} component")
        section = components.get(kind)
        target = section.get(ref[len(prefix):]) if isinstance(section, Mapping) else None
        if target is None:
            raise _Omit(f"reference {ref[:100]!r} names nothing")
        value = target
    raise _Omit("references go too deep")


def _localized(schema: Mapping[str, Any], components: Mapping[str, Any],
               defs: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``#/components/schemas/X`` rewritten to ``#/$defs/X`` and each
    named component (transitively) copied into ``defs``; any other reference omits."""
    schemas = components.get("schemas")
    schemas = schemas if isinstance(schemas, Mapping) else {}
    pending: list[str] = []

    def rewrite(value: Any, depth: int) -> Any:
        if depth > 64:
            raise _Omit("schema nested too deeply")
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for key, child in value.items():
                if key == "$ref":
                    out[key] = reference(child)
                else:
                    out[str(key)] = rewrite(child, depth + 1)
            return out
        if isinstance(value, list):
            return [rewrite(child, depth + 1) for child in value]
        return value

    def reference(ref: Any) -> str:
        prefix = "#/components/schemas/"
        if not isinstance(ref, str) or not ref.startswith(prefix):
            raise _Omit(f"schema reference {str(ref)[:100]!r} is not a local schema")
        name = ref[len(prefix):]
        if not _COMPONENT_NAME_RE.fullmatch(name) or name not in schemas:
            raise _Omit(f"schema reference {ref[:100]!r} names nothing usable")
        if name not in defs and name not in pending:
            pending.append(name)
        return f"#/$defs/{name}"

    result = rewrite(schema, 0)
    while pending:
        name = pending.pop()
        if name in defs:
            continue
        if len(defs) >= MAX_DEFS:
            raise _Omit("schema references too many components")
        target = schemas[name]
        if not isinstance(target, Mapping):
            raise _Omit(f"schema component {name!r} is not an object")
        defs[name] = {}  # claimed before walking, so a self-reference ends here
        defs[name] = rewrite(target, 0)
    return dict(result)


def _refuse_secrets(schema: Mapping[str, Any]) -> None:
    """R-347: no credential-shaped property and no writeOnly value anywhere in the arguments."""
    stack: list[tuple[Any, int]] = [(schema, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > 96:
            raise _Omit("schema nested too deeply")
        if isinstance(value, Mapping):
            if value.get("writeOnly") is True:
                raise _Omit("a field is writeOnly (a secret)")
            properties = value.get("properties")
            if isinstance(properties, Mapping):
                for key in properties:
                    if is_credential_key(str(key)):
                        raise _Omit(f"field {str(key)[:64]!r} can carry a credential")
            stack.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            stack.extend((child, depth + 1) for child in value)


def _description(operation: Mapping[str, Any]) -> str:
    parts = [operation.get("summary"), operation.get("description")]
    text = " — ".join(p.strip() for p in parts if isinstance(p, str) and p.strip())
    if len(text) > MAX_DESCRIPTION_CHARS:
        text = text[:MAX_DESCRIPTION_CHARS].rstrip() + "…"
    return text


__all__ = [
    "MAX_DOCUMENT_BYTES",
    "MAX_OPERATIONS",
    "CompiledDocument",
    "CompiledOperation",
    "DocumentRejected",
    "Parameter",
    "compile_document",
    "parse_document",
]
