"""The tool layer's small public API, for first-party families and third-party plugins alike.

Only light modules are imported here: a plugin importing ``tool`` and ``hookimpl`` must not pull
in the registry, catalog or runner (which import the plugins in turn).
"""

from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.protocol.tools import Capability, WriteCategory
from kaizen_server_extension.tools.decorators import tool
from kaizen_server_extension.tools.hookspecs import hookimpl
from kaizen_server_extension.tools.types import (
    ResourceContext,
    ResourceVerdict,
    RoomClass,
    ToolContext,
    ToolDescriptor,
    TrustedBody,
)

__all__ = [
    "Capability",
    "MemberSafeError",
    "ResourceContext",
    "ResourceVerdict",
    "RoomClass",
    "ToolContext",
    "ToolDescriptor",
    "ToolRegistry",
    "TrustedBody",
    "WriteCategory",
    "hookimpl",
    "tool",
]


def __getattr__(name: str) -> object:
    # ToolRegistry imports kaizen_plugins, which imports this package: resolve it lazily.
    if name == "ToolRegistry":
        from kaizen_server_extension.tools.registry import ToolRegistry

        return ToolRegistry
    raise AttributeError(name)
