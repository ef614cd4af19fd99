"""Kernel leases: one per (actor, conversation) (R-439).

A lease owns the conversation's private workspace directory, a per-lease bridge secret, the
persistent kernels of that lease (at most one per language) and a lock that serialises its
executions. Leases are released before any approval wait (R-239): :meth:`LeaseManager.release`
revokes the bridge token, stops what is executing and forgets the lease; the workspace
directory stays (files outlive the worker).

The lease's idle persistent kernels are **parked**, not shut down: held by the manager, bound
to nothing (the revoked token reaches no tool, no call is in flight), and handed to the next
lease of the same (actor, conversation), so an approved call resumes the kernel it left
(``x = 41``, an approval, ``print(x + 1)``). Parking is bounded: at most ``max_parked``
kernels (the oldest are reclaimed first) and each for at most ``idle_timeout_s``. A kernel
reclaimed for capacity or idle time, like an idle lease reaped with its kernels, is noted,
and the conversation's next persistent call reports ``state_lost`` with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kaizen_server_extension.protocol.tools import Capability

if TYPE_CHECKING:
    from kaizen_kernel.kernel import SandboxKernel

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT_S = 15 * 60.0
DEFAULT_MAX_PARKED = 16
# How many conversations' "your state was lost" notes are remembered for their next call.
MAX_LOST_NOTES = 4096


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


@dataclass(slots=True)
class ParkedKernels:
    """The idle persistent kernels of a released lease, waiting for its next lease."""

    kernels: dict[str, SandboxKernel]
    parked_at: float = field(default_factory=time.monotonic)


class LeaseManager:
    def __init__(self, workspace_root: Path, *,
                 idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 max_parked: int = DEFAULT_MAX_PARKED) -> None:
        self.workspace_root = workspace_root
        self.idle_timeout_s = idle_timeout_s
        self.max_parked = max_parked
        self._leases: dict[LeaseKey, KernelLease] = {}
        self._by_token: dict[str, KernelLease] = {}
        # Released leases' persistent kernels, oldest first (see the module docstring).
        self._parked: OrderedDict[LeaseKey, ParkedKernels] = OrderedDict()
        # State lost while no lease was live (language -> reason), for the next lease.
        self._lost: OrderedDict[LeaseKey, dict[str, str]] = OrderedDict()
        # Told, synchronously, whenever a kernel leaves its lease — for good, to be restarted,
        # or to be parked (console attachments are withdrawn here, kaizen_kernel/console.py).
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
            parked = self._parked.pop(key, None)
            if parked is not None:
                # The kernels the conversation's last lease left, with their state.
                lease.persistent.update(parked.kernels)
                log.info("run_code lease %s resumes %d parked kernel(s)", lease.lease_id,
                         len(parked.kernels))
            lease.lost_state.update(self._lost.pop(key, {}))
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
        """Drop the lease: token revoked, its idle persistent kernels parked for the
        conversation's next lease, what is executing stopped.

        Call before an approval request becomes approvable (R-239). Returns False when
        there was no live lease. Waits for nothing: an in-flight execution is cut off by its
        kernel's shutdown (and that kernel's state is noted lost).
        """
        lease = self._leases.pop(LeaseKey(actor, conversation_id), None)
        if lease is None:
            return False
        await self._retire(lease, park=True)
        return True

    async def _retire(self, lease: KernelLease, *, park: bool = False,
                      reason: str = "released_mid_call") -> None:
        """Revoke ``lease``; park its idle persistent kernels (``park``) or stop them, noting
        ``reason`` for the state they held."""
        lease.released = True
        lease.active = None
        self._by_token.pop(lease.token_digest, None)
        busy = lease.current
        parked: dict[str, SandboxKernel] = {}
        stopped: list[SandboxKernel] = []
        lost: dict[str, str] = {}
        for language, kernel in lease.persistent.items():
            if park and kernel is not busy and not kernel.closed:
                parked[language] = kernel
            else:
                stopped.append(kernel)
                lost[language] = "released_mid_call" if kernel is busy else reason
        if busy is not None and busy not in lease.persistent.values():
            stopped.append(busy)
        lease.persistent.clear()
        for kernel in [*parked.values(), *stopped]:
            self.kernel_gone(kernel)
        if lost:
            self._note_lost(lease.key, lost)
        if parked:
            self._parked[lease.key] = ParkedKernels(parked)
            self._parked.move_to_end(lease.key)
            stopped += self._over_capacity()
        for kernel in stopped:
            with contextlib.suppress(Exception):
                await kernel.shutdown()

    def _note_lost(self, key: LeaseKey, lost: Mapping[str, str]) -> None:
        self._lost.setdefault(key, {}).update(lost)
        self._lost.move_to_end(key)
        while len(self._lost) > MAX_LOST_NOTES:
            self._lost.popitem(last=False)

    def _reclaim(self, key: LeaseKey, reason: str) -> list[SandboxKernel]:
        parked = self._parked.pop(key)
        self._note_lost(key, dict.fromkeys(parked.kernels, reason))
        log.info("reclaimed %d parked run_code kernel(s) (%s)", len(parked.kernels), reason)
        return list(parked.kernels.values())

    def _over_capacity(self) -> list[SandboxKernel]:
        """The oldest parked kernels beyond ``max_parked``, taken out (to be shut down)."""
        out: list[SandboxKernel] = []
        while self._parked and self.parked_count() > self.max_parked:
            out += self._reclaim(next(iter(self._parked)), "reclaimed_capacity")
        return out

    async def reap_idle(self, now: float | None = None) -> int:
        """Retire leases idle past the timeout, and reclaim kernels parked longer than it;
        returns how many leases and parked sets went."""
        moment = now if now is not None else time.monotonic()
        stale = [lease for lease in self._leases.values() if self.is_expired(lease, moment)]
        for lease in stale:
            self._leases.pop(lease.key, None)
            await self._retire(lease, reason="reclaimed_idle")
        old = [key for key, parked in self._parked.items()
               if moment - parked.parked_at > self.idle_timeout_s]
        kernels = [kernel for key in old for kernel in self._reclaim(key, "reclaimed_idle")]
        for kernel in kernels:
            with contextlib.suppress(Exception):
                await kernel.shutdown()
        return len(stale) + len(old)

    async def close(self) -> None:
        leases = list(self._leases.values())
        self._leases.clear()
        for lease in leases:
            await self._retire(lease)
        parked = [k for entry in self._parked.values() for k in entry.kernels.values()]
        self._parked.clear()
        for kernel in parked:
            with contextlib.suppress(Exception):
                await kernel.shutdown()

    def __len__(self) -> int:
        return len(self._leases)

    def parked(self, actor: str, conversation_id: str) -> Mapping[str, SandboxKernel]:
        entry = self._parked.get(LeaseKey(actor, conversation_id))
        return dict(entry.kernels) if entry is not None else {}

    def parked_count(self) -> int:
        """Kernels parked for a conversation's next lease (the ``parked`` gauge)."""
        return sum(len(entry.kernels) for entry in self._parked.values())

    def kernel_count(self) -> int:
        """Kernels held by live leases: persistent ones, plus an ephemeral one mid-call
        (the ``kaizen_run_code_kernels`` gauge)."""
        return sum(len(lease.persistent) + (lease.current is not None
                                            and lease.current not in lease.persistent.values())
                   for lease in self._leases.values())
