"""A development hook: cProfile of the server's event loop thread, on demand.

With ``KAIZEN_PROFILE=PATH`` the server profiles its event loop's thread from SIGUSR1 to
SIGUSR2 and writes the profile to ``PATH`` (``python -m pstats PATH``); each SIGUSR1 starts
afresh. The timer is the thread's own CPU time, so what the profile shows does not move
with the load of the machine (bench/e2e_overhead.py ``--cprofile``). Off by default: with
the setting empty nothing is installed.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import json
import logging
import signal
import time
from typing import Any

log = logging.getLogger("kaizen")


class LoopProfiler:
    """Starts and stops one cProfile of the thread the loop runs on."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._profile: cProfile.Profile | None = None
        # Garbage collections while profiling, by generation: [count, seconds].
        self._gc: dict[int, list[float]] = {}
        self._gc_started = 0.0

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        entry = self._gc.setdefault(int(info["generation"]), [0, 0.0])
        entry[0] += 1
        entry[1] += time.perf_counter() - self._gc_started

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_signal_handler(signal.SIGUSR1, self.start)
        loop.add_signal_handler(signal.SIGUSR2, self.stop)
        log.warning("Kaizen profiling hook installed (KAIZEN_PROFILE=%s): SIGUSR1 starts, "
                    "SIGUSR2 writes", self.path)

    def start(self) -> None:
        if self._profile is not None:
            self._profile.disable()
        self._profile = cProfile.Profile(time.thread_time)
        self._gc = {}
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)
        self._profile.enable()

    def stop(self) -> None:
        if self._profile is None:
            return
        self._profile.disable()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        # The collections beside the profile: their time shows in whichever function
        # happened to allocate when one started.
        with open(self.path + ".gc.json", "w", encoding="utf-8") as out:
            json.dump({str(g): {"collections": int(c), "seconds": round(t, 4)}
                       for g, (c, t) in sorted(self._gc.items())}, out)
        self._profile.dump_stats(self.path)
        self._profile = None
        log.warning("Kaizen profile written to %s", self.path)
