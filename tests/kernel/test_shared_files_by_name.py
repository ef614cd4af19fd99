"""A turn's shared files are in run_code's working directory under their own names, in REAL
kernels (Python and Node), read-only; a later call without them — in a fresh kernel of the
same lease, which remembers nothing — no longer finds them there."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from kaizen_kernel.pool import find_kernel_name
from kaizen_kernel.provisioner import find_bwrap
from kaizen_kernel.service import RunCodeConfig, RunCodeService
from tests.kernel.conftest import TEST_BUDGET, TEST_LIMITS
from tests.kernel.test_node import needs_node
from tests.kernel.test_shared_resources import CSV, FakeArtifacts, _grant, _pinned

pytestmark = pytest.mark.asyncio(loop_scope="session")

PYTHON_READ = """
import csv, json, os
with open("sales.csv", newline="") as f:
    total = sum(int(r["total"]) for r in csv.DictReader(f))
try:
    open("sales.csv", "a").write("x")
    wrote = True
except OSError:
    wrote = False
print(json.dumps({"total": total, "wrote": wrote, "link": os.path.islink("sales.csv")}))
"""
PYTHON_LOOK = 'import json, os\nprint(json.dumps(os.path.lexists("sales.csv")))\n'
NODE_READ = """
const fs = require("fs");
const rows = fs.readFileSync("sales.csv", "utf8").trim().split("\\n").slice(1);
console.log(JSON.stringify({ total: rows.reduce((n, r) => n + Number(r.split(",")[1]), 0) }));
"""
NODE_LOOK = 'console.log(JSON.stringify(require("fs").existsSync("sales.csv")));'


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def service(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunCodeService]:
    svc = RunCodeService(RunCodeConfig(
        state_root=tmp_path_factory.mktemp("kaizen-by-name"), budget=TEST_BUDGET,
        process_limits=TEST_LIMITS, jail="auto", pool_sizes={"python": 0}))
    await svc.start()
    try:
        yield svc
    finally:
        await svc.close()


def _sales() -> object:
    return _grant(FakeArtifacts({("a1", 1): CSV}), _pinned("a1", CSV, "sales.csv", "text/csv"))


@pytest.mark.rule("R-175", "R-454")
async def test_python_reads_the_file_by_name_and_a_fresh_kernel_without_it_does_not(
        service: RunCodeService) -> None:
    first = await service.run("alice", "conv-by-name", PYTHON_READ, "python", False, [],
                              resources=_sales())  # type: ignore[arg-type]
    assert first.status == "ok", first
    seen = json.loads(first.stdout)
    assert seen["total"] == 42 and seen["link"] is True
    if find_bwrap() is not None:
        assert seen["wrote"] is False  # the jail's read-only mount, for root too
    workspace = service.workspace("alice", "conv-by-name")
    # Another ephemeral call: a new kernel, no files; the old link is gone.
    later = await service.run("alice", "conv-by-name", PYTHON_LOOK, "python", False, [])
    assert later.status == "ok" and json.loads(later.stdout) is False, later
    assert not (workspace / "sales.csv").is_symlink()


@needs_node
@pytest.mark.skipif(find_kernel_name("node") is None, reason="no Node kernel")
async def test_node_reads_the_file_by_name_too(service: RunCodeService) -> None:
    first = await service.run("bob", "conv-by-name-js", NODE_READ, "node", False, [],
                              resources=_sales())  # type: ignore[arg-type]
    assert first.status == "ok", first
    assert json.loads(first.stdout) == {"total": 42}
    later = await service.run("bob", "conv-by-name-js", NODE_LOOK, "node", False, [])
    assert later.status == "ok" and json.loads(later.stdout) is False, later
