"""A kernel that exits while starting (the port jupyter_client picked was taken by another
process meanwhile) is started once more on fresh ports; one that keeps exiting fails as
KernelStartError after the second attempt, not after a minute's wait."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from kaizen_kernel.kernel import START_ATTEMPTS, KernelLaunchConfig, KernelStartError, SandboxKernel

# The sandbox never passes a kernelspec's env to the kernel, so the wrapper carries its own.
WRAPPER = """
import os, sys
count = os.path.join({root!r}, "starts")
with open(count, "a") as f:
    f.write("x")
starts = len(open(count).read())
if starts <= {fail_starts}:
    sys.exit("address already in use (simulated)")
from ipykernel import kernelapp
kernelapp.launch_new_instance()
"""


def _flaky_kernelspec(root: Path, fail_starts: int) -> str:
    spec = root / "kernels" / "flaky"
    spec.mkdir(parents=True)
    (root / "wrapper.py").write_text(WRAPPER.format(root=str(root), fail_starts=fail_starts))
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, str(root / "wrapper.py"), "-f", "{connection_file}"],
        "display_name": "flaky", "language": "python"}))
    return "flaky"


def _kernel(tmp_path: Path, fail_starts: int, monkeypatch: pytest.MonkeyPatch) -> SandboxKernel:
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    name = _flaky_kernelspec(tmp_path, fail_starts)
    config = KernelLaunchConfig(state_root=tmp_path / "state", jail="off")
    return SandboxKernel(kernel_name=name, language="python", config=config)


async def test_a_kernel_that_exits_while_starting_is_started_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = _kernel(tmp_path, fail_starts=1, monkeypatch=monkeypatch)
    try:
        await kernel.start()
        assert await kernel.is_alive()
        assert (tmp_path / "starts").read_text() == "xx"  # died once, then started
    finally:
        await kernel.shutdown()


async def test_a_kernel_that_keeps_exiting_fails_fast_after_the_last_attempt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = _kernel(tmp_path, fail_starts=99, monkeypatch=monkeypatch)
    started = time.monotonic()
    with pytest.raises(KernelStartError):
        await kernel.start()
    assert (tmp_path / "starts").read_text() == "x" * START_ATTEMPTS
    assert time.monotonic() - started < 30  # a dead kernel is seen dead, not waited out
