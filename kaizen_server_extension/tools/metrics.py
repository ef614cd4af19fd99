"""The tool-run metric and the failed-result log line.

Every settled call counts exactly one outcome, labelled by tool and declared capability
(R-267), suppressed duplicates under their own outcome (R-288). A failed *result* is logged
once with its reason code, exit status and failure domain — never its text, which for a relayed
caller error is the program's own output (R-268). A tool that raised is not logged here; it is
the ``raised`` outcome and surfaces at the route (R-269).
"""

from __future__ import annotations

import logging

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from kaizen_server_extension.protocol.tools import Capability, FailureDomain, ToolOutcome

log = logging.getLogger("kaizen.tools.failures")

# Label used for a tool name the catalog does not know: model-invented names must not become
# unbounded label values.
UNKNOWN_TOOL_LABEL = "_unknown"


class ToolMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.invocations = Counter(
            "kaizen_tool_invocations",
            "Tool invocations by tool, declared capability and outcome.",
            ("tool", "capability", "outcome"),
            registry=registry if registry is not None else REGISTRY,
        )

    def record(self, tool: str, capability: Capability, outcome: ToolOutcome) -> None:
        self.invocations.labels(tool=tool, capability=capability.value,
                                outcome=outcome.value).inc()


_default: ToolMetrics | None = None


def default_metrics() -> ToolMetrics:
    """The process-wide instance on the global registry (created once: a second Counter of the
    same name on one registry is an error)."""
    global _default
    if _default is None:
        _default = ToolMetrics()
    return _default


def log_failed_result(
    *,
    run_id: str,
    call_id: str,
    tool: str,
    outcome: ToolOutcome,
    reason_code: str,
    domain: FailureDomain,
    exit_status: int | None = None,
) -> None:
    """One line per failed result; every argument is content-free by construction."""
    log.warning(
        "tool call failed: tool=%s outcome=%s reason=%s exit_status=%s domain=%s run=%s call=%s",
        tool, outcome.value, reason_code, exit_status, domain.value, run_id, call_id,
    )
