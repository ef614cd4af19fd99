"""The member approval mode, and which guard a call passes under it.

Spec (tools: What happens on a tool call, step 4; Write tools and side effects):

* member-owned store writes (artifacts, widgets, tasks) pass the **write guard**, owner-scoped,
  no external effect (R-438);
* isolated execution (run_code) runs under its **sandbox lease** bound to actor + conversation
  (R-439);
* external-system writes pass the write guard **and the approval gate** (R-440); generated
  write and sensitive descriptors enter the shared approval mechanism (R-342);
* a request that needs a decision is persisted with a digest of its arguments before any wait
  begins (R-224).

The three modes are the member setting of API.md (``approval_mode``). Under the default
``ask_for_writes`` only the approval-gated categories above ask. ``always_ask`` asks for every
call that is not a plain read. ``never_ask`` waives the approval gate for writes — but a
SENSITIVE (or undeclared, treated as the strictest) tool still asks, because the spec makes
member confirmation part of what such a tool *is* ("act_on_browser_page … after member
confirmation", R-152), not a preference the member toggles. That is the one place this module
departs from "never_ask asks nothing"; :data:`SENSITIVE_ALWAYS_CONFIRMS` names it.

"Allow for this conversation" (docs/approvals.md) is a narrower standing answer than
``never_ask``: for one member, one conversation and one write tool (:func:`grantable`). It
answers only what the member's mode asks; an operator guardrail's ``NeedsApproval`` still asks.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

from kaizen_server_extension.policy.declared import DeclaredTool
from kaizen_server_extension.protocol.tools import Capability, WriteCategory


class ApprovalMode(enum.StrEnum):
    ALWAYS_ASK = "always_ask"
    ASK_FOR_WRITES = "ask_for_writes"
    NEVER_ASK = "never_ask"


DEFAULT_APPROVAL_MODE = ApprovalMode.ASK_FOR_WRITES

# See the module docstring: sensitive tools confirm even under never_ask.
SENSITIVE_ALWAYS_CONFIRMS = True


class Guard(enum.StrEnum):
    """The guard a call passes besides any approval (informational for the host and audit)."""

    NONE = "none"  # a plain read
    WRITE_GUARD = "write_guard"  # member-owned store
    SANDBOX_LEASE = "sandbox_lease"  # isolated execution
    APPROVAL_GATE = "approval_gate"  # external effect, sensitive, or undeclared


class ApprovalStatus(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    CONSUMED = "consumed"


@dataclass(frozen=True, slots=True)
class ApprovalReceipt:
    """The newest approval record for one (run, call digest)."""

    approval_id: str
    status: ApprovalStatus


@dataclass(frozen=True, slots=True)
class GateDecision:
    guard: Guard
    needs_approval: bool


def guard_for(descriptor: DeclaredTool) -> Guard:
    """Classify by declaration; anything inconsistent or undeclared takes the strictest guard."""
    capability, category = descriptor.capability, descriptor.write_category
    if capability in (Capability.SENSITIVE, Capability.UNDECLARED):
        return Guard.APPROVAL_GATE
    if category is WriteCategory.EXTERNAL_EFFECT:
        return Guard.APPROVAL_GATE
    if category is WriteCategory.MEMBER_STORE:
        return Guard.WRITE_GUARD
    if category is WriteCategory.ISOLATED_EXECUTION:
        return Guard.SANDBOX_LEASE
    if capability is Capability.READ:
        return Guard.NONE
    # A write that did not say how it is guarded: it may reach outside, so it is gated.
    return Guard.APPROVAL_GATE


def decide(mode: ApprovalMode, descriptor: DeclaredTool) -> GateDecision:
    """Whether this call needs a member decision under ``mode``."""
    guard = guard_for(descriptor)
    if guard is Guard.NONE:
        return GateDecision(guard, needs_approval=False)
    if mode is ApprovalMode.ALWAYS_ASK:
        return GateDecision(guard, needs_approval=True)
    strict = descriptor.capability in (Capability.SENSITIVE, Capability.UNDECLARED)
    if mode is ApprovalMode.NEVER_ASK:
        return GateDecision(guard, needs_approval=strict and SENSITIVE_ALWAYS_CONFIRMS)
    return GateDecision(guard, needs_approval=guard is Guard.APPROVAL_GATE)


def grantable(capability: Capability | str) -> bool:
    """Whether "allow for this conversation" may answer the member's approval of a tool of
    this capability: a write only. A sensitive or undeclared tool confirms every call
    (:data:`SENSITIVE_ALWAYS_CONFIRMS`), and a read never asks the member. (The database holds
    the same rule: ``conversation_tool_grants`` CHECKs its capability.)"""
    return capability == Capability.WRITE


def arguments_digest(name: str, raw_args: str) -> str:
    """Digest binding an approval (and the duplicate ledger) to the exact request bytes.

    The raw JSON text is hashed byte for byte, not re-serialized: two argument texts that differ
    in any byte are two intents (R-283), and an approval covers exactly what was shown (R-224).
    The name is length-prefixed so no (name, args) pair can collide with another.
    """
    name_bytes = name.encode("utf-8")
    h = hashlib.sha256()
    h.update(len(name_bytes).to_bytes(4, "big"))
    h.update(name_bytes)
    h.update(raw_args.encode("utf-8", errors="surrogatepass"))
    return h.hexdigest()
