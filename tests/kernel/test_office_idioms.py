"""The document-writer idioms in run_code's description run against the pinned real libraries
(R-177), and the files a real kernel writes with them persist as artifacts."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kaizen_plugins import artifacts, code
from kaizen_plugins.office_idioms import idioms

from kaizen_server_extension.store import Store, create_engine, upgrade
from kaizen_server_extension.store.artifacts.repository import ArtifactStore
from kaizen_server_extension.store.engine import sqlite_url_for
from tests.artifacts.support import Ctx, bundle_of, live_run, room
from tests.kernel.conftest import Sandbox


def _pptx(data: bytes) -> str:
    from pptx import Presentation
    deck = Presentation(io.BytesIO(data))
    return str(deck.slides[0].shapes.title.text)


def _pdf(data: bytes) -> str:
    assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF")
    return "pdf"


def _docx(data: bytes) -> str:
    from docx import Document
    return str(Document(io.BytesIO(data)).paragraphs[0].text)


def _xlsx(data: bytes) -> str:
    from openpyxl import load_workbook
    sheet = load_workbook(io.BytesIO(data)).active
    assert sheet is not None
    return str(sheet["A1"].value)


def _png(data: bytes) -> str:
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return "png"


# What each library's file must open as, read back with the same real library.
CHECKS: dict[str, tuple[Callable[[bytes], str], str]] = {
    "python-pptx": (_pptx, "Quarterly review"),
    "ReportLab": (_pdf, "pdf"),
    "python-docx": (_docx, "Quarterly review"),
    "openpyxl": (_xlsx, "quarter"),
    "Matplotlib": (_png, "png"),
}


def _description() -> str:
    return code.run_code.descriptor.description


def test_the_description_carries_one_idiom_per_document_writer() -> None:
    found = idioms(_description())
    assert set(found) == set(CHECKS)
    # The steer away from the text writers is part of the same paragraph (R-246's advice).
    assert "not create_artifact" in _description()
    for target, _ in found.values():
        assert target in _description()


def test_the_text_writers_point_native_files_at_run_code() -> None:
    """Both text writers an agent may hold beside run_code name it for native files (and
    create_artifact refuses .docx/.pptx/.xlsx titles: tests/artifacts/test_tools.py)."""
    for writer in (artifacts.create_artifact, artifacts.begin_artifact):
        description = writer.descriptor.description
        assert "PowerPoint" in description and "make them with run_code" in description


@pytest.mark.rule("R-177")
@pytest.mark.parametrize("library", sorted(CHECKS))
def test_each_idiom_runs_against_the_real_library(library: str, tmp_path: Path) -> None:
    target, program = idioms(_description())[library]
    done = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    written = tmp_path / target
    assert written.is_file(), f"{library} idiom did not write {target}"
    check, expected = CHECKS[library]
    assert check(written.read_bytes()) == expected


@pytest.mark.asyncio(loop_scope="session")
async def test_idioms_run_in_a_real_kernel_persist_as_artifacts(
        sandbox: Sandbox, tmp_path: Path) -> None:
    engine = create_engine(sqlite_url_for(tmp_path / "kaizen.db"))
    await upgrade(engine, None)
    store = Store(engine)
    try:
        conversation = await room(store)
        run = await live_run(store, conversation)
        artifacts = ArtifactStore(store)
        ctx = Ctx(bundle_of(run), {"artifacts": artifacts, "run_code": sandbox.service})
        found = idioms(_description())
        program = "\n".join(body for _, body in found.values())
        targets = [target for target, _ in found.values()]
        payload: dict[str, Any] = await code.run_code.impl(
            ctx, language="python", code=program, artifact_targets=targets)
        assert payload["status"] == "ok", payload
        saved = {f["name"]: f for f in payload["files"]}
        assert sorted(saved) == sorted(targets)
        for library, (target, _) in found.items():
            entry = saved[target]
            assert entry["saved"] and entry["version"] == 1, entry
            stored = await artifacts.resolve("alice", entry["artifact_id"])
            check, expected = CHECKS[library]
            assert stored.kind == "file" and check(stored.content) == expected

        # The chart is byte-identical on a rerun: the latest version is reused, not copied.
        chart_target, chart = found["Matplotlib"]
        again: dict[str, Any] = await code.run_code.impl(
            ctx, language="python", code=chart, artifact_targets=[chart_target])
        rerun = again["files"][0]
        assert (rerun["artifact_id"], rerun["version"], rerun["reused"]) == (
            saved[chart_target]["artifact_id"], 1, True)
        assert await artifacts.count_versions(rerun["artifact_id"]) == 1
    finally:
        await store.dispose()
