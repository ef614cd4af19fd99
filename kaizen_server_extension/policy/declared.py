"""What policy reads of a tool: the trusted side's declaration of it, structurally.

The registry's :class:`~kaizen_server_extension.tools.types.ToolDescriptor` satisfies this
protocol; policy names only what it decides on, so it does not depend on the tool layer that
applies it (``tools/pipeline.py`` imports policy, never the other way round).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from kaizen_server_extension.protocol.tools import Capability, WriteCategory


class DeclaredTool(Protocol):
    """A registered tool's declaration: what the trusted wrapper says, not the model."""

    @property
    def name(self) -> str: ...

    @property
    def capability(self) -> Capability: ...

    @property
    def write_category(self) -> WriteCategory: ...

    @property
    def surface(self) -> str:
        """The discovery surface the tool is listed under."""
        ...

    @property
    def first_party(self) -> bool: ...

    @property
    def extra(self) -> Mapping[str, Any]: ...
