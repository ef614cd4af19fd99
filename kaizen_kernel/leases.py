"""Kernel leases: one per (actor, conversation) (R-439).

A lease owns the conversation's private workspace directory, a per-lease bridge secret, the
persistent kernels of that lease (at most one per language) and a lock that serialises its
executions. Leases are released before any approval wait (R-239): :meth:`LeaseManager.release`
revokes the bridge token, stops the lease's kernels and forgets the lease; the workspace
directory stays (files outlive the worker). Idle leases are reaped after ``idle_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kaizen_server_extension.protocol.tools import Capability

if TYPE_CHECKING:
    from kaizen_kernel.kernel import SandboxKernel

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT_S = 15 * 60.0


@dataclass(frozen=True, slots=True)
class LeaseKey:
    actor: str
    conversation_id: str


@dataclass(frozen=True, slots=True)
class ActiveCall:
    """What the bridge may do while one run_code execution is in flight."""

    call_id: str
    # Tool name -> declared capability, from the active provider snapshot.
    callable_tools: Mapping[str, Capability]
    # Opaque to this package: whatever the host's dispatch needs (authority bundle, ...).
    context: Any = None
    started: float = field(default_factory=time.monotonic)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _component(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()[:32]


class KernelLease:
    def __init__(self, key: LeaseKey, workspace: Path) -> None:
        self.key = key
        self.lease_id = secrets.token_hex(8)
        self.workspace = workspace
        self.token = secrets.token_urlsafe(32)
        self.token_digest = _digest(self.token)
        self.lock = asyncio.Lock()
        self.persistent: dict[str, SandboxKernel] = {}
        # The kernel of the execution in flight (ephemeral or persistent).
        self.current: SandboxKernel | None = None
        self.active: ActiveCall | None = None
        self.released = False
        self.last_used = time.monotonic()
        # Persistent state lost outside any call (language -> reason: a console shut the
        # kernel down or restarted it, or it died idle); the next persistent call says so.
        self.lost_state: dict[str, str] = {}

    @property
    def actor(self) -> str:
        return self.key.actor

    @property
    def conversation_id(self) -> str:
        return self.key.conversation_id

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def __repr__(self) -> str:  # never the token
        return (f"KernelLease(actor={self.key.actor!r}, "
                f"conversation={self.key.conversation_id!r}, id={self.lease_id})")


class LeaseManager:
    def __init__(self, workspace_root: Path, *,
                 idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S) -> None:
        self.workspace_root = workspace_root
        self.idle_timeout_s = idle_timeout_s
        self._leases: dict[LeaseKey, KernelLease] = {}
        self._by_token: dict[str, KernelLease] = {}
        # Told, synchronously, whenever a kernel leaves its lease for good or is about to be
        # restarted (console attachments are withdrawn here, kaizen_kernel/console.py).
        self.kernel_listeners: list[Callable[[SandboxKernel], None]] = []
        # Use of a lease's kernels outside run_code (a console executing code), as a
        # time.monotonic() value or None: it keeps the lease from idling out.
        self.activity_probes: list[Callable[[KernelLease], float | None]] = []

    def kernel_gone(self, kernel: SandboxKernel) -> None:
        """A lease's kernel is being discarded or restarted: its state does not go on."""
        for listener in list(self.kernel_listeners):
            try:
                listener(kernel)
            except Exception:
                log.warning("a kernel listener failed", exc_info=True)

    def workspace_for(self, key: LeaseKey) -> Path:
        """The private workspace of (actor, conversation); names are hashed, never joined."""
        path = self.workspace_root / _component(key.actor) / _component(key.conversation_id)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.is_symlink() or not path.is_dir():
            raise RuntimeError("workspace is not a private directory")
        return path.resolve()

    def acquire(self, actor: str, conversation_id: str) -> KernelLease:
        """The live lease of (actor, conversation), created on first use."""
        if not actor or not conversation_id:
            raise ValueError("a lease needs an actor and a conversation")
        key = LeaseKey(actor, conversation_id)
        lease = self._leases.get(key)
        if lease is None or lease.released:
            lease = KernelLease(key, self.workspace_for(key))
            self._leases[key] = lease
            self._by_token[lease.token_digest] = lease
        lease.touch()
        return lease

    def get(self, actor: str, conversation_id: str) -> KernelLease | None:
        return self._leases.get(LeaseKey(actor, conversation_id))

    def by_token(self, token: str) -> KernelLease | None:
        """The live lease whose bridge secret is ``token`` (constant-time compare)."""
        if not token:
            return None
        lease = self._by_token.get(_digest(token))
        if lease is None or lease.released:
            return None
        if not hmac.compare_digest(lease.token, token):
            return None
        if self.is_expired(lease):
            return None
        return lease

    def is_expired(self, lease: KernelLease, now: float | None = None) -> bool:
        if lease.released:
            return True
        if lease.active is not None or lease.lock.locked():
            return False
        return ((now or time.monotonic()) - self.last_activity(lease)) > self.idle_timeout_s

    def last_activity(self, lease: KernelLease) -> float:
        """The lease's last use: its last call, or later use reported by a probe."""
        latest = lease.last_used
        for probe in self.activity_probes:
            try:
                seen = probe(lease)
            except Exception:
                log.warning("a lease activity probe failed", exc_info=True)
                continue
            if seen is not None and seen > latest:
                latest = seen
        return latest

    async def release(self, actor: str, conversation_id: str) -> bool:
        """Drop the lease: token revoked, kernels (persistent included) shut down.

        Call before an approval request becomes approvable (R-239). Returns False when
        there was no live lease. Waits for nothing: an in-flight execution is cut off by its
        kernel's shutdown.
        """
        lease = self._leases.pop(LeaseKey(actor, conversation_id), None)
        if lease is None:
            return False
        await self._retire(lease)
        return True

    async def _retire(self, lease: KernelLease) -> None:
        lease.released = True
        lease.active = None
        self._by_token.pop(lease.token_digest, None)
        kernels = list(lease.persistent.values())
        if lease.current is not None and lease.current not in kernels:
            kernels.append(lease.current)
        lease.persistent.clear()
        for kernel in kernels:
            self.kernel_gone(kernel)
        for kernel in kernels:
            with contextlib.suppress(Exception):
                await kernel.shutdown()

    async def reap_idle(self, now: float | None = None) -> int:
        """Retire leases idle past the timeout; returns how many."""
        stale = [lease for lease in self._leases.values() if self.is_expired(lease, now)]
        for lease in stale:
            self._leases.pop(lease.key, None)
            await self._retire(lease)
        return len(stale)

    async def close(self) -> None:
        leases = list(self._leases.values())
        self._leases.clear()
        for lease in leases:
            await self._retire(lease)

    def __len__(self) -> int:
        return len(self._leases)

    def kernel_count(self) -> int:
        """Kernels held by live leases: persistent ones, plus an ephemeral one mid-call
        (the ``kaizen_run_code_kernels`` gauge)."""
        return sum(len(lease.persistent) + (lease.current is not None
                                            and lease.current not in lease.persistent.values())
                   for lease in self._leases.values())
