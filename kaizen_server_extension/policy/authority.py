"""Reference implementations of the small policy ports, for the host's simplest wiring and tests.

The production authority check lives in the store (run row, fence, audience); these hold the
same contract in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from kaizen_server_extension.policy.approvals import ApprovalMode
from kaizen_server_extension.protocol.authority import AuthorityBundle, AuthorityRejected


@dataclass(frozen=True, slots=True)
class FixedBundleAuthority:
    """Accepts only the bundle the run was admitted with, field for field (R-007)."""

    admitted: AuthorityBundle

    async def verify(self, bundle: AuthorityBundle) -> None:
        differing = self.admitted.differing_fields(bundle)
        if differing:
            raise AuthorityRejected(differing)


@dataclass(frozen=True, slots=True)
class FixedApprovalMode:
    mode: ApprovalMode

    async def mode_for(self, member: str) -> ApprovalMode:
        return self.mode
