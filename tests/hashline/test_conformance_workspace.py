"""Conformance of the Hashline tools (guardrails spec, "Hashline tags"): one write guard per
complete patch, a helper that only ever sees text and snapshot metadata, and artifact edits
that never alias a workspace file."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from kaizen_plugins import artifacts as artifact_tools
from kaizen_plugins import workspace as workspace_tools

from kaizen_hashline import HashlineError, engine
from kaizen_hashline.fs import WorkspaceFS
from kaizen_hashline.state import WorkspaceKey, WorkspaceState
from kaizen_kernel.service import RunCodeConfig, RunCodeService
from kaizen_server_extension.policy.approvals import ApprovalMode, ApprovalStatus
from kaizen_server_extension.policy.errors import ApprovalPending
from kaizen_server_extension.policy.guardrails import ALLOW, Deny, GuardrailCall
from kaizen_server_extension.protocol.tools import ToolOutcome
from kaizen_server_extension.store import Store
from kaizen_server_extension.store.artifacts.repository import ArtifactStore
from kaizen_server_extension.tools import MemberSafeError
from kaizen_server_extension.tools.types import RegisteredTool
from tests.artifacts.support import Ctx, bundle_of, live_run, room
from tests.policy.fakes import BUNDLE, harness
from tests.support.services import tool_services

HASHLINE = Path(engine.__file__).parent
# The helper: parser, applier, block resolvers, stale-anchor recovery, text and rendering.
# Path authority (fs), trusted state and the tool wiring (engine) are the worker's side.
HELPER_MODULES = ("syntax", "apply", "blocks", "recovery", "text", "render")


@dataclasses.dataclass
class WorkspaceCtx:
    services: Mapping[str, Any]
    member: str = BUNDLE.member

    def __post_init__(self) -> None:
        self.services = tool_services(self.services)  # type: ignore[assignment]

    @property
    def bundle(self) -> Any:
        return BUNDLE


@pytest.fixture
def service(tmp_path: Path) -> RunCodeService:
    return RunCodeService(RunCodeConfig(state_root=tmp_path / "state"))


def _three_files(root: Path) -> None:
    (root / "a.py").write_text("a = 1\n")
    (root / "b.py").write_text("b = 1\n")
    (root / "old.txt").write_text("gone\n")


async def _patch(ctx: WorkspaceCtx) -> str:
    tags = {p: (await workspace_tools.read_workspace.impl(ctx, path=p))["tag"]
            for p in ("a.py", "b.py", "old.txt")}
    return (f"[a.py#{tags['a.py']}]\nPUT 1.=1:\n+a = 2\n"
            f"[b.py#{tags['b.py']}]\nPUT 1.=1:\n+b = 2\nMV c.py\n"
            f"[old.txt#{tags['old.txt']}]\nREM\n")


def _guarded(tool: RegisteredTool, ctx: WorkspaceCtx) -> RegisteredTool:
    async def impl(arguments: Mapping[str, Any]) -> object:
        return await tool.impl(ctx, **arguments)

    return RegisteredTool(tool.descriptor, impl)


@pytest.mark.rule("R-085")
async def test_a_multi_file_patch_passes_the_write_guard_once_as_a_whole(
        service: RunCodeService) -> None:
    ctx = WorkspaceCtx({"run_code": service, "workspace_state": WorkspaceState()})
    root = service.workspace(BUNDLE.member, BUNDLE.conversation_id)
    _three_files(root)
    program = await _patch(ctx)
    seen: list[Mapping[str, Any]] = []

    def guard(call: GuardrailCall) -> Any:
        seen.append(call.arguments)
        return ALLOW

    h = harness(_guarded(workspace_tools.edit_workspace, ctx), guardrails=[guard],
                mode=ApprovalMode.ALWAYS_ASK, validator=None)
    with pytest.raises(ApprovalPending) as pending:
        await h.call("edit_workspace", json.dumps({"edits": program}))
    # One guard decision and one approval for all three sections, before any file moved.
    assert [dict(a) for a in seen] == [{"edits": program}]
    assert h.approvals is not None and len(h.approvals.records) == 1
    assert h.executed == []
    assert (root / "a.py").read_text() == "a = 1\n" and (root / "old.txt").exists()

    h.approvals.decide(pending.value.approval_id, ApprovalStatus.APPROVED)
    result = await h.call("edit_workspace", json.dumps({"edits": program}))
    assert result.outcome is ToolOutcome.OK, result.content
    assert h.executed == ["edit_workspace"]  # one execution wrote every section
    assert len(h.approvals.records) == 1
    assert (root / "a.py").read_text() == "a = 2\n"
    assert (root / "c.py").read_text() == "b = 2\n" and not (root / "b.py").exists()
    assert not (root / "old.txt").exists()


@pytest.mark.rule("R-085")
async def test_a_guard_that_refuses_the_patch_leaves_every_file_untouched(
        service: RunCodeService) -> None:
    ctx = WorkspaceCtx({"run_code": service, "workspace_state": WorkspaceState()})
    root = service.workspace(BUNDLE.member, BUNDLE.conversation_id)
    _three_files(root)
    program = await _patch(ctx)
    calls = 0

    def refuse_removals(call: GuardrailCall) -> Any:
        nonlocal calls
        calls += 1
        return Deny("No deletions here.", code="no_rem") if "REM" in call.arguments["edits"] \
            else ALLOW

    h = harness(_guarded(workspace_tools.edit_workspace, ctx), guardrails=[refuse_removals],
                validator=None)
    result = await h.call("edit_workspace", json.dumps({"edits": program}))
    assert result.outcome is not ToolOutcome.OK and calls == 1
    assert "No deletions here." in result.content
    # The guard judged the whole patch: its harmless sections were not written either.
    assert h.executed == []
    assert {p.name: p.read_text() for p in root.iterdir()} == {
        "a.py": "a = 1\n", "b.py": "b = 1\n", "old.txt": "gone\n"}


def _imports(module: str) -> set[str]:
    tree = ast.parse((HASHLINE / f"{module}.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _calls_open(module: str) -> bool:
    tree = ast.parse((HASHLINE / f"{module}.py").read_text())
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
               and node.func.id in {"open", "exec", "eval", "__import__"}
               for node in ast.walk(tree))


@pytest.mark.rule("R-088")
def test_the_helper_modules_have_no_filesystem_network_or_identity_reach() -> None:
    forbidden_roots = {"os", "pathlib", "io", "shutil", "socket", "subprocess", "tempfile",
                       "glob", "urllib", "http", "httpx", "sqlalchemy", "boto3", "tornado"}
    allowed_internal = {f"kaizen_hashline.{m}" for m in (*HELPER_MODULES, "errors")}
    for module in HELPER_MODULES:
        imported = _imports(module)
        assert not {name.split(".")[0] for name in imported} & forbidden_roots, module
        internal = {n for n in imported if n.startswith(("kaizen_kernel", "kaizen_server"))}
        # Not fs (paths), state (trusted snapshots by identity) or the server's services.
        assert internal <= allowed_internal, (module, internal - allowed_internal)
        assert not _calls_open(module), module


@pytest.mark.rule("R-088")
def test_during_an_edit_the_helper_receives_bounded_text_and_snapshot_metadata_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every value handed to the parser, applier, block resolver and recovery during a real
    multi-section edit is text, numbers or the parsed program: never the workspace handle,
    the identity key, the trusted state or a filesystem path."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "m.py").write_text("def f():\n    return 1\n\nx = f()\n")
    (root / "n.md").write_text("# Title\n\nbody\n")
    fs, state = WorkspaceFS(root), WorkspaceState()
    key = WorkspaceKey("alice-identity", "conversation-identity")
    handed: list[Any] = []

    def recording(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            handed.append((name, args, kwargs))
            return real(*args, **kwargs)
        return wrapper

    for name in ("parse", "apply_hunks", "resolve_block", "remap", "line_map"):
        monkeypatch.setattr(engine, name, recording(name, getattr(engine, name)))
    tag_m = engine.read_file(fs, state, key, "m.py").tag
    tag_n = engine.read_file(fs, state, key, "n.md").tag
    # The live file drifts after the read, so recovery runs against the snapshot too.
    (root / "m.py").write_text("import os\ndef f():\n    return 1\n\nx = f()\n")
    engine.edit_files(fs, state, key,
                      f"[m.py#{tag_m}]\nPUT 1*:\n+def f():\n+    return 2\n"
                      f"[n.md#{tag_n}]\nPUT >$:\n+more\n")
    assert (root / "m.py").read_text().endswith("return 2\n\nx = f()\n")
    called = {name for name, _, _ in handed}
    assert {"parse", "apply_hunks", "remap"} <= called, called

    def check(value: Any) -> None:
        assert not isinstance(value, (WorkspaceFS, WorkspaceKey, WorkspaceState, os.PathLike,
                                      bytes)), type(value)
        if isinstance(value, str):
            assert "identity" not in value and str(tmp_path) not in value
        elif isinstance(value, Mapping):
            for k, v in value.items():
                check(k)
                check(v)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for v in value:
                check(v)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                check(getattr(value, f.name))

    for _name, args, kwargs in handed:
        for value in (*args, *kwargs.values()):
            check(value)

    # Bounded: a file over the worker's size bound never reaches the helper as text.
    (root / "big.txt").write_text("line of text\n" * 40)
    bounded = WorkspaceFS(root, max_file_bytes=256)
    handed.clear()
    with pytest.raises(HashlineError) as too_large:
        engine.edit_files(bounded, state, key, "[big.txt#0000]\nPUT 1.=1:\n+x\n")
    assert too_large.value.code == "file_too_large"
    assert "line of text" not in repr(handed)
    assert {name for name, _, _ in handed} <= {"parse"}


async def _artifact_and_workspace_ctx(store: Store, service: RunCodeService,
                                      member: str = "alice",
                                      conversation: str | None = None) -> Ctx:
    run = await live_run(store, conversation or await room(store, member), member)
    return Ctx(bundle_of(run), {"artifacts": ArtifactStore(store), "run_code": service,
                                "workspace_state": WorkspaceState()})


@pytest.mark.rule("R-089")
async def test_artifact_edits_never_alias_a_workspace_file_of_the_same_name_and_text(
        store: Store, service: RunCodeService) -> None:
    text = "alpha\nbeta\n"
    ctx = await _artifact_and_workspace_ctx(store, service)
    workspace = service.workspace(ctx.member, ctx.bundle.conversation_id)
    (workspace / "notes.md").write_text(text)
    artifacts = ArtifactStore(store)
    made = await artifacts.create("alice", title="notes.md", kind="markdown", content=text)
    file_view = await workspace_tools.read_workspace.impl(ctx, path="notes.md")
    artifact_view = await artifact_tools.read_artifact.impl(ctx, artifact_id=made.artifact_id)
    # Same name, same text, same four-hex tag: only the namespace tells them apart.
    assert file_view["tag"] == artifact_view["tag"]
    tag = artifact_view["tag"]

    await artifact_tools.edit_artifact.impl(ctx, artifact_id=made.artifact_id, version=1,
                                            tag=tag, edits="PUT 2.=2:\n+BETA")
    assert (workspace / "notes.md").read_text() == text  # the workspace file is untouched
    assert await artifacts.versions("alice", made.artifact_id) == [1, 2]

    await workspace_tools.edit_workspace.impl(ctx, edits=f"[notes.md#{tag}]\nPUT 1.=1:\n+ALPHA\n")
    assert (workspace / "notes.md").read_text() == "ALPHA\nbeta\n"
    latest = await artifacts.resolve("alice", made.artifact_id)
    assert (latest.version, latest.text()) == (2, "alpha\nBETA\n")  # no new version

    # A workspace path is not an artifact selector.
    with pytest.raises(MemberSafeError) as by_path:
        await artifact_tools.edit_artifact.impl(ctx, artifact_id="notes.md", version=2,
                                                tag=tag, edits="PUT 1.=1:\n+x")
    assert by_path.value.code == "artifact_not_found"
    assert (workspace / "notes.md").read_text() == "ALPHA\nbeta\n"


@pytest.mark.rule("R-089")
async def test_artifact_edits_resolve_by_member_immutable_version_and_content_tag(
        store: Store, service: RunCodeService) -> None:
    alice = await _artifact_and_workspace_ctx(store, service)
    bob = await _artifact_and_workspace_ctx(store, service, "bob")
    artifacts = ArtifactStore(store)
    made = await artifacts.create("alice", title="Plan", kind="markdown", content="one\ntwo\n")
    v1 = await artifact_tools.read_artifact.impl(alice, artifact_id=made.artifact_id)
    await artifact_tools.edit_artifact.impl(alice, artifact_id=made.artifact_id, version=1,
                                            tag=v1["tag"], edits="PUT 1.=1:\n+ONE")
    v2 = await artifact_tools.read_artifact.impl(alice, artifact_id=made.artifact_id)
    assert (v2["version"], v2["text"].splitlines()[1]) == (2, "1:ONE")

    attempts = (
        (bob, 2, v2["tag"]),      # the right version and tag, but not bob's artifact
        (alice, 1, v1["tag"]),    # an older immutable version, with its own correct tag
        (alice, 2, v1["tag"]),    # the latest version named with another content's tag
    )
    codes = []
    for ctx, version, tag in attempts:
        with pytest.raises(MemberSafeError) as refused:
            await artifact_tools.edit_artifact.impl(ctx, artifact_id=made.artifact_id,
                                                    version=version, tag=tag,
                                                    edits="PUT 2.=2:\n+TWO")
        assert "nothing was saved" in str(refused.value).lower()
        codes.append(refused.value.code)
    assert codes == ["artifact_not_found", "stale_version", "stale_version"]
    latest = await artifacts.resolve("alice", made.artifact_id)
    assert (latest.version, latest.text()) == (2, "ONE\ntwo\n")
    # The version read stays what it was: an edit made a new version, never rewrote one.
    assert (await artifacts.resolve("alice", made.artifact_id, version=1)).text() == \
        "one\ntwo\n"
