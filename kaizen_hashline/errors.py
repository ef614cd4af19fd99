"""The one exception type of the Hashline package.

Every anticipated failure is a :class:`HashlineError`, a ``MemberSafeError`` whose message is
written for the model to act on and whose ``code`` names the failure (``stale_tag``,
``path_refused``, ``ambiguous_anchor`` …). ``domain`` is ``"caller"`` when the edit program or
the path was wrong, ``"tool"`` when the workspace itself failed (a commit that had to be
rolled back).
"""

from __future__ import annotations

from kaizen_server_extension.protocol.errors import MemberSafeError


class HashlineError(MemberSafeError):
    """An anticipated read/edit failure; nothing was written when it is raised."""

    def __init__(self, message: str, *, code: str, domain: str = "caller") -> None:
        super().__init__(message, code=code, domain=domain)

    def __repr__(self) -> str:
        return f"HashlineError(code={self.code!r}, message={str(self)!r})"
