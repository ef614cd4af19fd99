"""``RunCodeService``: the run_code facade the tool layer calls.

One call: validate → lease (actor + conversation) → kernel (warm ephemeral, or the lease's
persistent one) → bind (workspace, bridge, cap) → execute under the wall-time and output
budgets → on overrun interrupt (a control message), and restart when the program ignores it
→ capture the declared files → a bounded :class:`RunCodeResult` that says whose failure it
was. A cancelled call (the member's Stop) interrupts its program the same way, at once.

Whose failure (spec: Whose failure it was): a program's traceback, a wall-time overrun the
sandbox enforced (with or without a restart) and an unavailable language are the *caller's*
(``FailureDomain.CALLER``: the sandbox did its job). A kernel that cannot start, dies under a
call, or cannot be restarted is the *tool's* (``FailureDomain.TOOL``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kaizen_kernel import files as files_mod
from kaizen_kernel import resources as resources_mod
from kaizen_kernel.execute import DisplayItem, ExecutionCapture
from kaizen_kernel.kernel import Binding, KernelLaunchConfig, KernelStartError, SandboxKernel
from kaizen_kernel.leases import DEFAULT_MAX_PARKED, ActiveCall, KernelLease, LeaseManager
from kaizen_kernel.limits import ExecutionBudget, ProcessLimits
from kaizen_kernel.pool import KernelPool, LanguageUnavailable
from kaizen_kernel.remote.client import GatewaySettings, TransferRefused
from kaizen_kernel.resources import ResourceGrant, VerifiedResources
from kaizen_kernel.schema import (
    LANGUAGES,
    TOOL_NAME,
    RunCodeArguments,
    RunCodeArgumentsError,
    parse_arguments,
)
from kaizen_server_extension.protocol.tools import (
    ON_SCREEN,
    CanvasItem,
    Capability,
    FailureDomain,
    ToolOutcome,
    png_item,
)

log = logging.getLogger(__name__)

# How long a cancelled call's interrupted kernel may take to come back idle (below the tool
# pipeline's 1 s grace for a cancelled tool, so the call still ends within it).
CANCEL_INTERRUPT_GRACE_S = 0.75

RunStatus = Literal["ok", "error", "timeout", "restarted"]


@dataclass(slots=True)
class RunCodeResult:
    status: RunStatus
    outcome: ToolOutcome
    failure_domain: FailureDomain
    language: str
    persistent: bool
    # Content-free reason code: ok | program_error | wall_time_exceeded |
    # wall_time_exceeded_restarted | kernel_died | kernel_unavailable | language_unavailable |
    # lease_released
    code: str = "ok"
    message: str = ""
    stdout: str = ""
    stderr: str = ""
    displays: list[DisplayItem] = field(default_factory=list)
    error_name: str | None = None
    error_value: str | None = None
    traceback: str | None = None
    files: list[files_mod.CapturedFile] = field(default_factory=list)
    refused_files: list[files_mod.RefusedFile] = field(default_factory=list)
    duration_ms: int = 0
    output_truncated: bool = False
    truncated_in_kernel: bool = False
    error_truncated: bool = False
    kernel_restarted: bool = False
    state_lost: bool = False
    # The call's projected files, bounded: ids, versions, digests, sizes (R-457, never bytes).
    resources: list[dict[str, Any]] = field(default_factory=list)
    # Gateway transfer mode: kernel-side reasons for targets not handed over (by name).
    transfer_refusals: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def failed(self) -> bool:
        return self.outcome != ToolOutcome.OK

    def canvas(self) -> tuple[CanvasItem, ...]:
        """The PNG images the program displayed, in order, for the chat canvas (R-277): the
        payload carries an on-screen marker in place of each, never its bytes."""
        images = [item.image_png_b64 for item in self.displays
                  if item.image_png_b64 is not None]
        return tuple(png_item(data, f"Image {n} of {len(images)} displayed by the program")
                     for n, data in enumerate(images, 1))

    def to_payload(self, *, repair: bool = True) -> dict[str, Any]:
        """The bounded, model-facing JSON body (no file bytes; each image is a marker saying
        it is on screen, see :meth:`canvas`).

        A failed or timed-out run carries a ``repair_instruction`` naming the exception
        unless ``repair`` is False (the member asked for no retries).
        """
        outputs: list[str] = []
        for item in self.displays:
            if item.text_plain is not None:
                outputs.append(item.text_plain)
            if item.image_png_b64 is not None:
                size = len(item.image_png_b64) * 3 // 4
                outputs.append(f"[image/png, {size} bytes: {ON_SCREEN}]")
        body: dict[str, Any] = {
            "status": self.status,
            "code": self.code,
            "failure_domain": self.failure_domain.value,
            "language": self.language,
            "persistent": self.persistent,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "outputs": outputs,
            "files": [f.describe() for f in self.files],
            "duration_ms": self.duration_ms,
            "truncated": self.output_truncated,
        }
        if self.refused_files:
            body["refused_files"] = [r.describe() for r in self.refused_files]
        if self.resources:
            body["resources"] = self.resources
        if self.message:
            body["message"] = self.message
        if self.error_name is not None:
            body["error"] = {"name": self.error_name, "value": self.error_value or "",
                             "traceback": self.traceback or ""}
        if self.kernel_restarted or self.state_lost:
            body["kernel_restarted"] = self.kernel_restarted
            body["state_lost"] = self.state_lost
        if self.failed and repair:
            what = self.error_name or ("the time limit" if self.status in
                                       ("timeout", "restarted") else self.code)
            body["repair_instruction"] = (
                f"The run failed with {what}. Fix the code and run it again; do not resend "
                "the same code unchanged.")
        return body


@dataclass(frozen=True, slots=True)
class RunCodeConfig:
    state_root: Path
    budget: ExecutionBudget = field(default_factory=ExecutionBudget)
    process_limits: ProcessLimits = field(default_factory=ProcessLimits)
    jail: str = "auto"
    shared_dir: str | None = None
    env_allowlist: tuple[str, ...] | None = None
    pool_sizes: Mapping[str, int] = field(default_factory=lambda: {"python": 1})
    idle_timeout_s: float = 15 * 60.0
    # Persistent kernels kept for their conversation across a lease release (an approval
    # wait), oldest reclaimed first; each for at most idle_timeout_s (kaizen_kernel/leases.py).
    max_parked_kernels: int = DEFAULT_MAX_PARKED
    max_file_bytes: int = files_mod.DEFAULT_MAX_FILE_BYTES
    max_total_file_bytes: int = files_mod.DEFAULT_MAX_TOTAL_BYTES
    bridge_url: str | None = None
    # Set when the Jupyter server runs with a gateway (--gateway-url): kernels start there.
    gateway: GatewaySettings | None = None
    # Kernelspec per language; default: discovered (python3; a javascript-language spec).
    kernel_names: Mapping[str, str] | None = None


class RunCodeService:
    def __init__(self, config: RunCodeConfig) -> None:
        self.config = config
        self.budget = config.budget
        self.bridge_url = config.bridge_url
        launch = KernelLaunchConfig(
            state_root=config.state_root / "kernels",
            process_limits=config.process_limits,
            jail=config.jail,
            shared_dir=config.shared_dir,
            env_allowlist=config.env_allowlist,
        )
        self.pool: KernelPool
        if config.gateway is not None:
            from kaizen_kernel.remote.kernel import GatewayKernelPool

            self.pool = GatewayKernelPool(launch, config.gateway, sizes=config.pool_sizes,
                                          kernel_names=config.kernel_names)
        else:
            self.pool = KernelPool(launch, sizes=config.pool_sizes,
                                   kernel_names=config.kernel_names)
        self.leases = LeaseManager(config.state_root / "workspaces",
                                   idle_timeout_s=config.idle_timeout_s,
                                   max_parked=config.max_parked_kernels)
        self._reaper: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        await self.pool.start()
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        interval = max(1.0, min(60.0, self.config.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.leases.reap_idle()
            except Exception:
                log.warning("reaping idle kernel leases failed", exc_info=True)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        await self.leases.close()
        await self.pool.close()

    async def release(self, actor: str, conversation_id: str) -> bool:
        """Release the lease before an approval wait (R-239); its idle persistent kernels are
        parked for the conversation's next lease, so the approved call resumes them."""
        return await self.leases.release(actor, conversation_id)

    def workspace(self, actor: str, conversation_id: str) -> Path:
        """The lease workspace (shared with read_workspace/edit_workspace)."""
        return self.leases.acquire(actor, conversation_id).workspace

    # --- the call -------------------------------------------------------------------------

    async def run_arguments(self, actor: str, conversation_id: str,
                            arguments: Mapping[str, Any] | str, **kwargs: Any) -> RunCodeResult:
        """Validate raw tool arguments (schema) and run them."""
        args: RunCodeArguments = parse_arguments(arguments)
        return await self.run(actor, conversation_id, args.code, args.language, args.persistent,
                              args.artifact_targets, **kwargs)

    async def run(
        self,
        actor: str,
        conversation_id: str,
        code: str,
        language: str,
        persistent: bool,
        artifact_targets: Sequence[str],
        *,
        wall_seconds: float | None = None,
        output_bytes: int | None = None,
        callable_tools: Mapping[str, Capability] | None = None,
        call_context: Any = None,
        call_id: str | None = None,
        resources: ResourceGrant | None = None,
    ) -> RunCodeResult:
        t0 = time.monotonic()
        if language not in LANGUAGES:
            raise RunCodeArgumentsError(f"language must be one of {', '.join(LANGUAGES)}")
        if artifact_targets is None:  # explicit: missing is a schema error, not a default
            raise RunCodeArgumentsError("artifact_targets is required ([] for compute-only)")
        try:
            targets = files_mod.validate_targets(list(artifact_targets))
        except files_mod.TargetRejected as exc:
            raise RunCodeArgumentsError(f"artifact_targets refused ({exc.reason})") from None
        budget = self.budget.clamp(wall_seconds, output_bytes)

        def finish(result: RunCodeResult) -> RunCodeResult:
            result.duration_ms = int((time.monotonic() - t0) * 1000)
            return result

        if not self.pool.available(language):
            return finish(RunCodeResult(
                status="error", outcome=ToolOutcome.ERROR, failure_domain=FailureDomain.CALLER,
                language=language, persistent=persistent, code="language_unavailable",
                message=str(LanguageUnavailable(language))))
        # The admitted files, proven before anything is dispatched.
        verified: VerifiedResources | None = None
        if resources is not None and resources.admitted:
            try:
                verified = await resources_mod.verify(resources)
            except resources_mod.ResourcesRefused as refusal:
                return finish(RunCodeResult(
                    status="error", outcome=ToolOutcome.ERROR,
                    failure_domain=FailureDomain.TOOL, language=language,
                    persistent=persistent, code=refusal.code,
                    message=f"{refusal.message}; nothing was run",
                    resources=[r.audit() for r in resources.admitted.resources]))

        lease = self.leases.acquire(actor, conversation_id)
        async with lease.lock:
            if lease.released:  # released while we waited: take the fresh lease
                lease = self.leases.acquire(actor, conversation_id)
            result = await self._run_locked(lease, code, language, persistent, budget,
                                            callable_tools or {}, call_context,
                                            call_id or uuid.uuid4().hex, verified,
                                            targets=targets)
        lease.touch()
        try:
            captured, refused = await asyncio.to_thread(
                files_mod.capture, lease.workspace, targets,
                max_file_bytes=self.config.max_file_bytes,
                max_total_bytes=self.config.max_total_file_bytes)
        except OSError:
            captured, refused = [], [files_mod.RefusedFile(name=t, reason="unreadable")
                                     for t in targets]
        result.files = captured
        # A gateway kernel's own reason for a file it did not hand over beats "missing".
        result.refused_files = [
            files_mod.RefusedFile(name=r.name, reason=result.transfer_refusals.get(r.name,
                                                                                 r.reason))
            for r in refused]
        result.resources = verified.audit() if verified is not None else []
        return finish(result)

    async def _kernel_for(self, lease: KernelLease, language: str,
                          persistent: bool) -> SandboxKernel:
        if persistent:
            kernel = lease.persistent.get(language)
            if kernel is not None and await kernel.is_alive():
                return kernel
            if kernel is not None:
                # Died between calls: its state is gone, and the next result says so.
                lease.persistent.pop(language, None)
                lease.lost_state.setdefault(language, "kernel_died")
                self.leases.kernel_gone(kernel)
                await kernel.shutdown()
            kernel = await self.pool.acquire(language, lease.workspace)
            lease.persistent[language] = kernel
            return kernel
        return await self.pool.acquire(language, lease.workspace)

    async def _run_locked(self, lease: KernelLease, code: str, language: str,
                          persistent: bool, budget: ExecutionBudget,
                          callable_tools: Mapping[str, Capability], call_context: Any,
                          call_id: str,
                          verified: VerifiedResources | None = None, *,
                          targets: Sequence[str] = ()) -> RunCodeResult:
        base: dict[str, Any] = {"language": language, "persistent": persistent}
        try:
            kernel = await self._kernel_for(lease, language, persistent)
        except LanguageUnavailable as exc:
            return RunCodeResult(status="error", outcome=ToolOutcome.ERROR,
                                 failure_domain=FailureDomain.CALLER,
                                 code="language_unavailable", message=str(exc), **base)
        except Exception as exc:
            log.warning("run_code kernel start failed", exc_info=True)
            # KernelStartError messages are ours and name no host, path or secret.
            why = f": {exc}" if isinstance(exc, KernelStartError) else ""
            return RunCodeResult(status="error", outcome=ToolOutcome.ERROR,
                                 failure_domain=FailureDomain.TOOL, code="kernel_unavailable",
                                 message=f"the sandbox kernel could not be started{why}",
                                 **base)
        # State lost outside any call (a console shut the kernel down, ...): reported once.
        lost = lease.lost_state.pop(language, None) if persistent else None
        readable = sorted(name for name, cap in callable_tools.items()
                          if cap == Capability.READ and name != TOOL_NAME)
        lease.current = kernel
        lease.active = ActiveCall(call_id=call_id, callable_tools=dict(callable_tools),
                                  context=call_context)
        keep = persistent
        try:
            resources_dir, manifest = await self._project(kernel, verified)
            await kernel.bind(Binding(
                workspace=str(lease.workspace), url=self.bridge_url if readable else None,
                token=lease.token if readable else None, available=tuple(readable),
                cap=budget.output_bytes, resources_dir=resources_dir,
                resources_manifest=manifest))
            capture = await kernel.execute(code, wall_seconds=budget.wall_seconds,
                                           output_bytes=budget.output_bytes)
            lease.active = None  # callbacks end with the program
            result = self._from_capture(capture, base)
            if lost is not None:
                _note_state_lost(result, lost)
            if capture.status == "timeout":
                result = await self._after_timeout(kernel, persistent, result)
                keep = persistent and result.failure_domain != FailureDomain.TOOL
            elif capture.status == "died":
                keep = False
            if targets and result.status in ("ok", "error", "timeout"):
                # A gateway kernel on another host hands its declared files over now.
                result.transfer_refusals = await kernel.collect_targets(
                    targets, lease.workspace, max_file_bytes=self.config.max_file_bytes,
                    max_total_bytes=self.config.max_total_file_bytes)
            if lease.released:
                keep = False
                result.status, result.outcome = "error", ToolOutcome.ERROR
                result.failure_domain, result.code = FailureDomain.CALLER, "lease_released"
                result.message = "the sandbox lease was released during the call"
            return result
        except asyncio.CancelledError:
            # The caller gave up (the member's Stop, the tool deadline): the program is
            # interrupted now. A kernel back idle within the grace keeps a persistent state;
            # one still running the program goes, and the next call says its state is lost.
            keep = persistent and await self._interrupt_cancelled(kernel)
            if persistent and not keep:
                lease.lost_state[language] = "call_cancelled"
            raise
        except TransferRefused as refusal:
            # Gateway transfer mode: the call's files could not be brought to the kernel's
            # host within bounds and intact (kaizen_kernel/remote/kernel.py); nothing ran.
            refused = RunCodeResult(
                status="error", outcome=ToolOutcome.ERROR,
                failure_domain=FailureDomain.CALLER if refusal.caller else FailureDomain.TOOL,
                code=refusal.code, message=f"{refusal.message}; nothing was run", **base)
            if lost is not None:
                _note_state_lost(refused, lost)
            return refused
        except KernelStartError:
            keep = False
            log.warning("run_code kernel setup failed", exc_info=True)
            return RunCodeResult(status="error", outcome=ToolOutcome.ERROR,
                                 failure_domain=FailureDomain.TOOL, code="kernel_unavailable",
                                 message="the sandbox kernel could not be prepared", **base)
        finally:
            lease.active = None
            lease.current = None
            if not keep:
                if lease.persistent.get(language) is kernel:
                    lease.persistent.pop(language, None)
                self.leases.kernel_gone(kernel)
                self.pool.discard(kernel)

    @staticmethod
    async def _project(kernel: SandboxKernel,
                       verified: VerifiedResources | None) -> tuple[str | None, str | None]:
        """Write the verified files into the kernel's read-only directory once (a persistent
        kernel keeps them while they stay the same) and return (directory, manifest); an
        empty directory and no manifest when the call has none. The directory is named even
        then, so the prelude can clear the working-directory links an earlier kernel of the
        lease made into its sibling (the variables exist only with a manifest)."""
        directory: Path | None = getattr(kernel, "resources_dir", None)
        if verified is None or not verified.files:
            if directory is not None and kernel.projected is not None:
                await asyncio.to_thread(resources_mod.clear, directory)
                kernel.projected = None
                kernel.projected_manifest = None
            return (str(directory) if directory is not None else None), None
        if directory is None:
            raise KernelStartError("this kernel cannot receive shared files")
        if kernel.projected != verified.digest:
            kernel.projected = None
            kernel.projected_manifest = await asyncio.to_thread(
                resources_mod.project, directory, verified)
            kernel.projected = verified.digest
        return str(directory), kernel.projected_manifest

    @staticmethod
    async def _interrupt_cancelled(kernel: SandboxKernel) -> bool:
        """Interrupt the execution of a cancelled call; True when the kernel came back idle.
        Bounded below the pipeline's grace for a cancelled tool (CANCEL_GRACE_S, 1 s), and
        finished even if the caller is cancelled again meanwhile."""
        if not kernel.in_flight:
            return True  # nothing running: the kernel is as the last execution left it
        settle = asyncio.ensure_future(kernel.settle_timeout(CANCEL_INTERRUPT_GRACE_S))
        try:
            return await asyncio.shield(settle)
        except asyncio.CancelledError:
            return False
        except Exception:
            return False

    async def _after_timeout(self, kernel: SandboxKernel, persistent: bool,
                             result: RunCodeResult) -> RunCodeResult:
        if await kernel.settle_timeout():
            return result  # interrupted: the kernel (and a persistent state) survive
        result.status = "restarted"
        result.code = "wall_time_exceeded_restarted"
        result.kernel_restarted = True
        result.state_lost = True
        result.message = ("the program ignored the interrupt at the time limit; the kernel "
                          + ("was restarted" if persistent else "was stopped")
                          + " and its state is lost")
        if persistent:
            self.leases.kernel_gone(kernel)  # a console attached to the old state goes
            try:
                await kernel.restart()
            except Exception:
                log.warning("run_code kernel restart failed", exc_info=True)
                result.failure_domain = FailureDomain.TOOL
                result.code = "kernel_restart_failed"
                result.message = "the program ignored the interrupt and the kernel could " \
                                 "not be restarted"
        return result

    @staticmethod
    def _from_capture(capture: ExecutionCapture, base: dict[str, Any]) -> RunCodeResult:
        common: dict[str, Any] = {
            "stdout": capture.stdout, "stderr": capture.stderr, "displays": capture.displays,
            "output_truncated": capture.truncated,
            "truncated_in_kernel": capture.truncated_in_kernel,
            "error_truncated": capture.error_truncated, **base,
        }
        if capture.status == "ok":
            return RunCodeResult(status="ok", outcome=ToolOutcome.OK,
                                 failure_domain=FailureDomain.NONE, **common)
        if capture.status == "error":
            err = capture.error
            return RunCodeResult(
                status="error", outcome=ToolOutcome.ERROR, failure_domain=FailureDomain.CALLER,
                code="program_error", error_name=err.name if err else "Error",
                error_value=err.value if err else "", traceback=err.traceback if err else "",
                **common)
        if capture.status == "timeout":
            return RunCodeResult(status="timeout", outcome=ToolOutcome.TIMEOUT,
                                 failure_domain=FailureDomain.CALLER, code="wall_time_exceeded",
                                 message="the program exceeded its time limit and was "
                                         "interrupted", **common)
        return RunCodeResult(status="error", outcome=ToolOutcome.ERROR,
                             failure_domain=FailureDomain.TOOL, code="kernel_died",
                             message="the sandbox kernel died during the call",
                             kernel_restarted=False, state_lost=True, **common)


# Why a persistent call found its earlier state gone, in words the model can act on.
_STATE_LOST_NOTES = {
    "console_shutdown": "the persistent kernel was shut down from a console after the last "
                        "call, so this call ran in a fresh kernel: earlier variables are gone",
    "console_restart": "the persistent kernel was restarted from a console after the last "
                       "call: earlier variables are gone",
    "kernel_died": "the persistent kernel had stopped after the last call, so this call ran "
                   "in a fresh kernel: earlier variables are gone",
    "call_cancelled": "the previous call was stopped while its program ignored the "
                      "interrupt, so its kernel went and this call ran in a fresh one: "
                      "earlier variables are gone",
    "released_mid_call": "the sandbox lease was released (an approval was asked) while the "
                         "persistent kernel was running a call, so it was stopped and this "
                         "call ran in a fresh kernel: earlier variables are gone",
    "reclaimed_capacity": "the persistent kernel was reclaimed for capacity while this "
                          "conversation waited (too many kernels were parked), so this call "
                          "ran in a fresh kernel: earlier variables are gone",
    "reclaimed_idle": "the persistent kernel was reclaimed after being idle too long, so this "
                      "call ran in a fresh kernel: earlier variables are gone",
}


def _note_state_lost(result: RunCodeResult, reason: str) -> None:
    result.state_lost = True
    note = _STATE_LOST_NOTES.get(reason, "the persistent kernel's earlier state is gone")
    result.message = f"{result.message}; {note}" if result.message else note
