"""The run_code tool contract: input schema, argument parsing, descriptor.

``artifact_targets`` is a REQUIRED field (R-235): bounded relative names of the files the
call will produce, or ``[]`` for compute-only work. A call without it is a schema error, never
defaulted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

from kaizen_kernel.files import MAX_TARGET_CHARS, MAX_TARGETS, TargetRejected, validate_targets
from kaizen_server_extension.protocol.errors import MemberSafeError

TOOL_NAME = "run_code"
LANGUAGES = ("python", "node")
MAX_CODE_CHARS = 200_000

DESCRIPTION = (
    "Execute code in an isolated sandbox kernel (Python; Node.js where installed). "
    "Each call starts from a fresh kernel unless persistent=true, which keeps one kernel "
    "(and its variables) for this conversation until it idles out. The working directory is "
    "this conversation's private workspace; files you want to deliver must be written there "
    "and listed in artifact_targets (relative names; [] when the call only computes). "
    "Files the member attached to this turn are read-only in the working directory under "
    "their own names (open('sales.csv')); the environment variable "
    "KAIZEN_SHARED_RESOURCES_MANIFEST is a JSON array whose entries give each copy's path "
    "(in KAIZEN_SHARED_RESOURCES_DIR) with its filename, media_type, size and sha256. Both "
    "are absent when there are none; never guess other names. "
    "tools.available lists the read-only tools you may call back: tools.call(name, {...}) "
    "in Python, await tools.call(name, {...}) in Node. "
    "Output is capped; a run that exceeds its time limit is interrupted."
)

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_CODE_CHARS,
            "description": "The program to run. Files attached to the turn are read-only "
                           "in the working directory under their own names, and listed "
                           "in the JSON array of "
                           "os.environ['KAIZEN_SHARED_RESOURCES_MANIFEST'] (absent when "
                           "there are none).",
        },
        "language": {"type": "string", "enum": list(LANGUAGES), "default": "python"},
        "persistent": {
            "type": "boolean",
            "default": False,
            "description": "Keep one kernel (and its state) across calls of this "
                           "conversation.",
        },
        "artifact_targets": {
            "type": "array",
            "maxItems": MAX_TARGETS,
            "uniqueItems": True,
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_TARGET_CHARS,
                      "pattern": r"^[^/\\~\x00-\x1f][^\\\x00-\x1f]*$"},
            "description": "Relative names of the files this call will write in the "
                           "workspace and deliver; [] for compute-only work.",
        },
    },
    "required": ["code", "artifact_targets"],
    "additionalProperties": False,
}

_VALIDATOR = jsonschema.Draft202012Validator(INPUT_SCHEMA)


class RunCodeArgumentsError(MemberSafeError):
    """The model's arguments do not satisfy the contract (the caller's error)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="invalid_arguments", domain="caller")


@dataclass(frozen=True, slots=True)
class RunCodeArguments:
    code: str
    language: str
    persistent: bool
    artifact_targets: tuple[str, ...]


def parse_arguments(raw: Mapping[str, Any] | str) -> RunCodeArguments:
    """Validate against :data:`INPUT_SCHEMA` and normalise the target names."""
    if isinstance(raw, str):
        try:
            data = json.loads(raw)
        except ValueError:
            raise RunCodeArgumentsError("arguments are not a JSON object") from None
    else:
        data = dict(raw)
    if not isinstance(data, dict):
        raise RunCodeArgumentsError("arguments are not a JSON object")
    errors = sorted(_VALIDATOR.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(root)"
        raise RunCodeArgumentsError(f"invalid run_code arguments at {where}: "
                                    f"{first.message[:300]}")
    try:
        targets = validate_targets(data["artifact_targets"])
    except TargetRejected as exc:
        raise RunCodeArgumentsError(f"artifact_targets refused ({exc.reason}): "
                                    f"{exc.name[:MAX_TARGET_CHARS]!r}") from None
    return RunCodeArguments(
        code=data["code"],
        language=data.get("language", "python"),
        persistent=bool(data.get("persistent", False)),
        artifact_targets=tuple(targets),
    )
