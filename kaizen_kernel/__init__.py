"""run_code in Jupyter kernels: leases, a warm pool, the sandbox provisioner, limits, file
capture and the ``tools.call`` bridge.

Public API (see each module): :class:`RunCodeService` / :class:`RunCodeConfig` /
:class:`RunCodeResult` (service), :class:`BridgeHandler` / :func:`bridge_handlers` (bridge),
:class:`SandboxProvisioner` (provisioner, entry point ``kaizen-sandbox``), the run_code schema
and descriptor (schema).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kaizen_kernel.bridge import BRIDGE_PATH, BridgeHandler, bridge_handlers, bridge_url
    from kaizen_kernel.leases import ActiveCall, KernelLease, LeaseManager
    from kaizen_kernel.limits import ExecutionBudget, ProcessLimits
    from kaizen_kernel.provisioner import PROVISIONER_NAME, SandboxProvisioner
    from kaizen_kernel.schema import INPUT_SCHEMA, RunCodeArgumentsError, parse_arguments
    from kaizen_kernel.service import RunCodeConfig, RunCodeResult, RunCodeService

# Each name is loaded from its module on first use (PEP 562): start-up asks one submodule
# (``kaizen_kernel.provisioner`` for the sandbox setting) without loading the kernel service,
# which the server loads when it starts run_code.
_HOMES = {
    "BRIDGE_PATH": "bridge", "BridgeHandler": "bridge", "bridge_handlers": "bridge",
    "bridge_url": "bridge", "ActiveCall": "leases", "KernelLease": "leases",
    "LeaseManager": "leases", "ExecutionBudget": "limits", "ProcessLimits": "limits",
    "PROVISIONER_NAME": "provisioner", "SandboxProvisioner": "provisioner",
    "INPUT_SCHEMA": "schema", "RunCodeArgumentsError": "schema", "parse_arguments": "schema",
    "RunCodeConfig": "service", "RunCodeResult": "service", "RunCodeService": "service",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'kaizen_kernel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"kaizen_kernel.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "BRIDGE_PATH",
    "INPUT_SCHEMA",
    "PROVISIONER_NAME",
    "ActiveCall",
    "BridgeHandler",
    "ExecutionBudget",
    "KernelLease",
    "LeaseManager",
    "ProcessLimits",
    "RunCodeArgumentsError",
    "RunCodeConfig",
    "RunCodeResult",
    "RunCodeService",
    "SandboxProvisioner",
    "bridge_handlers",
    "bridge_url",
    "parse_arguments",
]
