"""What an operator sees: probes, /metrics, and log lines that carry run and conversation ids."""

from __future__ import annotations

import io
import json
import logging
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from kaizen_server_extension.api.openapi import openapi_document
from kaizen_server_extension.health import migration_state, readiness
from kaizen_server_extension.logs import (
    ContextFilter,
    JsonFormatter,
    TextFormatter,
    log_context,
)
from kaizen_server_extension.run_metrics import RunMetrics
from kaizen_server_extension.store import Store, create_engine
from kaizen_server_extension.store.health import migration_revisions, open_run_counts
from kaizen_server_extension.store.records import EventRecord
from tests.conftest import scripted_server
from tests.support.server import SERVER_TOKEN, ServerProcess, json_of

# --- log lines ----------------------------------------------------------------------------


def _logger(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    handler.addFilter(ContextFilter())
    logger = logging.getLogger(f"kaizen.test.{id(out)}")
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, out


def test_json_lines_carry_the_ids_of_the_run_they_belong_to() -> None:
    logger, out = _logger(JsonFormatter())
    with log_context(conversation_id="c1"):
        with log_context(run_id="r1"):
            logger.warning("tool call failed: tool=%s", "run_code")
        logger.info("between runs")
    logger.info("outside")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0] == {**lines[0], "level": "warning", "message": "tool call failed: "
                        "tool=run_code", "run_id": "r1", "conversation_id": "c1"}
    assert lines[1]["conversation_id"] == "c1" and "run_id" not in lines[1]
    assert "conversation_id" not in lines[2] and "run_id" not in lines[2]
    datetime.fromisoformat(lines[0]["ts"])


def test_an_explicit_id_wins_over_the_context() -> None:
    logger, out = _logger(JsonFormatter())
    with log_context(run_id="ambient"):
        logger.info("settled", extra={"run_id": "r9", "conversation_id": "c9"})
    line = json.loads(out.getvalue())
    assert (line["run_id"], line["conversation_id"]) == ("r9", "c9")


def test_text_lines_append_the_ids_after_the_first_line() -> None:
    logger, out = _logger(TextFormatter(color=False))
    with log_context(conversation_id="c1", run_id="r1"):
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("run failed outside the controller")
    first, *rest = out.getvalue().splitlines()
    assert first.endswith("run failed outside the controller [run=r1 conversation=c1]")
    assert any("RuntimeError: boom" in line for line in rest)


# --- run metrics and the run-settled line --------------------------------------------------


def _event(kind: str, run_id: str, at: datetime, **data: Any) -> EventRecord:
    return EventRecord("conv-1", 1, run_id, kind, "kaizen", at, data)


def test_a_settled_run_is_counted_timed_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    metrics = RunMetrics(registry)
    start = datetime.now(UTC)
    caplog.set_level(logging.INFO, logger="kaizen.runs")
    metrics.on_appended([_event("run.admitted", "run-1", start)])
    metrics.on_appended([_event("run.terminal", "run-1", start + timedelta(seconds=3),
                                status="failed", reason="model_error")])
    assert registry.get_sample_value("kaizen_runs_settled_total", {"status": "failed"}) == 1
    assert registry.get_sample_value("kaizen_run_duration_seconds_count",
                                     {"status": "failed"}) == 1
    assert registry.get_sample_value("kaizen_run_duration_seconds_sum",
                                     {"status": "failed"}) == pytest.approx(3.0)
    [record] = [r for r in caplog.records if r.name == "kaizen.runs"]
    assert record.levelno == logging.WARNING
    assert (record.run_id, record.conversation_id) == ("run-1", "conv-1")  # type: ignore[attr-defined]
    assert "status=failed reason=model_error duration_s=3.00" in record.getMessage()


def test_a_run_settled_here_but_admitted_elsewhere_is_counted_untimed() -> None:
    registry = CollectorRegistry()
    metrics = RunMetrics(registry)
    metrics.on_appended([_event("run.terminal", "run-2", datetime.now(UTC),
                                status="cancelled", reason="cancelled")])
    assert registry.get_sample_value("kaizen_runs_settled_total", {"status": "cancelled"}) == 1
    assert registry.get_sample_value("kaizen_run_duration_seconds_count",
                                     {"status": "cancelled"}) is None


def test_a_broken_event_never_fails_the_publication() -> None:
    metrics = RunMetrics(CollectorRegistry())
    broken = EventRecord("c", 1, "r", "run.terminal", "kaizen", None, {})  # type: ignore[arg-type]
    metrics.on_appended([_event("run.admitted", "r", datetime.now(UTC)), broken])


async def test_open_runs_are_counted_over_the_database(store: Store) -> None:
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=())
    await store.members.ensure("alice")
    conversation = await store.conversations.create("alice", "general", "t", False)
    for text in ("one", "two"):
        await store.inputs.accept(conversation.id, "alice", text, kind="message",
                                  idempotency_key=None)
    assert await store.run(open_run_counts(), write=False) == {
        "queued": 2, "running": 0, "awaiting_approval": 0}
    registry = CollectorRegistry()
    await RunMetrics(registry).sample_open_runs(store)
    assert registry.get_sample_value("kaizen_runs_open", {"status": "queued"}) == 2
    assert registry.get_sample_value("kaizen_runs_open", {"status": "running"}) == 0


# --- readiness ------------------------------------------------------------------------------


def test_migration_states() -> None:
    heads, known = migration_revisions()
    [head] = heads
    older = next(iter(known - heads))
    assert migration_state(head) == "ok"
    assert migration_state(older) == "behind"
    assert migration_state("from_a_newer_release") == "unknown_revision"
    assert migration_state(None) == "missing"


async def test_ready_on_a_migrated_store(store: Store) -> None:
    state = await readiness(store)
    assert state.ready and state.checks == {"store": "ok", "migrations": "ok"}


async def test_not_ready_when_never_migrated(tmp_path: Path) -> None:
    store = Store(create_engine(f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"))
    try:
        state = await readiness(store)
    finally:
        await store.dispose()
    assert not state.ready and state.checks == {"store": "ok", "migrations": "missing"}


async def test_not_ready_when_the_store_is_unreachable() -> None:
    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    store = Store(create_engine("postgresql+asyncpg://kaizen@127.0.0.1:9/kaizen"))
    try:
        state = await readiness(store)
    finally:
        await store.dispose()
    assert not state.ready
    assert state.checks == {"store": "unreachable", "migrations": "unknown"}
    assert "127.0.0.1" not in json.dumps(state.public())


def test_probes_are_in_the_openapi_document_without_security() -> None:
    paths = openapi_document()["paths"]
    for path in ("/kaizen/api/health/live", "/kaizen/api/health/ready"):
        assert paths[path]["get"]["security"] == []
    assert set(paths["/kaizen/api/health/ready"]["get"]["responses"]) == {"200", "503"}


# --- a real server ----------------------------------------------------------------------------

SCRIPTS = [
    {"match": "please fail", "responses": [{"error": {"status": 400}}]},
    {"responses": [{"text": "Fine."}]},
]


def _settle(server: ServerProcess, text: str) -> tuple[str, str]:
    with server.client("alice") as api:
        conversation = json_of(api.post("conversations", json={"agent_id": "general"}))
        accepted = json_of(api.post(f"conversations/{conversation['id']}/messages",
                                    json={"text": text}))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            run = json_of(api.get(f"runs/{accepted['run_id']}"))
            if run["status"] in ("completed", "failed", "answer_unavailable", "cancelled"):
                return conversation["id"], accepted["run_id"]
            time.sleep(0.1)
    raise AssertionError("the run did not settle")


def _metric(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{wanted}}} ") or (not labels and
                                                      line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_real_server_probes_meters_and_logs_its_runs(backend: str, tmp_path: Path) -> None:
    with scripted_server(backend, tmp_path, SCRIPTS, extra_env={
            "KAIZEN_LOG_FORMAT": "json", "KAIZEN_METRICS_INTERVAL_SECONDS": "1"}) as server:
        live = httpx.get(server.base_url + "kaizen/api/health/live", timeout=10)
        assert live.status_code == 200 and live.json() == {"status": "live"}
        ready = httpx.get(server.base_url + "kaizen/api/health/ready", timeout=10)
        assert ready.status_code == 200, ready.text
        expected = {"store": "ok", "migrations": "ok"}
        if backend == "postgresql":
            expected["events"] = "ok"
        assert ready.json() == {"status": "ready", "checks": expected}

        conversation_id, failed_run = _settle(server, "please fail")
        _settle(server, "hello")
        # Jupyter's /metrics needs the server's token (ServerApp.authenticate_prometheus).
        assert httpx.get(server.base_url + "metrics", timeout=10).status_code == 403

        def scrape() -> str:
            return httpx.get(server.base_url + "metrics", timeout=10,
                             headers={"Authorization": f"token {SERVER_TOKEN}"}).text

        # The open-runs gauge is sampled (every second here): wait for a sample taken after
        # both runs settled rather than racing it.
        deadline = time.monotonic() + 30
        while (metrics := scrape()) and (
                _metric(metrics, "kaizen_runs_open", status="queued") != 0
                or _metric(metrics, "kaizen_runs_open", status="running") != 0
                or _metric(metrics, "kaizen_runs_settled_total", status="completed") != 1):
            assert time.monotonic() < deadline, metrics
            time.sleep(0.2)
        assert _metric(metrics, "kaizen_runs_settled_total", status="failed") == 1
        assert _metric(metrics, "kaizen_runs_settled_total", status="completed") == 1
        assert _metric(metrics, "kaizen_run_duration_seconds_count", status="completed") == 1
        assert _metric(metrics, "kaizen_runs_open", status="awaiting_approval") == 0
        assert _metric(metrics, "kaizen_run_code_kernels", state="leased") == 0
        assert _metric(metrics, "kaizen_run_code_leases") == 0
        log = server.log()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    settled = [line for line in lines if line["message"].startswith("run settled")]
    assert len(settled) == 2
    failed = next(line for line in settled if line["run_id"] == failed_run)
    assert failed["level"] == "warning" and failed["conversation_id"] == conversation_id
    assert "status=failed" in failed["message"]
    # Jupyter's own lines (the access log) are JSON too: one format for a log shipper.
    assert any(line["logger"] == "ServerApp" and "403 GET /metrics" in line["message"]
               for line in lines)


def test_readiness_fails_when_the_schema_is_not_this_releases(tmp_path: Path) -> None:
    with scripted_server("sqlite", tmp_path, SCRIPTS) as server:
        db = server.env["KAIZEN_DATABASE_URL"].split(":///", 1)[1]
        with sqlite3.connect(db) as conn:
            [head] = conn.execute("SELECT version_num FROM alembic_version").fetchone()
            conn.execute("UPDATE alembic_version SET version_num = 'from_a_newer_release'")
        ready = httpx.get(server.base_url + "kaizen/api/health/ready", timeout=10)
        assert ready.status_code == 503
        assert ready.json() == {"status": "not_ready", "checks": {
            "store": "ok", "migrations": "unknown_revision"}}
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE alembic_version SET version_num = ?", (head,))
        assert httpx.get(server.base_url + "kaizen/api/health/ready",
                         timeout=10).status_code == 200
