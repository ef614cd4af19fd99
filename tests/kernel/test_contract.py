"""run_code's contract and the pieces that need no kernel: schema, limits, environment,
bubblewrap command construction, file capture, leases."""

from __future__ import annotations

import os
import shutil
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest

from kaizen_kernel import files
from kaizen_kernel.leases import LeaseManager
from kaizen_kernel.limits import (
    DEFAULT_OUTPUT_BYTES,
    DEFAULT_WALL_SECONDS,
    ExecutionBudget,
    ProcessLimits,
    rlimit_wrapper_argv,
)
from kaizen_kernel.provisioner import (
    DEFAULT_ENV_ALLOWLIST,
    PROVISIONER_NAME,
    SandboxProvisioner,
    build_kernel_env,
    bwrap_argv,
)
from kaizen_kernel.schema import (
    INPUT_SCHEMA,
    RunCodeArgumentsError,
    parse_arguments,
)
from kaizen_server_extension.protocol.tools import Capability, WriteCategory
from kaizen_server_extension.settings import KaizenSettings, SettingsError

# --- schema -------------------------------------------------------------------------------


@pytest.mark.rule("R-235")
def test_artifact_targets_is_a_required_schema_field() -> None:
    assert "artifact_targets" in INPUT_SCHEMA["required"]
    with pytest.raises(RunCodeArgumentsError) as info:
        parse_arguments({"code": "print(1)"})
    assert info.value.code == "invalid_arguments"
    assert info.value.domain == "caller"
    assert "artifact_targets" in str(info.value)
    # The empty list is the explicit compute-only declaration, not a missing field.
    assert parse_arguments({"code": "1", "artifact_targets": []}).artifact_targets == ()


@pytest.mark.rule("R-170")
def test_ephemeral_is_the_default_and_persistent_is_opt_in() -> None:
    args = parse_arguments('{"code": "x = 1", "artifact_targets": []}')
    assert args.persistent is False and args.language == "python"
    assert parse_arguments({"code": "x", "artifact_targets": [],
                            "persistent": True}).persistent is True


@pytest.mark.parametrize("bad", ["/etc/passwd", "../escape.txt", "a/../../b", "a\\b", "~/x",
                                 "", "x" * 300, "a\x00b", "C:/x"])
def test_target_names_are_bounded_relative_paths(bad: str) -> None:
    with pytest.raises(RunCodeArgumentsError):
        parse_arguments({"code": "1", "artifact_targets": [bad]})


def test_duplicate_and_too_many_targets_are_refused() -> None:
    with pytest.raises(RunCodeArgumentsError):
        parse_arguments({"code": "1", "artifact_targets": ["a.txt", "./a.txt"]})
    with pytest.raises(RunCodeArgumentsError):
        parse_arguments({"code": "1", "artifact_targets": [f"f{i}" for i in range(40)]})
    with pytest.raises(RunCodeArgumentsError):
        parse_arguments({"code": "1", "artifact_targets": [], "extra": 1})


def test_descriptor_is_an_isolated_execution_write_granted_explicitly() -> None:
    from kaizen_plugins.code import run_code

    d = run_code.descriptor
    assert d.capability == Capability.WRITE
    assert d.write_category == WriteCategory.ISOLATED_EXECUTION
    assert d.explicit_grant_only
    # Running code again after the workspace changed is ordinary use (spec: Asking twice).
    assert not d.repeat_creates_object
    assert d.input_schema["required"] and "artifact_targets" in d.input_schema["required"]


# --- limits -------------------------------------------------------------------------------


@pytest.mark.rule("R-077", "R-078")
def test_budget_defaults_and_env_overrides() -> None:
    assert ExecutionBudget() == ExecutionBudget(DEFAULT_WALL_SECONDS, DEFAULT_OUTPUT_BYTES)
    assert (DEFAULT_WALL_SECONDS, DEFAULT_OUTPUT_BYTES) == (30, 1024 * 1024)
    settings = KaizenSettings.from_environ({})
    assert (settings.SANDBOX_MAX_WALL_SECONDS, settings.SANDBOX_MAX_OUTPUT_BYTES) == (
        DEFAULT_WALL_SECONDS, DEFAULT_OUTPUT_BYTES)
    tuned = KaizenSettings.from_environ({"SANDBOX_MAX_WALL_SECONDS": "5",
                                         "SANDBOX_MAX_OUTPUT_BYTES": "2048"})
    assert (tuned.SANDBOX_MAX_WALL_SECONDS, tuned.SANDBOX_MAX_OUTPUT_BYTES) == (5, 2048)
    # Junk is refused naming the setting; there is no silent fallback to the default.
    for name, junk in (("SANDBOX_MAX_WALL_SECONDS", "-1"), ("SANDBOX_MAX_OUTPUT_BYTES", "lots")):
        with pytest.raises(SettingsError, match=name):
            KaizenSettings.from_environ({name: junk})
    default = ExecutionBudget()
    # A call may ask for less, never more.
    assert default.clamp(999, 10**12) == default
    assert default.clamp(2, 100) == ExecutionBudget(2, 100)


def test_rlimit_wrapper_sets_limits_then_execs() -> None:
    argv = rlimit_wrapper_argv(ProcessLimits(max_open_files=77), ["/bin/true", "x"])
    assert argv[1:3] == ["-I", "-S"] and argv[-2:] == ["/bin/true", "x"]
    assert '"RLIMIT_NOFILE": 77' in argv[5] and '"RLIMIT_CORE": 0' in argv[5]


# --- environment and jail -------------------------------------------------------------------


def test_kernel_env_is_allowlisted_not_inherited() -> None:
    server_env = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "KAIZEN_MODEL_API_KEY": "sekrit",
                  "DATABASE_URL": "postgres://x", "HOME": "/root", "UNLISTED": "1"}
    env = build_kernel_env(server_env, allowlist=(*DEFAULT_ENV_ALLOWLIST, "DATABASE_URL"),
                           home="/h", workspace="/w")
    assert env["PATH"] == "/usr/bin" and env["LANG"] == "C.UTF-8"
    assert env["HOME"] == "/h" and env["KAIZEN_WORKSPACE"] == "/w"
    # Even a misconfigured allowlist cannot pass a secret-looking name.
    for name in ("KAIZEN_MODEL_API_KEY", "DATABASE_URL", "UNLISTED"):
        assert name not in env
    assert "sekrit" not in env.values()


def test_bwrap_command_binds_workspace_rw_and_shared_ro() -> None:
    argv = bwrap_argv(["python", "-m", "ipykernel_launcher", "-f", "/run/k.json"],
                      bwrap="/usr/bin/bwrap", workspace="/ws/a/b", home="/homes/k1",
                      shared_dir="/shared/turn", ro_paths=["/venv", "/run/k.json"],
                      chdir="/ws/a/b")
    pairs = {(argv[i], argv[i + 1], argv[i + 2]) for i in range(len(argv) - 2)}
    assert ("--bind", "/ws/a/b", "/ws/a/b") in pairs
    assert ("--bind", "/homes/k1", "/homes/k1") in pairs
    assert ("--ro-bind", "/shared/turn", "/shared/turn") in pairs
    assert ("--ro-bind", "/run/k.json", "/run/k.json") in pairs
    assert ("--ro-bind", "/venv", "/venv") in pairs
    assert argv[argv.index("--chdir") + 1] == "/ws/a/b"
    assert "--die-with-parent" in argv and "--unshare-pid" in argv
    assert "--unshare-net" not in argv  # zmq ports and the bridge are on loopback
    sep = argv.index("--")
    assert argv[sep + 1:] == ["python", "-m", "ipykernel_launcher", "-f", "/run/k.json"]
    # The shared directory is never writable.
    assert ("--bind", "/shared/turn", "/shared/turn") not in pairs


def test_provisioner_builds_jailed_launch_when_bwrap_present(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Command construction of the jail path, whether or not bwrap is installed."""
    import kaizen_kernel.provisioner as prov

    monkeypatch.setattr(prov, "find_bwrap", lambda: "/opt/fake/bwrap")
    p = SandboxProvisioner(kernel_id="k1", workspace=str(tmp_path / "ws"),
                           home_dir=str(tmp_path / "home"), shared_dir=str(tmp_path),
                           process_limits={"max_open_files": 99}, jail="auto")
    launch = p.build_launch(["python", "-m", "ipykernel_launcher"], str(tmp_path / "c.json"))
    cmd = launch["cmd"]
    assert p.jailed and "/opt/fake/bwrap" in cmd
    assert cmd.index("/opt/fake/bwrap") > cmd.index("-c")  # rlimits wrap the jail
    assert '"RLIMIT_NOFILE": 99' in cmd[5]
    assert launch["cwd"] == str((tmp_path / "ws").resolve())
    assert "KAIZEN_MODEL_API_KEY" not in launch["env"]
    monkeypatch.setattr(prov, "find_bwrap", lambda: None)
    with pytest.raises(prov.SandboxUnavailable):
        SandboxProvisioner(kernel_id="k2", home_dir=str(tmp_path / "h2"),
                           jail="required").build_launch(["x"], None)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_bwrap_jail_runs_a_command(tmp_path: Path) -> None:  # pragma: no cover - needs bwrap
    import subprocess

    ws = tmp_path / "ws"
    ws.mkdir()
    argv = bwrap_argv(["/bin/sh", "-c", "pwd; echo hi > out.txt; ls /root 2>&1 || true"],
                      bwrap=shutil.which("bwrap") or "bwrap", workspace=str(ws),
                      home=str(tmp_path), shared_dir=None, chdir=str(ws))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert (ws / "out.txt").read_text() == "hi\n"


def test_provisioner_entry_point_resolves() -> None:
    ep = EntryPoint(name=PROVISIONER_NAME, value="kaizen_kernel.provisioner:SandboxProvisioner",
                    group="jupyter_client.kernel_provisioners")
    assert ep.load() is SandboxProvisioner
    installed = entry_points(group="jupyter_client.kernel_provisioners", name=PROVISIONER_NAME)
    for found in installed:  # present once pyproject declares it
        assert found.load() is SandboxProvisioner


# --- file capture ---------------------------------------------------------------------------


def test_capture_hashes_and_refuses_symlinks_and_oversize(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    (ws / "out" / "r.csv").write_text("a,b\n1,2\n")
    (ws / "big.bin").write_bytes(b"\0" * 2048)
    outside = tmp_path / "secret.txt"
    outside.write_text("server secret")
    os.symlink(outside, ws / "escape.txt")
    os.symlink(ws / "out" / "r.csv", ws / "inside-link.csv")  # refused too: no symlinks
    os.symlink(tmp_path, ws / "dirlink")
    (ws / "adir").mkdir()
    got, refused = files.capture(ws, ["out/r.csv", "escape.txt", "inside-link.csv",
                                      "dirlink/secret.txt", "big.bin", "missing.txt", "adir",
                                      "../secret.txt", "/etc/passwd"],
                                 max_file_bytes=1024)
    assert [(f.name, f.size, f.mime) for f in got] == [("out/r.csv", 8, "text/csv")]
    import hashlib

    assert got[0].sha256 == hashlib.sha256(b"a,b\n1,2\n").hexdigest()
    assert got[0].content == b"a,b\n1,2\n"
    reasons = {r.name: r.reason for r in refused}
    assert reasons == {"escape.txt": "symlink", "inside-link.csv": "symlink",
                       "dirlink/secret.txt": "symlink", "big.bin": "too_large",
                       "missing.txt": "missing", "adir": "not_a_file",
                       "../secret.txt": "traversal", "/etc/passwd": "absolute_path"}
    assert all("server secret" not in repr(r) for r in refused)


def test_capture_total_bound(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(b"x" * 600)
    got, refused = files.capture(tmp_path, ["a", "b", "c"], max_file_bytes=1000,
                                 max_total_bytes=1300)
    assert [f.name for f in got] == ["a", "b"]
    assert [(r.name, r.reason) for r in refused] == [("c", "total_too_large")]


# --- leases -------------------------------------------------------------------------------


@pytest.mark.rule("R-439")
async def test_leases_are_keyed_by_actor_and_conversation(tmp_path: Path) -> None:
    leases = LeaseManager(tmp_path, idle_timeout_s=60)
    a1 = leases.acquire("alice", "c1")
    assert leases.acquire("alice", "c1") is a1
    others = [leases.acquire("bob", "c1"), leases.acquire("alice", "c2")]
    workspaces = {a1.workspace, *(o.workspace for o in others)}
    assert len(workspaces) == 3 and all(w.is_relative_to(tmp_path) for w in workspaces)
    assert len({a1.token, *(o.token for o in others)}) == 3
    assert leases.by_token(a1.token) is a1
    assert leases.by_token(a1.token + "x") is None and leases.by_token("") is None
    # Hostile names never become path components.
    evil = leases.acquire("../../etc", "/root")
    assert evil.workspace.is_relative_to(tmp_path)
    assert "alice" not in repr(a1.workspace) and a1.token not in repr(a1)
    assert await leases.release("alice", "c1")
    assert leases.by_token(a1.token) is None and not await leases.release("alice", "c1")
    fresh = leases.acquire("alice", "c1")
    assert fresh is not a1 and fresh.token != a1.token and fresh.workspace == a1.workspace


async def test_idle_leases_are_reaped(tmp_path: Path) -> None:
    leases = LeaseManager(tmp_path, idle_timeout_s=10)
    lease = leases.acquire("alice", "c1")
    assert await leases.reap_idle(now=lease.last_used + 5) == 0
    assert await leases.reap_idle(now=lease.last_used + 11) == 1
    assert lease.released and leases.by_token(lease.token) is None
