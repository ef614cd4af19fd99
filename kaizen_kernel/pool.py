"""A pre-warmed pool of sandbox kernels.

Kernels are started ahead of demand (prelude installed, not yet bound to any lease) so an
ephemeral run_code call does not pay a kernel start. A kernel handed out is never returned:
ephemeral calls discard it after one execution (fresh state per call), persistent leases keep
it. The pool refills itself in the background.

When the bubblewrap jail is active a kernel's writable workspace is fixed at launch, so warm
kernels are keyed by workspace too: the first call of a conversation starts one cold and the
pool keeps one warm for that workspace afterwards (bounded by ``max_keyed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

from kaizen_kernel.kernel import KernelLaunchConfig, SandboxKernel
from kaizen_kernel.provisioner import find_bwrap

log = logging.getLogger(__name__)

# Kernelspec languages that serve each run_code language.
# "node" is JavaScript: a TypeScript kernel would type-check the model's JavaScript (and the
# prelude) as TypeScript and refuse plain code. kaizen-javascript: kaizen_kernel.node_kernel.
_SPEC_LANGUAGES = {"python": ("python",), "node": ("javascript",)}
_PREFERRED_SPECS = {"python": ("python3",),
                    "node": ("kaizen-javascript", "javascript", "jslab")}


class LanguageUnavailable(LookupError):
    def __init__(self, language: str) -> None:
        super().__init__(f"language unavailable: no {language} kernel is installed on this "
                         "server")
        self.language = language


def find_kernel_name(language: str, ksm: KernelSpecManager | None = None) -> str | None:
    """The installed kernelspec serving ``language`` (preferred names first)."""
    manager = ksm or KernelSpecManager()
    wanted = _SPEC_LANGUAGES.get(language)
    if wanted is None:
        return None
    for name in _PREFERRED_SPECS.get(language, ()):
        try:
            spec = manager.get_kernel_spec(name)
        except NoSuchKernel:
            continue
        if (spec.language or "").lower() in wanted:
            return name
    for name in sorted(manager.find_kernel_specs()):
        try:
            spec = manager.get_kernel_spec(name)
        except NoSuchKernel:
            continue
        if (spec.language or "").lower() in wanted:
            return name
    return None


PoolKey = tuple[str, str | None]  # (language, workspace when jailed)


class KernelPool:
    def __init__(self, config: KernelLaunchConfig, *, sizes: Mapping[str, int] | None = None,
                 kernel_names: Mapping[str, str] | None = None, max_keyed: int = 4) -> None:
        self.config = config
        self.sizes = dict(sizes or {"python": 1})
        self.max_keyed = max_keyed
        self._names: dict[str, str | None] = dict(kernel_names or {})
        self._warm: dict[PoolKey, list[SandboxKernel]] = {}
        self._starting: dict[PoolKey, int] = {}
        self._keyed: OrderedDict[PoolKey, None] = OrderedDict()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self.jailed = config.jail == "required" or (config.jail == "auto"
                                                     and find_bwrap() is not None)

    # --- languages ----------------------------------------------------------------------

    def kernel_name(self, language: str) -> str:
        if language not in self._names:
            self._names[language] = find_kernel_name(language)
        name = self._names[language]
        if name is None:
            raise LanguageUnavailable(language)
        return name

    def available(self, language: str) -> bool:
        try:
            self.kernel_name(language)
        except LanguageUnavailable:
            return False
        return True

    # --- warm kernels ---------------------------------------------------------------------

    def _key(self, language: str, workspace: Path | None) -> PoolKey:
        # Only a Python kernel outside a jail can move into its workspace after launch.
        fixed = self.jailed or language != "python"
        return (language, str(workspace) if fixed and workspace is not None else None)

    def _target(self, key: PoolKey) -> int:
        if key[1] is None:
            return self.sizes.get(key[0], 0)
        return 1 if key in self._keyed else 0

    def _spawn(self, key: PoolKey) -> None:
        if self._closed:
            return
        self._starting[key] = self._starting.get(key, 0) + 1
        task = asyncio.create_task(self._start_warm(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start_warm(self, key: PoolKey) -> None:
        try:
            kernel = await self.new_kernel(key[0], Path(key[1]) if key[1] else None)
        except Exception:
            log.warning("pre-warming a %s kernel failed", key[0], exc_info=True)
            return
        finally:
            self._starting[key] -= 1
        if self._closed:
            await kernel.shutdown()
            return
        self._warm.setdefault(key, []).append(kernel)

    def refill(self, key: PoolKey) -> None:
        have = len(self._warm.get(key, ())) + self._starting.get(key, 0)
        for _ in range(self._target(key) - have):
            self._spawn(key)

    async def start(self) -> None:
        """Begin warming the configured sizes (returns at once)."""
        for language in self.sizes:
            if self.available(language):
                self.refill((language, None))

    async def wait_warm(self, seconds: float = 60.0) -> None:
        """Wait until the background starts in flight have finished (tests, benchmarks)."""
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=seconds)

    async def new_kernel(self, language: str, workspace: Path | None) -> SandboxKernel:
        kernel = SandboxKernel(kernel_name=self.kernel_name(language), language=language,
                               config=self.config, workspace=workspace)
        await kernel.start()
        return kernel

    async def acquire(self, language: str, workspace: Path | None = None) -> SandboxKernel:
        """A ready kernel (warm if one is, else started now). Raises LanguageUnavailable."""
        self.kernel_name(language)
        key = self._key(language, workspace)
        if key[1] is not None:
            self._keyed[key] = None
            self._keyed.move_to_end(key)
            while len(self._keyed) > self.max_keyed:
                old, _ = self._keyed.popitem(last=False)
                for stale in self._warm.pop(old, []):
                    self.discard(stale)
        warm = self._warm.get(key, [])
        kernel: SandboxKernel | None = None
        while warm and kernel is None:
            candidate = warm.pop(0)
            if await candidate.is_alive():
                kernel = candidate
            else:
                self.discard(candidate)
        self.refill(key)
        if kernel is None:
            kernel = await self.new_kernel(language, Path(key[1]) if key[1] else workspace)
        return kernel

    def discard(self, kernel: SandboxKernel) -> None:
        """Shut ``kernel`` down in the background."""
        task = asyncio.create_task(kernel.shutdown())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(task), timeout=30)
        for kernels in self._warm.values():
            for kernel in kernels:
                await kernel.shutdown()
        self._warm.clear()

    def warm_count(self, language: str = "python") -> int:
        return len(self._warm.get((language, None), ()))
