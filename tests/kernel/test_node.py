"""run_code with ``language: "node"`` against a REAL Node kernel (tslab, JavaScript mode).

The kernel comes from ``python -m kaizen_kernel.node_kernel install`` (``scripts/setup`` runs
it). Without it these tests skip locally; under CI they fail, so the Node path is never
silently untested there.
"""

from __future__ import annotations

import json
import os

import pytest

import kaizen_kernel.pool as pool_module
from kaizen_kernel.pool import find_kernel_name
from kaizen_kernel.service import RunCodeConfig, RunCodeService
from kaizen_server_extension.protocol.tools import Capability, FailureDomain, ToolOutcome
from tests.kernel.conftest import SECRET_ENV, TEST_BUDGET, TEST_LIMITS, Sandbox

pytestmark = pytest.mark.asyncio(loop_scope="session")

NODE_INSTALLED = find_kernel_name("node") is not None
needs_node = pytest.mark.skipif(
    not NODE_INSTALLED and not os.environ.get("CI"),
    reason="no Node kernel (python -m kaizen_kernel.node_kernel install)")

TOOLS = {"lookup": Capability.READ, "mutate": Capability.WRITE,
         "run_code": Capability.WRITE}


async def test_unavailable_language_is_a_clear_error(
        tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "find_kernel_name",
                        lambda language, ksm=None: "python3" if language == "python" else None)
    svc = RunCodeService(RunCodeConfig(state_root=tmp_path, budget=TEST_BUDGET,  # type: ignore[arg-type]
                                       process_limits=TEST_LIMITS, jail="off",
                                       pool_sizes={"python": 0}))
    try:
        r = await svc.run("alice", "conv-node", "console.log(1)", "node", False, [])
    finally:
        await svc.close()
    assert r.status == "error" and r.code == "language_unavailable"
    assert "language unavailable" in r.message and r.failure_domain == FailureDomain.CALLER


@needs_node
async def test_node_runs_code_and_a_persistent_kernel_keeps_state(sandbox: Sandbox) -> None:
    svc = sandbox.service
    r = await svc.run("alice", "conv-js", "let total = 40;\nconsole.log(total + 2);",
                      "node", True, [])
    assert r.status == "ok", r
    assert r.stdout == "42\n"
    again = await svc.run("alice", "conv-js", "total += 1;\nconsole.log(total);",
                          "node", True, [])
    assert again.stdout == "41\n", again
    # An ephemeral call gets a fresh kernel: nothing of the persistent one.
    # (eval: a name the type checker cannot see is a compile error, not "undefined")
    fresh = await svc.run("alice", "conv-js", "console.log(eval('typeof total'));", "node",
                          False, [])
    assert fresh.stdout == "undefined\n", fresh


@needs_node
async def test_node_kernel_env_is_allowlisted_and_in_the_workspace(sandbox: Sandbox) -> None:
    svc = sandbox.service
    r = await svc.run("alice", "conv-js-env",
                      "console.log(JSON.stringify({env: process.env, cwd: process.cwd()}));",
                      "node", False, [])
    assert r.status == "ok", r
    seen = json.loads(r.stdout)
    for name, value in SECRET_ENV.items():
        assert name not in seen["env"] and value not in r.stdout
    assert seen["cwd"] == str(svc.workspace("alice", "conv-js-env"))
    assert "KAIZEN_SHARED_RESOURCES_DIR" not in seen["env"]


@needs_node
@pytest.mark.rule("R-078")
async def test_node_output_is_capped_inside_the_kernel(sandbox: Sandbox) -> None:
    r = await sandbox.service.run(
        "alice", "conv-js-out",
        "for (let i = 0; i < 40; i++) { process.stdout.write('x'.repeat(1 << 20)); }\n"
        "console.error('after');", "node", False, [], output_bytes=64 * 1024)
    assert r.status == "ok", r
    assert r.truncated_in_kernel and r.output_truncated
    assert len(r.stdout.encode()) + len(r.stderr.encode()) <= 64 * 1024
    assert len(r.stdout) > 60 * 1024
    assert "kaizen: output truncated" not in r.stdout  # the marker is consumed


@needs_node
@pytest.mark.rule("R-171", "R-174")
async def test_node_tools_call_reaches_read_tools_and_refuses_writes(
        sandbox: Sandbox) -> None:
    before = len(sandbox.dispatch.calls)
    code = (
        "console.log(JSON.stringify(tools.available));\n"
        "const found = await tools.call('lookup', {q: 'kaizen'});\n"
        "console.log(JSON.stringify(found.echo));\n"
        "for (const name of ['mutate', 'run_code']) {\n"
        "  try { await tools.call(name, {}); console.log(name, 'ALLOWED'); }\n"
        "  catch (e) { console.log(name, e.code); }\n"
        "}\n")
    r = await sandbox.service.run("alice", "conv-js-bridge", code, "node", False, [],
                                  callable_tools=TOOLS)
    assert r.status == "ok", (r.stdout, r.stderr)
    assert r.stdout.splitlines() == ['["lookup"]', '{"q":"kaizen"}',
                                     "mutate write_refused", "run_code recursive_run_code"]
    calls = sandbox.dispatch.calls[before:]
    assert [(c[1], c[2]) for c in calls] == [("lookup", {"q": "kaizen"})]
    assert (calls[0][0].actor, calls[0][0].conversation_id) == ("alice", "conv-js-bridge")


@needs_node
async def test_node_program_error_is_the_callers_failure(sandbox: Sandbox) -> None:
    r = await sandbox.service.run("alice", "conv-js-err",
                                  "throw new RangeError('too far');", "node", False, [])
    assert r.status == "error", r
    assert r.failure_domain == FailureDomain.CALLER
    assert r.error_name == "RangeError" and "too far" in str(r.to_payload())
    typo = await sandbox.service.run("alice", "conv-js-err", "console.log(undefinedName);",
                                     "node", False, [])
    assert typo.status == "error" and typo.error_name == "CompileError", typo
    assert "Cannot find name 'undefinedName'" in str(typo.to_payload())


@needs_node
@pytest.mark.rule("R-077")
async def test_node_busy_loop_hits_the_wall_limit_and_the_kernel_comes_back(
        sandbox: Sandbox) -> None:
    svc = sandbox.service
    r = await svc.run("alice", "conv-js-wall", "while (true) {}", "node", True, [],
                      wall_seconds=2.0)
    assert r.outcome == ToolOutcome.TIMEOUT and r.failure_domain == FailureDomain.CALLER, r
    after = await svc.run("alice", "conv-js-wall", "console.log('back');", "node", True, [])
    assert after.status == "ok" and after.stdout == "back\n", after
