"""What a task's run may do, decided on the trusted side before every action with an effect.

A run carries its task posture in the authority bundle from admission (R-053). For any call
that may have an effect (a write, sensitive or undeclared tool):

* ``task_test`` (a safe test): only isolated execution runs — run_code in its own sandboxed
  kernel and workspace. Every other effect is refused before any approval is asked for, and
  the turn goes on so the test can report what it would have done (R-055).
* ``task_run``: the task's authority is read again, now, before the approval gate and again
  immediately before execution (after any wait). A task deleted or edited since it fired, or
  an owner who left the room, blocks the call; nothing stored at firing time stands in for
  the live answer (R-056, R-057).

Reads are unaffected: they pass the member's own permissions as in any run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kaizen_server_extension.policy.errors import PolicyDenied
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.tools import WriteCategory

CHAT = "chat"
TASK_RUN = "task_run"
TASK_TEST = "task_test"
POSTURES = (CHAT, TASK_RUN, TASK_TEST)

SAFE_TEST_REFUSAL = (
    "This is a safe test of a task: actions that change anything outside the sandbox are "
    "not performed, so {tool} was not run. Say what it would have done and go on.")
AUTHORITY_MISSING = (
    "This task no longer authorizes actions (it was deleted or changed since it started, or "
    "its owner left the conversation), so {tool} was not run.")


class TaskAuthorityLookup(Protocol):
    async def current_authority(self, run_id: str, member: str) -> object | None:
        """The run's task authority read now, or None when it is gone."""
        ...


@dataclass(frozen=True, slots=True)
class SafeTestRefusal:
    """A safe test's refusal: definite (nothing ran) and repairable (the turn goes on)."""

    message: str
    code: str = "safe_test_no_effects"


class TaskPostureGate:
    def __init__(self, tasks: TaskAuthorityLookup) -> None:
        self._tasks = tasks

    async def check(self, bundle: AuthorityBundle, tool: str,
                    write_category: WriteCategory) -> SafeTestRefusal | None:
        """For a call of ``tool`` that may have an effect: None to go on, a
        :class:`SafeTestRefusal`, or PolicyDenied (blocked)."""
        if bundle.posture == CHAT:
            return None
        if bundle.posture == TASK_TEST:
            if write_category is WriteCategory.ISOLATED_EXECUTION:
                return None
            return SafeTestRefusal(SAFE_TEST_REFUSAL.format(tool=tool))
        if bundle.posture != TASK_RUN:
            raise PolicyDenied("task_posture_unknown",
                               f"This run's posture is not recognised, so {tool} "
                               "was not run.")
        try:
            authority = await self._tasks.current_authority(bundle.run_id, bundle.member)
        except Exception:
            authority = None  # an unreadable authority is a missing one: fail closed
        if authority is None:
            raise PolicyDenied("task_authority_missing",
                               AUTHORITY_MISSING.format(tool=tool))
        return None
