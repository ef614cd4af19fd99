"""run_code: agent-written code in the member's sandboxed Jupyter kernel."""

from __future__ import annotations

from typing import Any

from kaizen_kernel.schema import DESCRIPTION, INPUT_SCHEMA
from kaizen_plugins.artifacts import persist_run_files
from kaizen_plugins.sandbox import SANDBOX_TOOL
from kaizen_server_extension.tools import (
    MemberSafeError,
    ToolContext,
    hookimpl,
    tool,
)
from kaizen_server_extension.tools.hookspecs import ToolRegistrar

# Above the sandbox's own wall-time cap (SANDBOX_MAX_WALL_SECONDS, at most 240 s) plus the
# interrupt-then-restart grace, so the sandbox, not the pipeline, reports a slow program.
RUN_CODE_TIMEOUT_S = 240


@tool(
    name="run_code",
    description=DESCRIPTION,
    input_schema=INPUT_SCHEMA,
    timeout_s=RUN_CODE_TIMEOUT_S,
    **SANDBOX_TOOL,
)
async def run_code(ctx: ToolContext, **arguments: Any) -> dict[str, Any]:
    service = ctx.services.get("run_code")
    if service is None:
        raise MemberSafeError("Code execution is not available on this server.",
                              code="run_code_unavailable")
    bridge = ctx.services.get("bridge")
    result = await service.run_arguments(
        ctx.member, ctx.bundle.conversation_id, dict(arguments),
        callable_tools=bridge.read_tools if bridge is not None else {},
        call_context=bridge,
    )
    payload: dict[str, Any] = result.to_payload()
    # Output files persist through the artifact store, even when the program failed.
    await persist_run_files(ctx, result.files, payload, failed=result.failed)
    return payload


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(run_code)
