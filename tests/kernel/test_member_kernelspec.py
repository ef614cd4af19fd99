"""run_code in the member's own environment (issue 13, item 2): a kernelspec named by
``KAIZEN_RUN_CODE_KERNELSPEC`` whose interpreter is a second virtualenv with pandas and
ipykernel and **no Kaizen**. The prelude (output cap, ``tools.call``, shared files by name) is
sent as self-contained source, so it works there; jailed and not, and through a real server.

Slow but real: the virtualenv is built once per session from pip's cache."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from kaizen_kernel import prelude_py
from kaizen_kernel.remote import prelude as remote_prelude
from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.kernel.conftest import Sandbox, bwrap_or_skip, serving
from tests.kernel.test_shared_resources import CSV, FakeArtifacts, _grant, _pinned
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.server import ServerProcess, start_server

SPEC = "member-env"
ASYNC = pytest.mark.asyncio(loop_scope="session")


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


@pytest.fixture(scope="session")
def member_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A second virtualenv (pandas, ipykernel; no Kaizen) registered as kernelspec
    ``member-env`` in a JUPYTER_PATH of its own, which this process uses meanwhile."""
    root = tmp_path_factory.mktemp("member-env")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # The versions this environment already has: pip's cache serves them, no build.
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    f"ipykernel=={_version('ipykernel')}", f"pandas=={_version('pandas')}"],
                   check=True, timeout=600)
    spec_dir = root / "jupyter" / "kernels" / SPEC
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "The member's analysis env", "language": "python"}))
    saved = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(root / "jupyter")
    try:
        yield root
    finally:
        if saved is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = saved


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def member_sandbox(member_env: Path,
                         tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Sandbox]:
    async with serving(tmp_path_factory.mktemp("kaizen-member"), jail="off", pool=0,
                       kernel_names={"python": SPEC}) as box:
        yield box


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def member_jailed(member_env: Path,
                        tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Sandbox]:
    bwrap_or_skip()
    async with serving(tmp_path_factory.mktemp("kaizen-member-jail"), jail="required",
                       pool=0, kernel_names={"python": SPEC}) as box:
        yield box


@pytest.fixture(params=["unjailed", "jailed"])
def member_box(request: pytest.FixtureRequest) -> Sandbox:
    box: Sandbox = request.getfixturevalue(
        "member_sandbox" if request.param == "unjailed" else "member_jailed")
    return box


PROGRAM = """
import importlib.util, json, os, sys
import pandas as pd
df = pd.read_csv("sales.csv")
echo = tools.call("echo_tool", {"q": 1})
print(json.dumps({
    "prefix": sys.prefix,
    "kaizen": [m for m in ("kaizen_kernel", "kaizen_server_extension", "kaizen")
               if importlib.util.find_spec(m) is not None],
    "total": int(df["total"].sum()),
    "echo": echo,
    "cwd": os.getcwd(),
}))
print("x" * 50000)
"""


def test_the_prelude_is_self_contained_source() -> None:
    """What is sent into a kernel imports the standard library only: no Kaizen module need
    exist in the kernel's environment."""
    for module in (prelude_py, remote_prelude):
        tree = ast.parse(Path(module.__file__ or "").read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.Import) for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.level == 0}
        imported.discard("__future__")
        assert imported <= sys.stdlib_module_names, (module.__name__, imported)


@pytest.mark.slow
@pytest.mark.rule("R-171", "R-175", "R-078")
@ASYNC
async def test_run_code_runs_in_the_members_environment_without_kaizen(
        member_box: Sandbox, member_env: Path) -> None:
    svc = member_box.service
    grant = _grant(FakeArtifacts({("a1", 1): CSV}), _pinned("a1", CSV, "sales.csv", "text/csv"))
    r = await svc.run("alice", "conv-member", PROGRAM, "python", True, [], output_bytes=4096,
                      callable_tools={"echo_tool": Capability.READ}, resources=grant)
    assert r.status == "ok", (r.error_name, r.error_value, r.stderr)
    first = json.loads(r.stdout.splitlines()[0])
    assert Path(first["prefix"]) == member_env / "venv"  # the member's interpreter ...
    assert first["kaizen"] == []  # ... which has no Kaizen at all
    expected = sum(int(line.split(b",")[1]) for line in CSV.splitlines()[1:])
    assert first["total"] == expected  # the shared file, by its own name
    assert first["echo"]["tool"] == "echo_tool" and first["echo"]["echo"] == {"q": 1}
    assert first["cwd"] == str(svc.workspace("alice", "conv-member"))
    assert r.truncated_in_kernel and len(r.stdout.encode()) <= 4096  # the kernel's own cap
    # A persistent kernel of that environment keeps its state.
    again = await svc.run("alice", "conv-member", "print(len(df))", "python", True, [])
    assert again.status == "ok" and again.stdout.strip() == str(len(CSV.splitlines()) - 1)


SERVER_PROGRAM = """
import importlib.util, json, sys
import pandas as pd
agents = tools.call("list_available_agents")
print(json.dumps({"sum_b": int(pd.DataFrame({"b": [1, 2, 39]})["b"].sum()),
                  "prefix": sys.prefix, "agents": len(agents["agents"]),
                  "kaizen": importlib.util.find_spec("kaizen_kernel") is not None}))
"""


@pytest.fixture(scope="module")
def member_server(member_env: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("member-server")
    scripts = [{"match": "sum of column b", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": SERVER_PROGRAM, "language": "python", "artifact_targets": []}}]},
        {"text": "The sum is 42."}]}]
    with FakeOpenAI(scripts) as fake:
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake",
            "JUPYTER_PATH": str(member_env / "jupyter"), "KAIZEN_RUN_CODE_KERNELSPEC": SPEC})
        try:
            yield server
        finally:
            server.stop()


@pytest.mark.slow
@pytest.mark.rule("R-171")
def test_a_server_runs_python_run_code_in_the_named_kernelspec(
        member_server: ServerProcess, member_env: Path) -> None:
    with member_server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "what is the sum of column b?")
        run = _settled(alice, accepted["run_id"], timeout=90)
        assert run["status"] == "completed", run
        [settled] = [e for e in _events(alice, room, accepted["run_id"])
                     if e["type"] == "tool.settled" and e["data"]["name"] == "run_code"]
    body = json.loads(str(settled["data"]["content"]))
    assert body["status"] == "ok", body
    seen = json.loads(body["stdout"])
    assert seen["sum_b"] == 42 and seen["agents"] >= 1 and seen["kaizen"] is False
    assert Path(seen["prefix"]) == member_env / "venv"
    # The start-up line asked that environment, and names what it lacks.
    [line] = [x for x in member_server.log().splitlines() if "run_code data stack" in x]
    assert f"'{SPEC}'" in line and "MISSING matplotlib, scipy, pyarrow" in line
    assert f"{member_env / 'venv' / 'bin' / 'python'} -m pip install matplotlib scipy " \
           "pyarrow" in line


@pytest.mark.parametrize(("name", "why"), [
    ("no-such-env", "no kernelspec named 'no-such-env' is installed"),
    ("bad name!", "KAIZEN_RUN_CODE_KERNELSPEC"),
])
def test_an_unknown_kernelspec_stops_start_up_naming_the_setting(
        tmp_path: Path, name: str, why: str) -> None:
    with pytest.raises(RuntimeError, match="exited early") as failed:
        start_server(tmp_path, sqlite_url_for(tmp_path / "kaizen.db"),
                     extra_env={"KAIZEN_RUN_CODE_KERNELSPEC": name})
    log = str(failed.value)
    assert "Invalid setting KAIZEN_RUN_CODE_KERNELSPEC (c.KaizenApp.run_code_kernelspec)" \
        in log and why in log


def test_a_kernelspec_of_another_language_stops_start_up(tmp_path: Path) -> None:
    spec = tmp_path / "jupyter" / "kernels" / "not-python"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps(
        {"argv": ["node", "{connection_file}"], "display_name": "js", "language": "javascript"}))
    with pytest.raises(RuntimeError, match="exited early") as failed:
        start_server(tmp_path / "server", sqlite_url_for(tmp_path / "kaizen.db"), extra_env={
            "KAIZEN_RUN_CODE_KERNELSPEC": "not-python",
            "JUPYTER_PATH": str(tmp_path / "jupyter")})
    assert "kernelspec 'not-python' runs javascript, not Python" in str(failed.value)
