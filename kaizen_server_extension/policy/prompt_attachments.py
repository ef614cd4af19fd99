"""Prompt step attachments: a saved prompt's structural ``{{tool:surface/name}}`` and
``{{connector:id}}`` tokens (spec: Prompt step attachments).

A task's prompt is a saved prompt with one step. Only a structural token attaches anything;
a prompt that merely names a tool in its wording grants nothing (R-205). Each token is
resolved on every validation (creating or editing the task) and again on every run, against
what holds *now*: the registered tools, the member's permissions (an administrator's policy),
and the run's frozen catalog, which already is the agent's ceiling intersected with the room
(R-206). Any token that is missing, turned off, malformed or over the ceiling is a blocking
error before any step runs (R-207). A reference cannot be ambiguous: the registry refuses a
second tool of the same name, and ``surface/name`` must match both.

An admitted attachment changes only this run: its tool is put directly on the first step
(a deferred tool need not be found through tool_search); the stored agent is never touched
(R-208). Approvals, room admission, audit, sandboxing and call-time authorization are those
of any call, because the attached tool is called through the same pipeline (R-210). The
model reads a readable directive in place of the token; the directive is text, and the
frozen catalog stays the only callable set (R-211).

This module is pure: the caller supplies the facts (``AttachmentFacts``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from kaizen_server_extension.protocol.errors import SchemaViolation

#: ``{{tool:surface/name}}`` or ``{{connector:id}}``; ``{{tool:name}}`` names the tool alone.
TOKEN = re.compile(r"\{\{\s*(tool|connector)\s*:\s*([^{}\s]{1,200})\s*\}\}")
#: Anything that looks like a token but is not one (wrong kind, spaces in the reference):
#: refused rather than passed to the model as an attachment it does not have.
_LOOKALIKE = re.compile(r"\{\{\s*[a-z_]+\s*:[^{}]*\}\}")
MAX_ATTACHMENTS = 8

Problem = Literal["missing", "disabled", "over_ceiling", "malformed", "too_many"]

_WORDING: dict[Problem, str] = {
    "missing": "{ref} is not a tool or connector this server has",
    "disabled": "{ref} is turned off for you by an administrator",
    "over_ceiling": "{ref} is not available to this task's agent in its conversation",
    "malformed": "{ref} is not an attachment token ({{{{tool:surface/name}}}} or "
                 "{{{{connector:id}}}})",
    "too_many": "a prompt attaches at most " + str(MAX_ATTACHMENTS) + " tools ({ref})",
}


@dataclass(frozen=True, slots=True)
class AttachmentToken:
    kind: Literal["tool", "connector"]
    ref: str
    text: str  # the token as written

    @property
    def label(self) -> str:
        return f"{{{{{self.kind}:{self.ref}}}}}"


@dataclass(frozen=True, slots=True)
class AttachmentIssue:
    token: str
    problem: Problem

    def message(self) -> str:
        return _WORDING[self.problem].format(ref=self.token)


@dataclass(frozen=True, slots=True)
class AttachmentFacts:
    """What holds now for the member, agent and room the prompt runs in."""

    #: every registered tool: name -> surface
    registered: Mapping[str, str]
    #: the tools the agent's ceiling admits in this room (the run's frozen catalog)
    within_ceiling: frozenset[str]
    #: the tools an administrator's policy denies to this member
    disabled: frozenset[str] = frozenset()
    #: connector ids this member may use (none are registered yet: every one is missing)
    connectors: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ResolvedAttachments:
    tools: tuple[str, ...] = ()
    issues: tuple[AttachmentIssue, ...] = ()
    #: the prompt as the model reads it: each token replaced by a readable directive
    model_text: str = ""

    @property
    def ok(self) -> bool:
        return not self.issues

    def error(self) -> AttachmentRejected:
        return AttachmentRejected(self.issues)


class AttachmentRejected(SchemaViolation):
    """A prompt whose attachments cannot all be admitted: nothing runs, nothing is saved."""

    default_code = "attachment_invalid"

    def __init__(self, issues: tuple[AttachmentIssue, ...]) -> None:
        self.issues = issues
        super().__init__("The prompt's attachments cannot be used: "
                         + "; ".join(issue.message() for issue in issues) + ".")


def tokens_in(prompt: str) -> tuple[AttachmentToken, ...]:
    return tuple(AttachmentToken(kind=match.group(1), ref=match.group(2),  # type: ignore[arg-type]
                                 text=match.group(0)) for match in TOKEN.finditer(prompt))


def has_tokens(prompt: str) -> bool:
    """Whether the prompt has anything to resolve (a token, or something that looks like one)."""
    return bool(_LOOKALIKE.search(prompt))


def resolve(prompt: str, facts: AttachmentFacts) -> ResolvedAttachments:
    """Every token of ``prompt`` checked against ``facts``; see the module's rules."""
    tokens = tokens_in(prompt)
    issues: list[AttachmentIssue] = []
    proper = {t.text for t in tokens}
    for lookalike in _LOOKALIKE.finditer(prompt):
        if lookalike.group(0) not in proper:
            issues.append(AttachmentIssue(lookalike.group(0), "malformed"))
    if len(tokens) > MAX_ATTACHMENTS:
        issues.append(AttachmentIssue(tokens[MAX_ATTACHMENTS].label, "too_many"))
    tools: list[str] = []
    for token in tokens[:MAX_ATTACHMENTS]:
        if token.kind == "connector":
            if token.ref not in facts.connectors:
                issues.append(AttachmentIssue(token.label, "missing"))
            continue
        problem, name = _tool(token.ref, facts)
        if problem is not None:
            issues.append(AttachmentIssue(token.label, problem))
        elif name not in tools:
            tools.append(name)
    return ResolvedAttachments(tools=tuple(tools), issues=tuple(issues),
                               model_text=directive_text(prompt) if not issues else prompt)


def _tool(ref: str, facts: AttachmentFacts) -> tuple[Problem | None, str]:
    surface, _, tool = ref.rpartition("/")
    if tool not in facts.registered or (surface and facts.registered[tool] != surface):
        return "missing", ref
    # The administrator's "off" is reported as such even when the ceiling also excludes it.
    if tool in facts.disabled:
        return "disabled", tool
    if tool not in facts.within_ceiling:
        return "over_ceiling", tool
    return None, tool


def directive_text(prompt: str) -> str:
    """Each token as words the model reads. Only the frozen catalog is callable (R-211)."""
    def directive(match: re.Match[str]) -> str:
        name = match.group(2).rpartition("/")[2]
        return f"(use the tool {name} for this)" if match.group(1) == "tool" \
            else f"(use the connector {name} for this)"
    return TOKEN.sub(directive, prompt)
