"""The kernel-side rule that puts a call's shared files in the working directory under their
own names (``prelude_py._link_shared_files``), run in-process on real directories: links into
the read-only copies, the program's own files left alone, and links of earlier calls (this
kernel's, or a former kernel's of the same workspace) removed before new ones are made."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kaizen_kernel import prelude_py


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Path]:
    here = Path.cwd()
    space = tmp_path / "workspace"
    space.mkdir()
    os.chdir(space)
    saved = dict(prelude_py._state)
    prelude_py._state.update(links={}, resources_parent=None)
    try:
        yield space
    finally:
        os.chdir(here)
        prelude_py._state.clear()
        prelude_py._state.update(saved)


def _projection(tmp_path: Path, kernel: str, **files: str) -> tuple[str, str]:
    directory = tmp_path / "resources" / kernel
    directory.mkdir(parents=True)
    manifest = []
    for name, text in files.items():
        (directory / name).write_text(text)
        manifest.append({"path": str(directory / name), "filename": name})
    return str(directory), json.dumps(manifest)


def test_shared_files_appear_under_their_own_names(workspace: Path, tmp_path: Path) -> None:
    directory, manifest = _projection(tmp_path, "k1", **{"sales.csv": "a,b\n",
                                                         "notes.txt": "hi"})
    (workspace / "notes.txt").write_text("the program's own")
    prelude_py._link_shared_files(directory, manifest)
    assert os.readlink("sales.csv") == f"{directory}/sales.csv"
    assert Path("sales.csv").read_text() == "a,b\n"
    # A file of the program's own keeps its name; the copy stays at its manifest path.
    assert not Path("notes.txt").is_symlink() and Path("notes.txt").read_text() == \
        "the program's own"


def test_a_later_call_without_files_removes_the_links(workspace: Path, tmp_path: Path) -> None:
    directory, manifest = _projection(tmp_path, "k1", **{"sales.csv": "a,b\n"})
    prelude_py._link_shared_files(directory, manifest)
    prelude_py._link_shared_files(None, None)
    assert not os.path.lexists("sales.csv")


def test_a_former_kernels_links_go_and_the_programs_own_links_stay(
        workspace: Path, tmp_path: Path) -> None:
    old_dir, old_manifest = _projection(tmp_path, "k1", **{"old.csv": "1\n"})
    prelude_py._link_shared_files(old_dir, old_manifest)
    Path("mine.csv").symlink_to(tmp_path / "resources" / "k1" / "old.csv")  # not named alike
    # A new kernel of the same workspace (nothing remembered) with its own projection.
    prelude_py._state.update(links={}, resources_parent=None)
    new_dir, new_manifest = _projection(tmp_path, "k2", **{"sales.csv": "2\n"})
    prelude_py._link_shared_files(new_dir, new_manifest)
    assert not os.path.lexists("old.csv")
    assert Path("mine.csv").is_symlink()
    assert Path("sales.csv").read_text() == "2\n"


@pytest.mark.parametrize("name", ["../escape.csv", ".hidden", "", "a/b.csv"])
def test_names_that_are_not_flat_and_visible_are_never_linked(
        workspace: Path, tmp_path: Path, name: str) -> None:
    directory = tmp_path / "resources" / "k1"
    directory.mkdir(parents=True)
    manifest = json.dumps([{"path": str(directory / "x"), "filename": name}])
    prelude_py._link_shared_files(str(directory), manifest)
    assert list(workspace.iterdir()) == []
    assert not (tmp_path / "escape.csv").exists()
