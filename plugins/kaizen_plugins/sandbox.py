"""The trusted declaration every sandbox tool shares (run_code and the workspace tools).

They all act only inside the member's kernel lease: write-tier, isolated-execution, bound to
the initiating actor in a room, and offered only when an agent names them (R-134, R-136).
"""

from __future__ import annotations

from typing import Any

from kaizen_server_extension.tools import Capability, RoomClass, WriteCategory

SANDBOX_TOOL: dict[str, Any] = {
    "capability": Capability.WRITE,
    # Running code or editing again after the workspace changed is ordinary use.
    "repeat_creates_object": False,
    "room_class": RoomClass.ACTOR_BOUND_WRITE,
    "write_category": WriteCategory.ISOLATED_EXECUTION,
    "surface": "sandbox",
    "explicit_grant_only": True,
}
