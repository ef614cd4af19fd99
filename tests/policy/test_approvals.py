"""Which guard a call passes and when it needs a member decision."""

from __future__ import annotations

import pytest

from kaizen_server_extension.policy.approvals import (
    DEFAULT_APPROVAL_MODE,
    ApprovalMode,
    Guard,
    arguments_digest,
    decide,
    guard_for,
)
from kaizen_server_extension.protocol.tools import Capability, WriteCategory
from kaizen_server_extension.tools.types import ToolDescriptor

A, W, N = ApprovalMode.ALWAYS_ASK, ApprovalMode.ASK_FOR_WRITES, ApprovalMode.NEVER_ASK


def tool(capability: Capability, category: WriteCategory = WriteCategory.NONE) -> ToolDescriptor:
    return ToolDescriptor("t", "", {}, capability, write_category=category)


@pytest.mark.rule("R-438", "R-439", "R-440", "R-342", "R-152")
@pytest.mark.parametrize("descriptor,guard,asks", [
    # (always_ask, ask_for_writes, never_ask)
    (tool(Capability.READ), Guard.NONE, (False, False, False)),
    (tool(Capability.WRITE, WriteCategory.MEMBER_STORE), Guard.WRITE_GUARD, (True, False, False)),
    (tool(Capability.WRITE, WriteCategory.ISOLATED_EXECUTION), Guard.SANDBOX_LEASE,
     (True, False, False)),
    (tool(Capability.WRITE, WriteCategory.EXTERNAL_EFFECT), Guard.APPROVAL_GATE,
     (True, True, False)),
    (tool(Capability.WRITE), Guard.APPROVAL_GATE, (True, True, False)),
    (tool(Capability.SENSITIVE), Guard.APPROVAL_GATE, (True, True, True)),
    (tool(Capability.UNDECLARED), Guard.APPROVAL_GATE, (True, True, True)),
    # A "read" that declares an external effect takes the stricter declaration.
    (tool(Capability.READ, WriteCategory.EXTERNAL_EFFECT), Guard.APPROVAL_GATE,
     (True, True, False)),
])
def test_the_decision_table(descriptor: ToolDescriptor, guard: Guard, asks: tuple[bool, ...]):
    assert guard_for(descriptor) is guard
    assert tuple(decide(m, descriptor).needs_approval for m in (A, W, N)) == asks


def test_the_default_mode_is_ask_for_writes():
    assert DEFAULT_APPROVAL_MODE is ApprovalMode.ASK_FOR_WRITES
    assert ApprovalMode("never_ask") is N


@pytest.mark.rule("R-224", "R-283")
def test_the_digest_binds_name_and_exact_bytes():
    d = arguments_digest("create_artifact", '{"a": 1}')
    assert d == arguments_digest("create_artifact", '{"a": 1}')
    assert d != arguments_digest("create_artifact", '{"a":1}')
    assert d != arguments_digest("update_artifact", '{"a": 1}')
    # Length-prefixing: moving bytes between name and arguments changes the digest.
    assert arguments_digest("ab", "c") != arguments_digest("a", "bc")
