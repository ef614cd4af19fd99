"""The authority bundle: what a run was admitted with, presented unchanged by every call.

The backend compares a presented bundle with the admitted one field by field and rejects any
difference, never reconciles it (R-006, R-007). This is the one comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AuthorityBundle:
    """Fixed at admission; presented unchanged by every later call of the run (R-006)."""

    run_id: str
    conversation_id: str
    input_position: int
    member: str
    agent_version_id: str
    audience_version: int
    resource_digest: str
    fence: int
    #: Server-owned (R-053): ``chat``, or ``task_run`` / ``task_test`` for a task's firing,
    #: read from the firing row at admission; never from anything the model or member sends.
    posture: str = "chat"

    def differing_fields(self, other: AuthorityBundle) -> list[str]:
        """Names of the fields where ``other`` differs: any one means rejection."""
        return [
            name
            for name in self.__slots__
            if getattr(self, name) != getattr(other, name)
        ]


class AuthorityRejected(Exception):
    """The backend refused a call whose bundle differs from the admitted one (R-007)."""

    def __init__(self, fields: Sequence[str]) -> None:
        super().__init__("authority bundle mismatch: " + ", ".join(fields))
        self.fields = tuple(fields)


def verify_bundle(admitted: AuthorityBundle, presented: AuthorityBundle) -> None:
    """Raise :class:`AuthorityRejected` naming every field where ``presented`` differs."""
    differing = admitted.differing_fields(presented)
    if differing:
        raise AuthorityRejected(differing)
