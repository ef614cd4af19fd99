"""run_code in a REAL bubblewrap jail (``jail="required"``): what the kernel can and cannot see.

Runs wherever ``bwrap`` is installed; CI installs it (``.ci/run``), and there the test refuses
to skip, so a CI machine without the jail fails instead of silently testing nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from kaizen_kernel.service import RunCodeConfig, RunCodeService
from tests.kernel.conftest import TEST_BUDGET, TEST_LIMITS

pytestmark = pytest.mark.asyncio(loop_scope="session")

if shutil.which("bwrap") is None:
    if os.environ.get("CI"):
        raise RuntimeError("CI must install bubblewrap (bwrap) to test the kernel jail")
    pytest.skip("bubblewrap not installed", allow_module_level=True)

HOST_SECRET = "host-only secret 7f3a"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def jailed(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunCodeService]:
    root = tmp_path_factory.mktemp("kaizen-jail")
    # Beside the workspaces, in the server's own state: a kernel must never read it.
    (root / "server-secret.txt").write_text(HOST_SECRET)
    service = RunCodeService(RunCodeConfig(
        state_root=root, budget=TEST_BUDGET, process_limits=TEST_LIMITS, jail="required",
        pool_sizes={"python": 0}))
    await service.start()
    try:
        yield service
    finally:
        await service.close()


PROBE = """
import json, os
def readable(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        return type(e).__name__
open('made-here.txt', 'w').write('ok')
print(json.dumps({
    'cwd': os.getcwd(),
    'secret': readable(SECRET),
    'source': readable(SOURCE),
    'pids': sorted(int(p) for p in os.listdir('/proc') if p.isdigit()),
    'host_tmp': readable(HOST_TMP),
    'etc_shadow': readable('/etc/shadow'),
}))
"""


async def test_jailed_kernel_sees_its_workspace_and_nothing_of_the_host(
        jailed: RunCodeService) -> None:
    secret = jailed.config.state_root / "server-secret.txt"
    host_tmp = Path("/tmp") / f"kaizen-jail-probe-{os.getpid()}"
    host_tmp.write_text(HOST_SECRET)
    code = (f"SECRET = {str(secret)!r}\nSOURCE = {__file__!r}\n"
            f"HOST_TMP = {str(host_tmp)!r}\n" + PROBE)
    try:
        r = await jailed.run("alice", "conv-jail", code, "python", False, ["made-here.txt"])
    finally:
        host_tmp.unlink()
    assert r.status == "ok", r
    seen = json.loads(r.stdout)
    workspace = jailed.workspace("alice", "conv-jail")
    assert seen["cwd"] == str(workspace)
    assert (workspace / "made-here.txt").read_text() == "ok"  # the workspace is writable
    assert [f.name for f in r.files] == ["made-here.txt"]     # and its files persist
    assert seen["secret"] == "FileNotFoundError"  # the server's state dir is not mounted
    assert HOST_SECRET not in r.stdout
    assert seen["source"] == "FileNotFoundError"  # nor the server's code (outside prefixes)
    assert seen["etc_shadow"] == "FileNotFoundError"
    assert seen["host_tmp"] == "FileNotFoundError"  # a private /tmp
    assert max(seen["pids"]) < 50                 # its own PID namespace, not the host's


async def test_jailed_system_directories_are_read_only(jailed: RunCodeService) -> None:
    code = ("import sys\n"
            "for path in ('/usr/kaizen-probe', sys.prefix + '/kaizen-probe'):\n"
            "    try:\n"
            "        open(path, 'w').write('x')\n"
            "        print('WROTE', path)\n"
            "    except OSError as e:\n"
            "        print(type(e).__name__)\n")
    r = await jailed.run("alice", "conv-ro", code, "python", False, [])
    assert r.status == "ok", r
    assert "WROTE" not in r.stdout
    assert len(r.stdout.split()) == 2 and all(
        name in ("OSError", "PermissionError") for name in r.stdout.split())
    assert not await asyncio.to_thread(os.path.exists, "/usr/kaizen-probe")


async def test_persistent_jailed_kernel_keeps_state(jailed: RunCodeService) -> None:
    first = await jailed.run("bob", "conv-jp", "n = 20", "python", True, [])
    assert first.status == "ok", first
    second = await jailed.run("bob", "conv-jp", "print(n + 1)", "python", True, [])
    assert second.stdout == "21\n", second


async def test_node_kernel_runs_in_the_jail(jailed: RunCodeService) -> None:
    if not jailed.pool.available("node"):
        if os.environ.get("CI"):
            raise AssertionError("CI installs the Node kernel (scripts/setup)")
        pytest.skip("no Node kernel installed")
    secret = jailed.config.state_root / "server-secret.txt"
    code = ("const fs = require('fs');\n"
            f"let seen = 'readable';\ntry {{ fs.readFileSync({str(secret)!r}); }}\n"
            "catch (e) { seen = 'absent'; }\n"
            "fs.writeFileSync('from-node.txt', 'ok');\n"
            "console.log(seen, process.cwd());\n")
    r = await jailed.run("alice", "conv-jail-js", code, "node", False, ["from-node.txt"])
    assert r.status == "ok", (r.stdout, r.stderr)
    assert r.stdout.split() == ["absent", str(jailed.workspace("alice", "conv-jail-js"))]
    assert [f.name for f in r.files] == ["from-node.txt"]
