"""run_code in Jupyter kernels: leases, a warm pool, the sandbox provisioner, limits, file
capture and the ``tools.call`` bridge.

Public API (see each module): :class:`RunCodeService` / :class:`RunCodeConfig` /
:class:`RunCodeResult` (service), :class:`BridgeHandler` / :func:`bridge_handlers` (bridge),
:class:`SandboxProvisioner` (provisioner, entry point ``kaizen-sandbox``), the run_code schema
and descriptor (schema).
"""

from kaizen_kernel.bridge import BRIDGE_PATH, BridgeHandler, bridge_handlers, bridge_url
from kaizen_kernel.leases import ActiveCall, KernelLease, LeaseManager
from kaizen_kernel.limits import ExecutionBudget, ProcessLimits
from kaizen_kernel.provisioner import PROVISIONER_NAME, SandboxProvisioner
from kaizen_kernel.schema import (
    INPUT_SCHEMA,
    RunCodeArgumentsError,
    parse_arguments,
)
from kaizen_kernel.service import RunCodeConfig, RunCodeResult, RunCodeService

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
