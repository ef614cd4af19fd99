"""run_code against REAL ipykernel kernels started by the sandbox provisioner.

One session-wide service (warm pool of two) serves every test; only the behaviours that
need a fresh or persistent kernel start one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kaizen_kernel.schema import RunCodeArgumentsError
from kaizen_server_extension.protocol.tools import FailureDomain, ToolOutcome
from tests.kernel.conftest import MAX_FILE_BYTES, SECRET_ENV, TEST_LIMITS, Sandbox

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.mark.rule("R-170")
async def test_ephemeral_calls_do_not_share_state(sandbox: Sandbox) -> None:
    svc = sandbox.service
    first = await svc.run("alice", "conv-eph", "leak = 41\nprint('set')", "python", False, [])
    assert first.status == "ok" and first.stdout == "set\n", first
    second = await svc.run("alice", "conv-eph", "print(leak + 1)", "python", False, [])
    assert second.status == "error" and second.error_name == "NameError"


@pytest.mark.rule("R-170", "R-439")
async def test_persistent_state_is_per_actor_and_conversation(sandbox: Sandbox) -> None:
    svc = sandbox.service
    r = await svc.run("alice", "conv-p", "counter = 1", "python", True, [])
    assert r.status == "ok", r
    r = await svc.run("alice", "conv-p", "counter += 1\nprint(counter)", "python", True, [])
    assert r.stdout == "2\n", r
    # Same conversation, another actor; same actor, another conversation: nothing shared.
    for actor, conv in (("bob", "conv-p"), ("alice", "conv-other")):
        other = await svc.run(actor, conv, "print(counter)", "python", True, [])
        assert other.status == "error" and other.error_name == "NameError", (actor, conv)
    # A non-persistent call on the same lease gets a fresh kernel, not the persistent one.
    eph = await svc.run("alice", "conv-p", "print(counter)", "python", False, [])
    assert eph.error_name == "NameError"
    r = await svc.run("alice", "conv-p", "print(counter)", "python", True, [])
    assert r.stdout == "2\n"


async def test_kernel_sees_no_server_secret_and_works_in_the_workspace(
        sandbox: Sandbox) -> None:
    svc = sandbox.service
    assert os.environ["KAIZEN_MODEL_API_KEY"] == "sekrit"  # the server has them
    code = ("import os, json\n"
            "print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd(),"
            " 'home': os.path.expanduser('~')}))")
    r = await svc.run("alice", "conv-env", code, "python", False, [])
    assert r.status == "ok", r
    seen = json.loads(r.stdout)
    for name, value in SECRET_ENV.items():
        assert name not in seen["env"]
        assert value not in r.stdout
    workspace = svc.workspace("alice", "conv-env")
    assert seen["cwd"] == str(workspace)
    assert seen["env"]["KAIZEN_WORKSPACE"] == str(workspace)
    assert not Path(seen["home"]).is_relative_to(workspace)  # IPython's own files elsewhere
    assert "KAIZEN_SHARED_RESOURCES_DIR" not in seen["env"]


async def test_rlimits_apply_inside_the_kernel(sandbox: Sandbox) -> None:
    code = ("import resource\n"
            "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0],"
            " resource.getrlimit(resource.RLIMIT_FSIZE)[0],"
            " resource.getrlimit(resource.RLIMIT_AS)[0],"
            " resource.getrlimit(resource.RLIMIT_NPROC)[0],"
            " resource.getrlimit(resource.RLIMIT_CORE)[0])\n"
            "try:\n"
            "    open('too-big.bin', 'wb').write(b'x' * (9 * 1024 * 1024))\n"
            "except OSError as e:\n"
            "    print('EFBIG', e.errno)\n")
    r = await sandbox.service.run("alice", "conv-rl", code, "python", False, [])
    assert r.status == "ok", r
    first, efbig = r.stdout.splitlines()
    assert [int(v) for v in first.split()] == [
        TEST_LIMITS.max_open_files, TEST_LIMITS.max_file_bytes,
        TEST_LIMITS.address_space_bytes, TEST_LIMITS.max_processes, 0]
    assert efbig == "EFBIG 27"


@pytest.mark.rule("R-178")
async def test_traceback_is_a_relayed_caller_failure(sandbox: Sandbox) -> None:
    code = ("open('partial.txt', 'w').write('half done')\n"
            "def f():\n    raise ValueError('bad input: permission denied')\nf()")
    r = await sandbox.service.run("alice", "conv-tb", code, "python", False, ["partial.txt"])
    assert r.status == "error" and r.outcome == ToolOutcome.ERROR
    assert r.failure_domain == FailureDomain.CALLER and r.code == "program_error"
    assert r.error_name == "ValueError" and "permission denied" in (r.error_value or "")
    assert "f()" in (r.traceback or "") and "\x1b[" not in (r.traceback or "")
    # A failed call can still have saved files.
    assert [f.name for f in r.files] == ["partial.txt"]
    payload = r.to_payload()
    assert payload["failure_domain"] == "caller" and payload["status"] == "error"
    assert "ValueError" in payload["repair_instruction"]
    assert "repair_instruction" not in r.to_payload(repair=False)


@pytest.mark.rule("R-077")
async def test_wall_time_interrupts_and_keeps_persistent_state(sandbox: Sandbox) -> None:
    svc = sandbox.service
    await svc.run("alice", "conv-wall", "kept = 'yes'", "python", True, [])
    r = await svc.run("alice", "conv-wall", "import time\nprint('start', flush=True)\n"
                      "time.sleep(60)", "python", True, [], wall_seconds=1.0)
    assert r.status == "timeout" and r.outcome == ToolOutcome.TIMEOUT, r
    assert r.code == "wall_time_exceeded" and not r.kernel_restarted
    assert r.failure_domain == FailureDomain.CALLER
    assert "time limit" in r.to_payload()["repair_instruction"]
    after = await svc.run("alice", "conv-wall", "print(kept)", "python", True, [])
    assert after.stdout == "yes\n"


async def test_sigint_ignoring_loop_restarts_the_kernel(sandbox: Sandbox) -> None:
    svc = sandbox.service
    await svc.run("alice", "conv-c", "kept = 1", "python", True, [])
    r = await svc.run("alice", "conv-c", "sum(range(10**12))", "python", True, [],
                      wall_seconds=1.0)
    assert r.status == "restarted" and r.kernel_restarted and r.state_lost, r
    assert r.outcome == ToolOutcome.TIMEOUT and r.failure_domain == FailureDomain.CALLER
    assert "restarted" in r.message
    after = await svc.run("alice", "conv-c", "import os\nprint(os.getcwd())\nprint(kept)",
                          "python", True, [])
    # Restarted: state is gone, the lease binding (workspace) is back.
    assert after.stdout.splitlines()[0] == str(svc.workspace("alice", "conv-c"))
    assert after.error_name == "NameError"


@pytest.mark.rule("R-078")
async def test_output_is_capped_inside_the_kernel(sandbox: Sandbox) -> None:
    r = await sandbox.service.run("alice", "conv-out", "print('x' * (50 * 1024 * 1024))\n"
                                  "import sys; print('err', file=sys.stderr)",
                                  "python", False, [])
    assert r.status == "ok"
    assert r.truncated_in_kernel and r.output_truncated
    assert len(r.stdout.encode()) + len(r.stderr.encode()) <= 1024 * 1024
    assert len(r.stdout) > 1000 * 1000
    assert "kaizen: output truncated" not in r.stdout  # the marker is consumed


async def test_server_backstop_bounds_fd_level_output(sandbox: Sandbox) -> None:
    """Output that bypasses sys.stdout (a subprocess writing fd 1) is cut server-side."""
    code = "import os\nos.system(\"head -c 300000 /dev/zero | tr '\\\\0' y\")"
    r = await sandbox.service.run("alice", "conv-fd", code, "python", False, [],
                                  output_bytes=10_000)
    assert r.status == "ok", r
    assert len(r.stdout.encode()) + len(r.stderr.encode()) <= 10_000
    assert r.output_truncated


async def test_display_data_is_kept_bounded(sandbox: Sandbox) -> None:
    code = ("from IPython.display import display, Image\n"
            "import base64\n"
            "png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk'"
            " 'YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==')\n"
            "display(Image(data=png))\n"
            "{'answer': 42}")
    r = await sandbox.service.run("alice", "conv-disp", code, "python", False, [])
    assert r.status == "ok", r
    assert any(d.image_png_b64 for d in r.displays)
    assert any(d.text_plain == "{'answer': 42}" for d in r.displays)
    assert "[image/png" in " ".join(r.to_payload()["outputs"])


async def test_artifact_targets_are_captured_and_escapes_refused(sandbox: Sandbox) -> None:
    code = ("import os\n"
            "os.makedirs('out', exist_ok=True)\n"
            "open('out/report.md', 'w').write('# hi\\n')\n"
            "os.symlink('/etc/passwd', 'passwd-link')\n"
            "os.symlink('/etc', 'etc-link')\n"
            "open('big.bin', 'wb').write(b'0' * (2 * 1024 * 1024))\n")
    r = await sandbox.service.run(
        "alice", "conv-files", code, "python", False,
        ["out/report.md", "passwd-link", "etc-link/passwd", "big.bin", "never-written.txt"])
    assert r.status == "ok", r
    assert [(f.name, f.size, f.mime) for f in r.files] == [("out/report.md", 5,
                                                            "text/markdown")]
    assert r.files[0].sha256 == __import__("hashlib").sha256(b"# hi\n").hexdigest()
    assert {x.name: x.reason for x in r.refused_files} == {
        "passwd-link": "symlink", "etc-link/passwd": "symlink", "big.bin": "too_large",
        "never-written.txt": "missing"}
    assert 2 * 1024 * 1024 > MAX_FILE_BYTES
    for bad in (["/etc/passwd"], ["../../x"], ["out/../../x"]):
        with pytest.raises(RunCodeArgumentsError):
            await sandbox.service.run("alice", "conv-files", "1", "python", False, bad)


@pytest.mark.rule("R-235")
async def test_missing_artifact_targets_rejected_before_any_kernel(sandbox: Sandbox) -> None:
    with pytest.raises(RunCodeArgumentsError):
        await sandbox.service.run_arguments("alice", "conv-s", {"code": "print(1)"})
    r = await sandbox.service.run_arguments(
        "alice", "conv-s", {"code": "print(1)", "artifact_targets": []})
    assert r.status == "ok" and r.stdout == "1\n"


async def test_a_kernel_that_dies_is_the_tools_failure(sandbox: Sandbox) -> None:
    r = await sandbox.service.run("alice", "conv-die", "import os\nos._exit(3)", "python",
                                  True, [], wall_seconds=15)
    assert r.status == "error" and r.code == "kernel_died", r
    assert r.failure_domain == FailureDomain.TOOL and r.outcome == ToolOutcome.ERROR
    lease = sandbox.service.leases.get("alice", "conv-die")
    assert lease is not None and "python" not in lease.persistent  # replaced next call
    again = await sandbox.service.run("alice", "conv-die", "print('back')", "python", True, [])
    assert again.stdout == "back\n"


async def test_a_kernel_that_cannot_start_is_the_tools_failure(
        tmp_path: Path) -> None:
    from kaizen_kernel.service import RunCodeConfig, RunCodeService

    svc = RunCodeService(RunCodeConfig(state_root=tmp_path, jail="off", pool_sizes={},
                                       kernel_names={"python": "no-such-kernelspec"}))
    try:
        r = await svc.run("alice", "c", "print(1)", "python", False, [])
    finally:
        await svc.close()
    assert r.status == "error" and r.code == "kernel_unavailable"
    assert r.failure_domain == FailureDomain.TOOL


@pytest.mark.rule("R-277")
async def test_a_figure_the_program_shows_becomes_a_canvas_image(sandbox: Sandbox) -> None:
    """matplotlib in the kernel uses IPython's inline backend: ``plt.show()`` (and a figure
    left open at the end) is PNG display data, which run_code moves to the chat canvas."""
    code = ("import matplotlib.pyplot as plt\n"
            "plt.plot([1, 3, 2])\n"
            "plt.show()\n")
    r = await sandbox.service.run("alice", "conv-plot", code, "python", False, [])
    assert r.status == "ok", r
    [image] = r.canvas()
    assert image.kind == "image" and image.media_type == "image/png"
    payload = json.dumps(r.to_payload())
    assert "iVBOR" not in payload  # the bytes are on the canvas, not in the model's payload
