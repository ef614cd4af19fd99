"""The spec's runtime settings, read from the environment under their spec names.

One pydantic model validates every bound; an out-of-bounds value stops start-up with a
message naming the setting (API.md, Model provider).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kaizen_server_extension.runtime.port import Budgets, CorrectionRule

MAX_CORRECTION_RULES = 16
MAX_CORRECTION_ID_CHARS = 64
MAX_CORRECTION_PATTERN_CHARS = 200
MAX_CORRECTION_REMINDER_CHARS = 1000
#: The tool surface the Library's tools declare; ``KAIZEN_LIBRARY_ENABLED`` exposes it (R-140).
LIBRARY_SURFACE = "library"


class SettingsError(ValueError):
    """A setting is out of bounds; the message names it and is safe to print."""


def withheld_surfaces(*, library_enabled: bool) -> frozenset[str]:
    """The tool surfaces this deployment does not expose, from its feature flags (R-140)."""
    return frozenset() if library_enabled else frozenset({LIBRARY_SURFACE})


class CorrectionRuleModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(min_length=1, max_length=MAX_CORRECTION_ID_CHARS,
                             pattern=r"^[A-Za-z0-9_.-]+$")]
    pattern: Annotated[str, Field(min_length=1, max_length=MAX_CORRECTION_PATTERN_CHARS)]
    reminder: Annotated[str, Field(min_length=1, max_length=MAX_CORRECTION_REMINDER_CHARS)]


class RuntimeSettings(BaseModel):
    """Budget, sandbox and feature-flag settings with the spec's names, defaults and bounds."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    AGENT_LOOP_MAX_CYCLES: Annotated[int, Field(ge=1, le=100)] = 10
    AGENT_LOOP_BUDGET_MS: Annotated[int, Field(ge=1_000, le=3_600_000)] = 120_000
    AGENT_LOOP_MAX_PARALLEL_TOOLS: Annotated[int, Field(ge=1, le=16)] = 1
    LLM_PER_USER_DAILY_TOKENS: Annotated[int, Field(ge=0)] = 0
    SANDBOX_MAX_WALL_SECONDS: Annotated[int, Field(ge=1, le=240)] = 30
    SANDBOX_MAX_OUTPUT_BYTES: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024)] = 1024 * 1024
    AGENT_STREAM_CORRECTION_RULES: Annotated[
        tuple[CorrectionRuleModel, ...], Field(max_length=MAX_CORRECTION_RULES)
    ] = ()
    # Spec: defaults to 1 and is capped at 3.
    AGENT_STREAM_CORRECTION_MAX_ATTEMPTS: Annotated[int, Field(ge=0, le=3)] = 1
    AGENT_TOOL_DISCOVERY_ENABLED: bool = False
    # Each surface answers to its own feature flag (spec: The closed built-in registry). Off,
    # the member's Library (its agent tools and REST routes) does not exist on this server.
    KAIZEN_LIBRARY_ENABLED: bool = True

    @field_validator("AGENT_STREAM_CORRECTION_RULES", mode="before")
    @classmethod
    def _parse_rules_json(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                return ()
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"is not valid JSON ({exc.msg})") from None
        return value

    @field_validator("AGENT_STREAM_CORRECTION_RULES")
    @classmethod
    def _unique_rule_ids(
        cls, rules: tuple[CorrectionRuleModel, ...]
    ) -> tuple[CorrectionRuleModel, ...]:
        ids = [r.id for r in rules]
        if len(ids) != len(set(ids)):
            raise ValueError("rule ids must be unique")
        return rules

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> RuntimeSettings:
        """Read every field from ``environ`` under its own name; raise SettingsError."""
        raw = {name: environ[name] for name in cls.model_fields if name in environ}
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            setting = str(first["loc"][0]) if first["loc"] else "settings"
            detail = first["msg"]
            raise SettingsError(f"Invalid setting {setting}: {detail}") from None

    def budgets(self) -> Budgets:
        return Budgets(
            max_cycles=self.AGENT_LOOP_MAX_CYCLES,
            inactivity_ms=self.AGENT_LOOP_BUDGET_MS,
            max_parallel_tools=self.AGENT_LOOP_MAX_PARALLEL_TOOLS,
            correction_max_attempts=self.AGENT_STREAM_CORRECTION_MAX_ATTEMPTS,
        )

    def correction_rules(self) -> tuple[CorrectionRule, ...]:
        return tuple(CorrectionRule(r.id, r.pattern, r.reminder)
                     for r in self.AGENT_STREAM_CORRECTION_RULES)
