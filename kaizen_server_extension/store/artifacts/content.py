"""What an artifact version may contain: kind validators, the typed graph contract, and the
governed renderable-artifact envelope with its call-scoped server attestation.

Every write path (tools, staged finalize, edits, run_code files, the trusted result boundary)
goes through :func:`check_content` in the store, so no path can skip a validator.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kaizen_server_extension.protocol.errors import SchemaViolation
from kaizen_server_extension.store.models import (
    RESERVED_ARTIFACT_KIND,
    RESERVED_ARTIFACT_LANGUAGE,
)

# Text and live-canvas kinds the model may write; "file" is run_code output only.
MODEL_KINDS = ("markdown", "html", "svg", "code", "mermaid", "react", "json", "graph")
MAX_TEXT_BYTES = 2 * 1024 * 1024
MAX_ENVELOPE_BYTES = 256 * 1024


class ValidationFailed(SchemaViolation):
    """Content or metadata an artifact of this kind cannot hold (422 ``validation_failed``)."""

    default_code = "validation_failed"


def is_reserved(kind: str, language: str | None) -> bool:
    return kind == RESERVED_ARTIFACT_KIND and language == RESERVED_ARTIFACT_LANGUAGE


def _strict_json(text: str) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"duplicate key {key!r}")
            out[key] = value
        return out

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constant)


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def check_content(kind: str, language: str | None, text: str) -> str:
    """The text to store for an ordinary (non-governed) version, or ValidationFailed."""
    if len(text.encode("utf-8")) > MAX_TEXT_BYTES:
        raise ValidationFailed(f"The content is larger than {MAX_TEXT_BYTES} bytes.",
                               code="artifact_too_large")
    if kind == "json":
        try:
            _strict_json(text)
        except (ValueError, RecursionError) as exc:
            raise ValidationFailed(f"A json artifact must hold one valid JSON value: {exc}.")\
                from None
    elif kind == "svg" and "<svg" not in text.lower():
        raise ValidationFailed("An svg artifact must contain an <svg> element.")
    elif kind == "graph":
        return validate_graph(text)
    return text


# --- typed graphs (spec: Typed graph writes) -----------------------------------

GRAPH_CONTRACT: dict[str, Any] = {
    "nodes": [{"id": "string, unique across nodes and edges (required)",
               "label": "string (required)", "type": "string (optional)"}],
    "edges": [{"id": "string, unique (required)", "source": "node id (required)",
               "target": "node id (required)", "label": "string (optional)"}],
    "sources": [{"id": "string, unique (required)", "title": "string (required)",
                 "url": "string (optional)"}],
    "references": [{"target": "node or edge id (required)",
                    "source": "source id (required)"}],
}
_GRAPH_FIELDS = {
    "nodes": ({"id", "label"}, {"type"}),
    "edges": ({"id", "source", "target"}, {"label"}),
    "sources": ({"id", "title"}, {"url"}),
    "references": ({"target", "source"}, set()),
}


class GraphInvalid(ValidationFailed):
    default_code = "graph_invalid"


def validate_graph(text: str) -> str:
    """Every problem at once plus the complete canonical contract, or the canonical text."""
    problems: list[str] = []
    try:
        data = _strict_json(text)
    except (ValueError, RecursionError) as exc:
        data = None
        problems.append(f"not valid JSON ({exc})")
    if data is not None and not isinstance(data, dict):
        problems.append("the graph must be a JSON object")
        data = None
    if isinstance(data, dict):
        problems.extend(_graph_problems(data))
    if problems:
        raise GraphInvalid(
            "The graph was not saved: " + "; ".join(problems[:20])
            + ". Fix every field and send the whole graph again in this exact shape: "
            + canonical_json(GRAPH_CONTRACT))
    assert isinstance(data, dict)
    return json.dumps({k: data.get(k, []) for k in _GRAPH_FIELDS}, ensure_ascii=False,
                      indent=2) + "\n"


def _graph_problems(data: dict[str, Any]) -> list[str]:
    problems = [f"unknown top-level field {k!r}" for k in data if k not in _GRAPH_FIELDS]
    if "nodes" not in data:
        problems.append("'nodes' is required")
    ids: dict[str, set[str]] = {name: set() for name in _GRAPH_FIELDS}
    for section, (required, optional) in _GRAPH_FIELDS.items():
        items = data.get(section, [])
        if not isinstance(items, list):
            problems.append(f"{section!r} must be a list")
            continue
        for index, item in enumerate(items):
            where = f"{section}[{index}]"
            if not isinstance(item, dict):
                problems.append(f"{where} must be an object")
                continue
            for key in item:
                if key not in required | optional:
                    problems.append(f"{where} has unknown field {key!r}")
            for key in sorted(required):
                if not isinstance(item.get(key), str) or not item.get(key):
                    problems.append(f"{where}.{key} must be a non-empty string")
            for key in optional:
                if key in item and not isinstance(item[key], str):
                    problems.append(f"{where}.{key} must be a string")
            ident = item.get("id")
            if isinstance(ident, str) and section != "references":
                if ident in ids[section] or (section == "edges" and ident in ids["nodes"]):
                    problems.append(f"{where}.id {ident!r} is not unique")
                ids[section].add(ident)
    for index, edge in enumerate(_dicts(data.get("edges"))):
        for end in ("source", "target"):
            if isinstance(edge.get(end), str) and edge[end] not in ids["nodes"]:
                problems.append(f"edges[{index}].{end} {edge[end]!r} names no node")
    for index, ref in enumerate(_dicts(data.get("references"))):
        target, source = ref.get("target"), ref.get("source")
        if isinstance(target, str) and target not in ids["nodes"] | ids["edges"]:
            problems.append(f"references[{index}].target {target!r} names no node or edge")
        if isinstance(source, str) and source not in ids["sources"]:
            problems.append(f"references[{index}].source {source!r} names no source")
    return problems


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


# --- governed renderable envelopes (guardrails: Structured artifact output) ------------------

_ENVELOPE_KEYS = {"version", "renderer", "title", "markings", "provenance", "result",
                  "result_ref", "text_fallback", "download"}
_PROVENANCE_KEYS = {"cluster", "dataset", "job"}
_DOWNLOAD_KEYS = {"filename", "media_type"}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REF_ID = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")


@dataclass(frozen=True, slots=True)
class Envelope:
    """A validated envelope: its canonical bytes and the bindings updates may not change."""

    canonical: bytes
    title: str
    markings: Mapping[str, Any]
    provenance: Mapping[str, Any]

    @property
    def binding(self) -> str:
        return canonical_json({"markings": self.markings, "provenance": self.provenance})


def validate_envelope(raw: object) -> Envelope:
    """Validate and canonicalize a renderable-artifact envelope; fail closed on anything off
    contract (R-104, R-105, R-112, R-115)."""
    if isinstance(raw, bytes | str):
        try:
            raw = _strict_json(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise ValidationFailed("The renderable artifact is not JSON.") from None
    if not isinstance(raw, dict):
        raise ValidationFailed("The renderable artifact must be a JSON object.")
    unknown = set(raw) - _ENVELOPE_KEYS
    if unknown:
        raise ValidationFailed(f"Unknown envelope fields: {sorted(unknown)}.")
    if raw.get("version") != 2:
        raise ValidationFailed("Only version 2 renderable-artifact envelopes are accepted.")
    if "markings_error" in raw or not isinstance(raw.get("markings"), dict) \
            or not raw["markings"]:
        raise ValidationFailed("A renderable artifact needs its security markings map.")
    provenance = raw.get("provenance")
    if not isinstance(provenance, dict) or not (set(provenance) & _PROVENANCE_KEYS) \
            or set(provenance) - _PROVENANCE_KEYS \
            or not all(isinstance(v, str) and v for v in provenance.values()):
        raise ValidationFailed("A renderable artifact needs cluster, dataset or job "
                               "provenance (and nothing else there).")
    for key in ("renderer", "title", "text_fallback"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ValidationFailed(f"The envelope's {key!r} must be a non-empty string.")
    has_result, has_ref = "result" in raw, "result_ref" in raw
    if has_result == has_ref:
        raise ValidationFailed("An envelope carries exactly one of result or result_ref.")
    if has_ref:
        ref = raw["result_ref"]
        if not isinstance(ref, dict) or set(ref) != {"id", "sha256"} \
                or not isinstance(ref.get("sha256"), str) or not _SHA256.match(ref["sha256"]) \
                or not isinstance(ref.get("id"), str) or not _REF_ID.match(ref["id"]):
            raise ValidationFailed("result_ref must be {id, sha256}: an opaque identifier "
                                   "(never a URL) bound to a SHA-256 digest.")
    if "download" in raw:
        download = raw["download"]
        if not isinstance(download, dict) or set(download) - _DOWNLOAD_KEYS or not all(
                isinstance(v, str) and v and len(v) <= 200 for v in download.values()):
            raise ValidationFailed("Download metadata may hold only a filename and a media "
                                   "type.")
        name = download.get("filename", "")
        if any(c in name for c in "/\\:") or ".." in name or name.startswith("~"):
            raise ValidationFailed("Download metadata must not carry a path.")
    canonical = canonical_json(raw).encode("utf-8")
    if len(canonical) > MAX_ENVELOPE_BYTES:
        raise ValidationFailed(f"The envelope is larger than {MAX_ENVELOPE_BYTES} bytes.")
    return Envelope(canonical, str(raw["title"]), dict(raw["markings"]), dict(provenance))


# The attestation key lives only in this server process; a marker cannot be minted outside it.
_ATTESTATION_KEY = secrets.token_bytes(32)
ATTESTATION_PREFIX = "kz-attest:v1:"
#: Between a marker's MAC and the producer it names (a tool name never contains it).
_PRODUCER_SEPARATOR = "@"
_PRODUCER_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: What an attestation asserts, and all it asserts (R-403): the approved producer returned
#: output that passed the envelope contract. Never that its provenance or markings are true.
ATTESTATION_ASSERTS = "validated_output_of_approved_producer"


@dataclass(frozen=True, slots=True)
class Attestation:
    """The call-scoped server attestation of one validated trusted tool result (R-107),
    naming the administrator-approved producer that returned it ("" when a trusted built-in
    result names none)."""

    call_id: str
    digest: str
    marker: str
    producer: str = ""


def attest_trusted_result(call_id: str, envelope: Envelope, *,
                          producer: str = "") -> Attestation:
    """Only the trusted tool-result boundary calls this, after validating the envelope. The
    MAC binds the call, the canonical bytes and the producer, so a marker cannot be moved to
    another producer's name."""
    if producer and not _PRODUCER_RE.fullmatch(producer):
        raise ValueError("a producer is a tool name")
    digest = hashlib.sha256(envelope.canonical).hexdigest()
    signed = f"{call_id}\0{digest}" + (f"\0{producer}" if producer else "")
    mac = hmac.new(_ATTESTATION_KEY, signed.encode(), hashlib.sha256)
    marker = ATTESTATION_PREFIX + mac.hexdigest()[:48]
    if producer:
        marker += _PRODUCER_SEPARATOR + producer
    return Attestation(call_id, digest, marker, producer)


def verify_attestation(attestation: Attestation, envelope: Envelope) -> bool:
    expected = attest_trusted_result(attestation.call_id, envelope,
                                     producer=attestation.producer)
    return hmac.compare_digest(expected.marker, attestation.marker)


def producer_of(marker: str | None) -> str | None:
    """The producer a stored marker names, or None (no marker, or one that names none)."""
    if not marker or not marker.startswith(ATTESTATION_PREFIX):
        return None
    _, sep, producer = marker.partition(_PRODUCER_SEPARATOR)
    return producer if sep and _PRODUCER_RE.fullmatch(producer) else None
