"""run_code output files persist through the artifact store (spec: Write tools and side
effects): one root per member, conversation and name; unchanged files reuse their version."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
from kaizen_plugins import code

from kaizen_kernel.files import CapturedFile
from kaizen_kernel.service import RunCodeResult
from kaizen_server_extension.protocol.tools import FailureDomain, ToolOutcome
from kaizen_server_extension.store import Store
from kaizen_server_extension.store.artifacts.repository import ArtifactStore
from tests.artifacts.support import Ctx, bundle_of, live_run, room


def _file(name: str, content: bytes, mime: str = "application/pdf") -> CapturedFile:
    return CapturedFile(name, len(content), hashlib.sha256(content).hexdigest(), mime, content)


class FakeService:
    def __init__(self) -> None:
        self.next: list[CapturedFile] = []
        self.fail = False

    async def run_arguments(self, member: str, conversation_id: str, arguments: Any,
                            **_: Any) -> RunCodeResult:
        outcome = ToolOutcome.ERROR if self.fail else ToolOutcome.OK
        return RunCodeResult(status="error" if self.fail else "ok", outcome=outcome,
                             failure_domain=FailureDomain.CALLER if self.fail
                             else FailureDomain.NONE,
                             language="python", persistent=False, files=list(self.next))


async def _ctx(store: Store, service: FakeService, conv: str | None = None) -> Ctx:
    conv = conv or await room(store)
    run = await live_run(store, conv)
    return Ctx(bundle_of(run), {"artifacts": ArtifactStore(store), "run_code": service})


async def _run(ctx: Ctx) -> dict[str, Any]:
    payload: dict[str, Any] = await code.run_code.impl(ctx, language="python", code="...",
                                                       artifact_targets=[])
    return payload


@pytest.mark.rule("R-452")
async def test_files_persist_and_an_unchanged_file_reuses_its_version(store: Store) -> None:
    service = FakeService()
    ctx = await _ctx(store, service)
    service.next = [_file("report.pdf", b"%PDF-1"), _file("chart.png", b"png", "image/png")]
    first = await _run(ctx)
    by_name = {f["name"]: f for f in first["files"]}
    assert by_name["report.pdf"]["saved"] and by_name["report.pdf"]["version"] == 1
    assert not by_name["report.pdf"]["reused"]
    report = by_name["report.pdf"]["artifact_id"]
    stored = await ArtifactStore(store).resolve("alice", report)
    assert (stored.kind, stored.mime, stored.content) == ("file", "application/pdf", b"%PDF-1")

    service.next = [_file("report.pdf", b"%PDF-1")]  # same bytes, same type
    again = (await _run(ctx))["files"][0]
    assert (again["artifact_id"], again["version"], again["reused"]) == (report, 1, True)
    service.next = [_file("report.pdf", b"%PDF-2")]  # changed bytes: the next version
    changed = (await _run(ctx))["files"][0]
    assert (changed["artifact_id"], changed["version"], changed["reused"]) == (report, 2,
                                                                              False)
    service.next = [_file("report.pdf", b"%PDF-2", "application/octet-stream")]
    retyped = (await _run(ctx))["files"][0]
    assert (retyped["artifact_id"], retyped["version"]) == (report, 3)
    # Another conversation keeps its own root for the same name.
    other = await _ctx(store, service)
    elsewhere = (await _run(other))["files"][0]
    assert elsewhere["artifact_id"] != report and elsewhere["version"] == 1


async def test_files_are_kept_when_the_program_fails(store: Store) -> None:
    service = FakeService()
    ctx = await _ctx(store, service)
    service.next, service.fail = [_file("partial.csv", b"a,b\n", "text/csv")], True
    payload = await _run(ctx)
    assert payload["files"][0]["saved"] is True
    assert "partial.csv" in payload["saved_files_note"]
    assert len(await ArtifactStore(store).list_for("alice")) == 1


@pytest.mark.rule("R-451")
async def test_a_file_that_does_not_match_its_declaration_is_not_stored(
        store: Store) -> None:
    service = FakeService()
    ctx = await _ctx(store, service)
    good = _file("ok.txt", b"ok", "text/plain")
    service.next = [CapturedFile("lie.bin", 3, "0" * 64, "x/y", b"abc"),
                    CapturedFile("../escape", 2, good.sha256, "text/plain", b"ok"), good]
    payload = await _run(ctx)
    assert [f["name"] for f in payload["files"]] == ["ok.txt"]
    assert {r["name"] for r in payload["refused_files"]} == {"lie.bin", "../escape"}
    assert [r.title for r in await ArtifactStore(store).list_for("alice")] == ["ok.txt"]


@pytest.mark.rule("R-453")
async def test_concurrent_saves_of_one_name_are_serialized(store: Store) -> None:
    conv = await room(store)
    artifacts = ArtifactStore(store)
    same = await asyncio.gather(*[
        artifacts.persist_file("alice", conv, None, "out.txt", b"same", "text/plain")
        for _ in range(4)])
    assert len({r.artifact_id for r, _ in same}) == 1
    assert sorted(reused for _, reused in same) == [False, True, True, True]
    different = await asyncio.gather(*[
        artifacts.persist_file("alice", conv, None, "out.txt", f"v{i}".encode(),
                               "text/plain") for i in range(4)])
    root = same[0][0].artifact_id
    assert {r.artifact_id for r, _ in different} == {root}
    assert await artifacts.versions("alice", root) == [1, 2, 3, 4, 5]
