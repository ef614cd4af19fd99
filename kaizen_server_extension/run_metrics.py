"""Run metrics and the run-settled log line: what an operator watches besides the tools.

Exported through Jupyter's ``/metrics`` with the tool-run counter (tools/metrics.py):

* ``kaizen_runs_settled_total{status}`` and ``kaizen_run_duration_seconds{status}`` (from
  admission, or resumption after a takeover, to the terminal), counted by the process that
  settled the run, from the journal events it appended;
* ``kaizen_runs_open{status}``: runs queued, running or awaiting approval over the whole
  database (every replica reports the same figure; ``queued`` is the queue depth), sampled
  every ``KAIZEN_METRICS_INTERVAL_SECONDS``;
* ``kaizen_run_code_kernels{state}`` (``warm`` in the pool, ``leased`` to a member's
  run_code lease, ``parked`` for a conversation waiting on an approval) and
  ``kaizen_run_code_leases``, read from this process's kernels.

A run that settles is logged once, at WARNING when it failed, with its run and conversation
ids and reason code: the line an operator starts from for a failed run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from kaizen_server_extension.store import Store
from kaizen_server_extension.store.health import OPEN_RUN_STATUSES, open_run_counts
from kaizen_server_extension.store.records import EventRecord

log = logging.getLogger("kaizen.runs")

DURATION_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
#: Start times kept for runs this process admitted; a run settled elsewhere (cancelled
#: through another replica) never comes back for its entry, so the oldest are dropped.
MAX_TRACKED_RUNS = 4096
_STARTS = ("run.admitted", "run.resumed")


class RunMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else REGISTRY
        self.settled = Counter("kaizen_runs_settled", "Runs settled by this process, by "
                               "terminal status.", ("status",), registry=reg)
        self.duration = Histogram("kaizen_run_duration_seconds", "Seconds from a run's "
                                  "admission (or resumption) to its terminal, by status.",
                                  ("status",), buckets=DURATION_BUCKETS, registry=reg)
        self.open_runs = Gauge("kaizen_runs_open", "Runs not yet settled over the whole "
                               "database, by status (queued is the queue depth).",
                               ("status",), registry=reg)
        self.kernels = Gauge("kaizen_run_code_kernels", "run_code kernels of this process: "
                             "warm in the pool, leased to a member's conversation, or parked "
                             "for a conversation waiting on an approval.",
                             ("state",), registry=reg)
        self.leases = Gauge("kaizen_run_code_leases", "Live run_code leases (a member's "
                            "workspace and persistent kernels in one conversation).",
                            registry=reg)
        for status in OPEN_RUN_STATUSES:
            self.open_runs.labels(status=status).set(0)
        for state in ("warm", "leased", "parked"):
            self.kernels.labels(state=state).set(0)
        self._started: OrderedDict[str, datetime] = OrderedDict()
        self._sampler: asyncio.Task[None] | None = None

    # --- the journal, as this process appends it -----------------------------------------

    def on_appended(self, events: Sequence[EventRecord]) -> None:
        """A store listener: called with every batch this process committed. Never raises
        (a metric must not fail a write's publication)."""
        for event in events:
            try:
                if event.type in _STARTS and event.run_id:
                    self._track(event.run_id, event.at)
                elif event.type == "run.terminal" and event.run_id:
                    self._settled(event)
            except Exception:
                log.debug("run metric not recorded", exc_info=True)

    def _track(self, run_id: str, at: datetime) -> None:
        self._started[run_id] = at
        self._started.move_to_end(run_id)
        while len(self._started) > MAX_TRACKED_RUNS:
            self._started.popitem(last=False)

    def _settled(self, event: EventRecord) -> None:
        assert event.run_id is not None
        status = str(event.data.get("status", "unknown"))
        reason = event.data.get("reason")
        started = self._started.pop(event.run_id, None)
        seconds = (event.at - started).total_seconds() if started else None
        self.settled.labels(status=status).inc()
        if seconds is not None:
            self.duration.labels(status=status).observe(max(0.0, seconds))
        level = logging.WARNING if status == "failed" else logging.INFO
        log.log(level, "run settled: status=%s reason=%s duration_s=%s", status, reason,
                f"{seconds:.2f}" if seconds is not None else "unknown",
                extra={"run_id": event.run_id, "conversation_id": event.conversation_id})

    # --- gauges -------------------------------------------------------------------------

    def attach_run_code(self, service: Any) -> None:
        """Read the kernel gauges from this process's run_code service when scraped."""
        self.kernels.labels(state="warm").set_function(
            lambda: float(service.pool.warm_count("python")))
        self.kernels.labels(state="leased").set_function(
            lambda: float(service.leases.kernel_count()))
        self.kernels.labels(state="parked").set_function(
            lambda: float(service.leases.parked_count()))
        self.leases.set_function(lambda: float(len(service.leases)))

    async def sample_open_runs(self, store: Store) -> None:
        counts = await store.run(open_run_counts(), write=False)
        for status, n in counts.items():
            self.open_runs.labels(status=status).set(n)

    def start_sampler(self, store: Store, interval_s: float) -> None:
        async def loop() -> None:
            while True:
                try:
                    await self.sample_open_runs(store)
                except Exception:
                    log.warning("could not sample the open runs for /metrics", exc_info=True)
                await asyncio.sleep(interval_s)

        self._sampler = asyncio.create_task(loop(), name="kaizen-run-metrics")

    async def stop_sampler(self) -> None:
        task, self._sampler = self._sampler, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


_default: RunMetrics | None = None


def default_run_metrics() -> RunMetrics:
    """The process-wide instance on the global registry (what ``/metrics`` serves)."""
    global _default
    if _default is None:
        _default = RunMetrics()
    return _default
