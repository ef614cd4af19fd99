"""The agent's capability ceiling: the frozen catalog's names, checked on every call.

Two ceilings must both allow a call — the agent's and the member's call-time permissions — and
neither is evaluated inside the model (R-001, R-098). The ceiling is the set fixed at admission;
nothing the model or a tool result says can add to it (R-099).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kaizen_server_extension.policy.errors import PolicyDenied


@dataclass(frozen=True, slots=True)
class CapabilityCeiling:
    names: frozenset[str]

    @classmethod
    def of(cls, names: Iterable[str]) -> CapabilityCeiling:
        return cls(frozenset(names))

    def allows(self, tool_name: str) -> bool:
        return tool_name in self.names

    def check(self, tool_name: str) -> None:
        """Raise :class:`PolicyDenied` for a tool outside the agent's ceiling."""
        if not self.allows(tool_name):
            # The name is model-chosen text: it is not echoed back into the message.
            raise PolicyDenied(
                "over_ceiling", "That tool is not available to this agent in this conversation."
            )
