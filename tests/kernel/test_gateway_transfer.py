"""Transfer mode against a real ``jupyter kernelgateway``: files go *to* the kernel.

A kernel on another host sees neither the server's projection of the turn's shared resources
nor the lease workspace that ``edit_workspace`` and earlier calls write. Before each
execution the server sends both through the kernel protocol (kaizen_kernel/remote/kernel.py).

When the tests run as root, the gateway (and so its kernels) runs without the capabilities
that let root ignore file permissions (``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``,
``CAP_FOWNER``), as an ordinary kernel user on another host would: a read-only copy then
really cannot be written by the program.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kaizen_plugins.workspace import edit_workspace, read_workspace

from kaizen_hashline import WorkspaceState
from kaizen_kernel import resources as resources_mod
from kaizen_kernel.limits import ExecutionBudget
from kaizen_kernel.remote.client import GatewaySettings
from kaizen_kernel.resources import VerifiedResources
from kaizen_kernel.service import RunCodeConfig, RunCodeService
from kaizen_server_extension.protocol.tools import FailureDomain
from tests.hashline.test_tools import Ctx
from tests.kernel.test_gateway import KernelGateway, running_gateway
from tests.kernel.test_shared_resources import (
    CSV,
    NOTES,
    REPORT,
    FakeArtifacts,
    _grant,
    _pinned,
)
from tests.support.server import free_port

GATEWAY_TOKEN = "transfer-gateway-token"
# Root keeps its uid (the interpreter lives under /root) but loses the permission overrides.
WITHOUT_OVERRIDES = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]


@pytest.fixture(scope="module")
def unprivileged_gateway() -> Iterator[KernelGateway]:
    as_root = os.geteuid() == 0
    if as_root and shutil.which("setpriv") is None:
        pytest.skip("running as root needs setpriv to drop the permission overrides")
    root = Path(tempfile.mkdtemp(prefix="kaizen-transfer-gw-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KAIZEN_", "KERNEL_")) and "DATABASE" not in k}
    env.update({
        "HOME": str(root), "IPYTHONDIR": str(root / "ipython"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"), "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_CONFIG_DIR": str(root / "config"), "KG_LIST_KERNELS": "True",
    })
    command = [*(WITHOUT_OVERRIDES if as_root else []),
               sys.executable, "-m", "kernel_gateway", "--KernelGatewayApp.ip=127.0.0.1",
               f"--KernelGatewayApp.port={port}",
               f"--KernelGatewayApp.auth_token={GATEWAY_TOKEN}"]
    try:
        with running_gateway(command, env, root, port, GATEWAY_TOKEN) as gateway:
            yield gateway
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _service(gateway: KernelGateway, state_root: Path,
                   settings: GatewaySettings) -> RunCodeService:
    from jupyter_server.gateway.gateway_client import GatewayClient

    GatewayClient.clear_instance()
    GatewayClient.instance(url=gateway.url, auth_token=GATEWAY_TOKEN)
    service = RunCodeService(RunCodeConfig(
        state_root=state_root, budget=ExecutionBudget(wall_seconds=20, output_bytes=65536),
        pool_sizes={"python": 0}, gateway=settings))
    await service.start()
    return service


@pytest_asyncio.fixture
async def transfer(unprivileged_gateway: KernelGateway,
                   tmp_path: Path) -> AsyncIterator[RunCodeService]:
    from jupyter_server.gateway.gateway_client import GatewayClient

    service = await _service(unprivileged_gateway, tmp_path,
                             GatewaySettings(workspace_mode="transfer"))
    try:
        yield service
    finally:
        await service.close()
        GatewayClient.clear_instance()


SMALL_FILE = 64 * 1024
SMALL_TOTAL = 128 * 1024
SMALL_COUNT = 20


@pytest_asyncio.fixture
async def tight(unprivileged_gateway: KernelGateway,
                tmp_path: Path) -> AsyncIterator[RunCodeService]:
    """Transfer mode with small bounds on what is sent to the kernel."""
    from jupyter_server.gateway.gateway_client import GatewayClient

    service = await _service(unprivileged_gateway, tmp_path, GatewaySettings(
        workspace_mode="transfer", transfer_max_file_bytes=SMALL_FILE,
        transfer_max_total_bytes=SMALL_TOTAL, transfer_max_files=SMALL_COUNT))
    try:
        yield service
    finally:
        await service.close()
        GatewayClient.clear_instance()


async def _json(service: RunCodeService, conversation: str, code: str, **kwargs: Any
                ) -> dict[str, Any]:
    result = await service.run("alice", conversation, code, "python", True, [], **kwargs)
    assert result.status == "ok", (result.code, result.message, result.stderr,
                                   result.error_value)
    return dict(json.loads(result.stdout))


# --- shared resources ---------------------------------------------------------------------


@pytest.mark.rule("R-175", "R-176", "R-454", "R-456")
async def test_a_shared_resource_is_read_from_a_read_only_copy_on_the_kernels_host(
        transfer: RunCodeService) -> None:
    store = FakeArtifacts({("a1", 1): CSV, ("a2", 3): NOTES})
    grant = _grant(store, _pinned("a1", CSV, "sales.csv", "text/csv"),
                   _pinned("a2", NOTES, "Notes.md", "text/markdown", version=3))
    result = await transfer.run("alice", "conv-res", REPORT, "python", True, [],
                                resources=grant)
    assert result.status == "ok", (result.code, result.message, result.stderr)
    seen = json.loads(result.stdout)
    manifest = json.loads(seen["manifest"])
    assert [(e["reference_id"], e["version"], e["filename"], e["media_type"], e["size"],
             e["kind"]) for e in manifest] == [
        ("a1", 1, "sales.csv", "text/csv", len(CSV), "artifact"),
        ("a2", 3, "Notes.md", "text/markdown", len(NOTES), "artifact")]
    # The kernel read the admitted bytes from copies on its own side, not the server's paths.
    assert [e["sha256"] for e in manifest] == seen["read"] == [
        hashlib.sha256(CSV).hexdigest(), hashlib.sha256(NOTES).hexdigest()]
    directory = Path(seen["dir"])
    assert all(Path(e["path"]).parent == directory for e in manifest)
    assert not directory.is_relative_to(transfer.config.state_root)
    assert directory.name.startswith("kaizen-res-")
    # Read-only for the program: neither an overwrite nor a new file gets in.
    assert seen["overwrite"] == seen["create"] == "EACCES"
    assert result.resources == [
        {"reference_id": "a1", "version": 1, "sha256": hashlib.sha256(CSV).hexdigest(),
         "size": len(CSV)},
        {"reference_id": "a2", "version": 3, "sha256": hashlib.sha256(NOTES).hexdigest(),
         "size": len(NOTES)}]
    payload = json.dumps(result.to_payload())
    assert "north,12" not in payload and "secret-looking" not in payload
    # A later call without files: both variables gone and the copies removed; its
    # code naming the directory grants nothing.
    later = await _json(transfer, "conv-res", REPORT.replace(
        "print(json.dumps(out))",
        f"out['left'] = sorted(os.listdir({str(directory)!r}))\nprint(json.dumps(out))"))
    assert later == {"dir": None, "manifest": None, "left": []}


TAMPERED_MARKER = """
import pathlib
pathlib.Path('ran.txt').write_text('the program ran')
"""
AFTER = """
import json, os
print(json.dumps({"ran": os.path.exists("ran.txt"),
                  "manifest": os.environ.get("KAIZEN_SHARED_RESOURCES_MANIFEST")}))
"""


@pytest.mark.rule("R-455")
async def test_a_resource_byte_changed_on_the_way_is_refused_before_anything_runs(
        transfer: RunCodeService, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FakeArtifacts({("a1", 1): CSV})
    grant = _grant(store, _pinned("a1", CSV, "sales.csv", "text/csv"))
    honest = resources_mod.project

    def tampered(directory: Path, verified: VerifiedResources) -> str:
        """The server's projection changes after verification (disk, another process)."""
        manifest = honest(directory, verified)
        path = Path(json.loads(manifest)[0]["path"])
        path.chmod(0o644)
        data = path.read_bytes()
        path.write_bytes(bytes([data[0] ^ 1]) + data[1:])
        return manifest

    monkeypatch.setattr(resources_mod, "project", tampered)
    refused = await transfer.run("alice", "conv-tamper", TAMPERED_MARKER, "python", True, [],
                                 resources=grant)
    assert refused.status == "error" and refused.code == "resource_manifest_mismatch"
    assert refused.failure_domain == FailureDomain.TOOL
    assert "nothing was run" in refused.message
    monkeypatch.setattr(resources_mod, "project", honest)
    # The same kernel afterwards: the refused program never ran, nothing stayed exposed.
    assert await _json(transfer, "conv-tamper", AFTER) == {"ran": False, "manifest": None}
    # And the honest bytes are sent again, verified and exposed.
    ok = await _json(transfer, "conv-tamper", REPORT, resources=grant)
    assert ok["read"] == [hashlib.sha256(CSV).hexdigest()]


# --- the lease workspace ------------------------------------------------------------------


LIST = """
import json, os
files = {}
for top, dirs, names in os.walk("."):
    for name in names:
        path = os.path.relpath(os.path.join(top, name))
        files[path] = open(path).read() if not os.path.islink(path) else "->link"
print(json.dumps({"cwd": os.getcwd(), "files": files,
                  "dirs": sorted(d for d in os.listdir(".") if os.path.isdir(d))}))
open("own.txt", "w").write("made by the kernel")
"""


@pytest.mark.rule("R-153")
async def test_edit_workspace_changes_reach_the_next_run_code(
        transfer: RunCodeService) -> None:
    workspace = transfer.workspace("alice", "conv-ws")
    (workspace / "app.py").write_text("x = 1\n")
    (workspace / "notes").mkdir()
    (workspace / "notes" / "old.txt").write_text("to be removed\n")
    (workspace / "run.sh").write_text("echo hi\n")
    (workspace / "run.sh").chmod(0o755)
    first = await _json(transfer, "conv-ws", LIST)
    assert not first["cwd"].startswith(str(workspace))  # the kernel's own directory
    assert first["files"] == {"app.py": "x = 1\n", "notes/old.txt": "to be removed\n",
                              "run.sh": "echo hi\n"}

    # edit_workspace changes a file and removes another; a symlink appears in the workspace.
    ctx = Ctx({"run_code": transfer, "workspace_state": WorkspaceState()}, member="alice",
              conversation="conv-ws")
    tag = (await read_workspace.impl(ctx, path="app.py"))["tag"]
    await edit_workspace.impl(ctx, edits=f"[app.py#{tag}]\nPUT 1.=1:\n+x = 2\n")
    tag = (await read_workspace.impl(ctx, path="notes/old.txt"))["tag"]
    await edit_workspace.impl(ctx, edits=f"[notes/old.txt#{tag}]\nREM\n")
    (workspace / "leak.txt").symlink_to("/etc/hostname")
    (workspace / "added.txt").write_text("new\n")

    second = await _json(transfer, "conv-ws", LIST)
    assert second["files"] == {
        "app.py": "x = 2\n",  # changed
        "added.txt": "new\n",  # new
        "run.sh": "echo hi\n",
        # The kernel's own file stays: the sync removes only what it brought.
        "own.txt": "made by the kernel",
    }  # notes/old.txt deleted, the symlink never sent
    assert second["dirs"] == ["notes"]  # emptied, and still in the workspace
    (workspace / "notes").rmdir()
    third = await _json(transfer, "conv-ws", LIST)
    assert third["dirs"] == []  # gone from the workspace: gone there too
    mode = await _json(transfer, "conv-ws",
                       "import json, os\nprint(json.dumps({'x': os.access('run.sh', os.X_OK)}))")
    assert mode == {"x": True}  # the executable bit travels with the file


@pytest.mark.rule("R-086")
async def test_a_symlink_the_program_left_is_replaced_never_followed(
        transfer: RunCodeService) -> None:
    workspace = transfer.workspace("alice", "conv-link")
    outside = tempfile.mkdtemp(prefix="kaizen-outside-")
    os.chmod(outside, 0o777)
    try:
        # The program points "data" at a directory outside its working directory ...
        await _json(transfer, "conv-link", f"import os, json\nos.symlink({outside!r}, "
                                           "'data')\nprint(json.dumps({}))")
        # ... and then the workspace gains data/file.txt: it must land inside, not there.
        (workspace / "data").mkdir()
        (workspace / "data" / "file.txt").write_text("inside\n")
        seen = await _json(transfer, "conv-link", "import json, os\nprint(json.dumps({"
                                                  "'link': os.path.islink('data'), "
                                                  "'text': open('data/file.txt').read()}))")
        assert seen == {"link": False, "text": "inside\n"}
        assert os.listdir(outside) == []
    finally:
        shutil.rmtree(outside, ignore_errors=True)


async def test_over_the_transfer_bounds_the_call_is_refused_with_a_clear_error(
        tight: RunCodeService) -> None:
    workspace = tight.workspace("alice", "conv-big")
    (workspace / "big.bin").write_bytes(b"b" * (SMALL_FILE + 1))
    big = await tight.run("alice", "conv-big", TAMPERED_MARKER, "python", True, [])
    assert big.status == "error" and big.code == "workspace_too_large", big
    assert big.failure_domain == FailureDomain.CALLER
    assert "'big.bin'" in big.message and f"{SMALL_FILE} bytes" in big.message
    assert "nothing was run" in big.message
    (workspace / "big.bin").unlink()

    for i in range(3):  # each under the per-file bound, together over the total
        (workspace / f"part{i}.bin").write_bytes(b"p" * (SMALL_FILE - 1))
    total = await tight.run("alice", "conv-big", TAMPERED_MARKER, "python", True, [])
    assert total.code == "workspace_too_large", total
    assert f"{SMALL_TOTAL} bytes" in total.message
    for i in range(3):
        (workspace / f"part{i}.bin").unlink()

    for i in range(SMALL_COUNT + 1):
        (workspace / f"f{i}.txt").write_text(str(i))
    many = await tight.run("alice", "conv-big", TAMPERED_MARKER, "python", True, [])
    assert many.code == "workspace_too_large", many
    assert f"more than {SMALL_COUNT} files" in many.message
    (workspace / "f0.txt").unlink()

    # Within the bounds again: the refused programs never ran, and this one does.
    seen = await _json(tight, "conv-big", AFTER)
    assert seen == {"ran": False, "manifest": None}

    # A shared file over the bound is refused too (and nothing is exposed).
    content = b"r" * (SMALL_FILE + 1)
    store = FakeArtifacts({("a1", 1): content})
    grant = _grant(store, _pinned("a1", content, "large.bin", "application/octet-stream"))
    refused = await tight.run("alice", "conv-big", TAMPERED_MARKER, "python", True, [],
                              resources=grant)
    assert refused.code == "resource_too_large" and "nothing was run" in refused.message
    assert await _json(tight, "conv-big", AFTER) == {"ran": False, "manifest": None}
