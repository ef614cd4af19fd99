"""Spec settings: names, defaults and bounds; an out-of-bounds value stops start-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kaizen_server_extension.settings import (
    LIBRARY_SURFACE,
    MAX_CORRECTION_PATTERN_CHARS,
    MAX_CORRECTION_RULES,
    KaizenSettings,
    SettingsError,
    withheld_surfaces,
)
from kaizen_server_extension.store.engine import sqlite_url_for
from tests.support.server import start_server


def test_defaults_follow_the_spec() -> None:
    settings = KaizenSettings.from_environ({})
    assert settings.AGENT_LOOP_MAX_CYCLES == 10
    assert settings.AGENT_LOOP_BUDGET_MS == 120_000
    assert settings.AGENT_LOOP_MAX_PARALLEL_TOOLS == 1
    assert settings.LLM_PER_USER_DAILY_TOKENS == 0
    assert settings.SANDBOX_MAX_WALL_SECONDS == 30
    assert settings.SANDBOX_MAX_OUTPUT_BYTES == 1024 * 1024
    assert settings.AGENT_STREAM_CORRECTION_MAX_ATTEMPTS == 1
    assert settings.AGENT_STREAM_CORRECTION_RULES == ()
    assert settings.AGENT_TOOL_DISCOVERY_ENABLED is False
    assert settings.KAIZEN_LIBRARY_ENABLED is True  # on: nothing changes for existing users


@pytest.mark.rule("R-140")
@pytest.mark.parametrize("value, enabled", [("0", False), ("false", False), ("off", False),
                                            ("1", True), ("true", True), ("on", True)])
def test_the_library_flag_reads_the_usual_boolean_spellings(value: str, enabled: bool) -> None:
    settings = KaizenSettings.from_environ({"KAIZEN_LIBRARY_ENABLED": value})
    assert settings.KAIZEN_LIBRARY_ENABLED is enabled
    withheld = withheld_surfaces(library_enabled=settings.KAIZEN_LIBRARY_ENABLED)
    assert (LIBRARY_SURFACE in withheld) is not enabled


def test_an_unreadable_library_flag_names_the_setting() -> None:
    with pytest.raises(SettingsError, match="KAIZEN_LIBRARY_ENABLED"):
        KaizenSettings.from_environ({"KAIZEN_LIBRARY_ENABLED": "sometimes"})


@pytest.mark.rule("R-017")
@pytest.mark.parametrize("value, ok", [("0", True), ("3", True), ("4", False), ("-1", False)])
def test_correction_attempts_are_capped_at_three(value: str, ok: bool) -> None:
    environ = {"AGENT_STREAM_CORRECTION_MAX_ATTEMPTS": value}
    if ok:
        assert KaizenSettings.from_environ(environ).AGENT_STREAM_CORRECTION_MAX_ATTEMPTS == int(
            value)
    else:
        with pytest.raises(SettingsError, match="AGENT_STREAM_CORRECTION_MAX_ATTEMPTS"):
            KaizenSettings.from_environ(environ)


@pytest.mark.rule("R-018")
@pytest.mark.parametrize("rules", [
    [{"id": "r", "pattern": "x" * (MAX_CORRECTION_PATTERN_CHARS + 1), "reminder": "no"}],
    [{"id": f"r{i}", "pattern": "p", "reminder": "r"} for i in range(MAX_CORRECTION_RULES + 1)],
    [{"id": "has space", "pattern": "p", "reminder": "r"}],
    [{"id": "r", "pattern": "", "reminder": "r"}],
    [{"id": "r", "pattern": "p", "reminder": "r", "regex": True}],
    [{"id": "r", "pattern": "p", "reminder": "r"}, {"id": "r", "pattern": "q", "reminder": "s"}],
])
def test_out_of_bounds_correction_rules_are_rejected(rules: list[dict[str, object]]) -> None:
    with pytest.raises(SettingsError, match="AGENT_STREAM_CORRECTION_RULES"):
        KaizenSettings.from_environ({"AGENT_STREAM_CORRECTION_RULES": json.dumps(rules)})


def test_correction_rules_must_be_json() -> None:
    with pytest.raises(SettingsError, match="AGENT_STREAM_CORRECTION_RULES"):
        KaizenSettings.from_environ({"AGENT_STREAM_CORRECTION_RULES": "[{"})


def test_valid_correction_rules_reach_the_run_manifest_types() -> None:
    raw = [{"id": "no-apology", "pattern": "As an AI", "reminder": "Answer directly."}]
    settings = KaizenSettings.from_environ({"AGENT_STREAM_CORRECTION_RULES": json.dumps(raw)})
    (rule,) = settings.correction_rules()
    assert (rule.id, rule.pattern, rule.reminder) == ("no-apology", "As an AI",
                                                       "Answer directly.")


@pytest.mark.parametrize("name, value", [
    ("AGENT_LOOP_MAX_CYCLES", "0"),
    ("AGENT_LOOP_MAX_PARALLEL_TOOLS", "many"),
    ("LLM_PER_USER_DAILY_TOKENS", "-5"),
    ("SANDBOX_MAX_WALL_SECONDS", "241"),
])
def test_out_of_bounds_values_name_the_setting(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        KaizenSettings.from_environ({name: value})


@pytest.mark.parametrize("name, value", [
    ("KAIZEN_KERNEL_IDLE_SECONDS", "0"),
    ("KAIZEN_KERNEL_IDLE_SECONDS", "inf"),
    ("KAIZEN_MAX_MESSAGE_BYTES", "0"),
    ("KAIZEN_KERNEL_POOL_SIZE", "-1"),
    ("KAIZEN_KERNEL_CONSOLE", "maybe"),
    ("KAIZEN_RUN_LEASE_SECONDS", "soon"),
    ("KAIZEN_GATEWAY_TRANSFER_MAX_FILE_BYTES", "0"),
    ("KAIZEN_DATABASE_SCHEMA", "kaizen; drop table runs"),
    ("KAIZEN_KERNEL_MAX_PARKED", "-1"),
    ("KAIZEN_KERNEL_MAX_PARKED", "257"),
    ("KAIZEN_RUN_CODE_KERNELSPEC", "../../bin/python"),
])
def test_kaizens_own_settings_are_bounded_too(name: str, value: str) -> None:
    """No setting falls back silently to its default when it cannot be read."""
    with pytest.raises(SettingsError, match=name):
        KaizenSettings.from_environ({name: value})


def test_lists_are_comma_separated_and_an_empty_number_means_the_default() -> None:
    settings = KaizenSettings.from_environ({
        "KAIZEN_ADMIN_MEMBERS": " alice, bob ,,", "KAIZEN_PLUGINS": "a.b,c",
        "KAIZEN_KERNEL_POOL_SIZE": "", "KAIZEN_SANDBOX_JAIL": " Off "})
    assert settings.KAIZEN_ADMIN_MEMBERS == frozenset({"alice", "bob"})
    assert settings.KAIZEN_PLUGINS == ("a.b", "c")
    assert settings.KAIZEN_KERNEL_POOL_SIZE == 1
    assert settings.KAIZEN_SANDBOX_JAIL == "off"


def test_a_config_value_is_validated_like_the_environment_and_named_as_both() -> None:
    base = KaizenSettings.from_environ({"KAIZEN_KERNEL_IDLE_SECONDS": "60"})
    assert base.with_overrides({"KAIZEN_KERNEL_IDLE_SECONDS": 120}).KAIZEN_KERNEL_IDLE_SECONDS \
        == 120
    with pytest.raises(SettingsError, match=r"KAIZEN_KERNEL_IDLE_SECONDS "
                                            r"\(c\.KaizenApp\.kernel_idle_seconds\)"):
        base.with_overrides({"KAIZEN_KERNEL_IDLE_SECONDS": -1})


def _refused_start_up_log(tmp_path: Path, env: dict[str, str],
                          args: tuple[str, ...] = ()) -> str:
    """Start a server with ``env`` (and ``args``); it must exit non-zero. Its log."""
    server = start_server(tmp_path, sqlite_url_for(tmp_path / "k.db"), extra_env=env,
                          wait=False, extra_args=args)
    try:
        code = server.process.wait(60)
    finally:
        server.stop()
    assert code != 0
    return server.log()


def test_server_refuses_to_start_with_an_out_of_bounds_setting(tmp_path: Path) -> None:
    log = _refused_start_up_log(tmp_path, {"AGENT_LOOP_MAX_CYCLES": "100000"})
    assert "AGENT_LOOP_MAX_CYCLES" in log


def test_server_refuses_an_unreadable_library_flag(tmp_path: Path) -> None:
    log = _refused_start_up_log(tmp_path, {"KAIZEN_LIBRARY_ENABLED": "sometimes"})
    assert "Invalid setting KAIZEN_LIBRARY_ENABLED" in log


def test_server_refuses_a_bad_value_from_jupyter_config(tmp_path: Path) -> None:
    log = _refused_start_up_log(tmp_path, {}, ("--KaizenApp.max_message_bytes=0",))
    assert "Invalid setting KAIZEN_MAX_MESSAGE_BYTES (c.KaizenApp.max_message_bytes)" in log


def test_server_refuses_an_unknown_sandbox_jail_mode(tmp_path: Path) -> None:
    log = _refused_start_up_log(tmp_path, {"KAIZEN_SANDBOX_JAIL": "sometimes"})
    assert "Invalid setting KAIZEN_SANDBOX_JAIL" in log


def test_a_required_jail_without_bubblewrap_stops_start_up(tmp_path: Path) -> None:
    # A PATH with only the interpreter's bin: bwrap cannot be found, whatever is installed.
    log = _refused_start_up_log(tmp_path, {"KAIZEN_SANDBOX_JAIL": "required",
                                           "PATH": str(Path(sys.executable).parent)})
    assert "'required' but bubblewrap (bwrap) is not installed" in log


def test_extension_is_listed_by_jupyter() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "jupyter_server.extension.serverextension", "list"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    listing = result.stdout + result.stderr
    assert "kaizen_server_extension" in listing and "enabled" in listing


def test_migrations_run_from_the_command_line(tmp_path: Path) -> None:
    database = tmp_path / "cli.db"
    result = subprocess.run(
        [sys.executable, "-m", "kaizen_server_extension.store.cli", "upgrade",
         "--url", sqlite_url_for(database)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    import sqlite3

    with sqlite3.connect(database) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"members", "agents", "agent_versions", "conversations", "participants", "journal",
            "accepted_inputs", "runs", "audit_events", "alembic_version"} <= tables


@pytest.mark.rule("R-378")
def test_external_openapi_sources_default_off_and_their_egress_is_validated() -> None:
    from kaizen_server_extension.settings import OPENAPI_SOURCES_SURFACE, withheld_surfaces

    defaults = KaizenSettings.from_environ({})
    assert defaults.KAIZEN_OPENAPI_SOURCES_ENABLED is False
    assert defaults.KAIZEN_OPENAPI_CROSS_ORIGIN_ENABLED is False
    assert defaults.KAIZEN_OPENAPI_EGRESS_PORTS == (443,)
    assert OPENAPI_SOURCES_SURFACE in withheld_surfaces(library_enabled=True)
    read = KaizenSettings.from_environ({"KAIZEN_OPENAPI_EGRESS_NETWORKS": "127.0.0.1/32, ::1/128",
                                        "KAIZEN_OPENAPI_EGRESS_PORTS": "443,8443"})
    assert read.KAIZEN_OPENAPI_EGRESS_NETWORKS == ("127.0.0.1/32", "::1/128")
    assert read.KAIZEN_OPENAPI_EGRESS_PORTS == (443, 8443)
    for name, value in (("KAIZEN_OPENAPI_EGRESS_NETWORKS", "10.0.0.1/8"),
                        ("KAIZEN_OPENAPI_EGRESS_NETWORKS", "example.com"),
                        ("KAIZEN_OPENAPI_EGRESS_PORTS", "0"),
                        ("KAIZEN_OPENAPI_EGRESS_PORTS", "70000"),
                        ("KAIZEN_OPENAPI_SCHEMA_FRESH_SECONDS", "-1"),
                        ("KAIZEN_OPENAPI_TIMEOUT_SECONDS", "1000")):
        with pytest.raises(SettingsError, match=name):
            KaizenSettings.from_environ({name: value})
