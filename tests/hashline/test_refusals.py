"""Every refusal of the brief, tried and seen refused with the workspace untouched, and the
all-or-nothing commit with a fault-injected filesystem layer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kaizen_hashline import HashlineError, WorkspaceFS, WorkspaceKey, canonical_path
from tests.hashline.support import SETTINGS, Workspace


def refused(ws: Workspace, program: str, code: str) -> HashlineError:
    before = ws.tree()
    with pytest.raises(HashlineError) as err:
        ws.edit(program)
    assert err.value.code == code, str(err.value)
    assert ws.tree() == before, "a refused edit changed the workspace"
    return err.value


@pytest.mark.rule("R-086", "R-155")
@pytest.mark.parametrize("path", ["/etc/passwd", "~/x", "C:/x", "../x", "a/../../x", "a\\b",
                                  "a\x00b", "", "./", ".kaizen-hl-abc"])
def test_bad_paths_are_refused_on_read_and_edit(app: Workspace, path: str):
    with pytest.raises(HashlineError) as err:
        app.read(path)
    assert err.value.code == "path_refused" and err.value.domain == "caller"
    if path.strip() and "\x00" not in path:
        refused(app, f"[{path}#BC00]\nPUT 1.=1:\n+x\n", "path_refused")


def test_canonical_paths():
    assert canonical_path("./a//b/./c.py") == "a/b/c.py"


@pytest.mark.rule("R-086", "R-155")
def test_symlinked_file_is_refused_even_inside_the_workspace(app: Workspace):
    (app.root / "link.py").symlink_to(app.root / "app" / "settings.py")
    with pytest.raises(HashlineError) as err:
        app.read("link.py")
    assert err.value.code == "path_refused" and "symlink" in str(err.value)
    refused(app, "[link.py#BC00]\nPUT 3.=3:\n+x\n", "path_refused")


@pytest.mark.rule("R-086", "R-155")
def test_symlinked_directory_anywhere_on_the_path_is_refused(app: Workspace, tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "settings.py").write_text(SETTINGS)
    (app.root / "out").symlink_to(outside)
    (app.root / "inner").symlink_to(app.root / "app")
    for path in ("out/settings.py", "inner/settings.py"):
        with pytest.raises(HashlineError) as err:
            app.read(path)
        assert err.value.code == "path_refused" and "symlink" in str(err.value)
        refused(app, f"[{path}#BC00]\nPUT 3.=3:\n+x\n", "path_refused")
    assert (outside / "settings.py").read_text() == SETTINGS


@pytest.mark.rule("R-155")
def test_move_destination_is_revalidated(app: Workspace, tmp_path: Path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (app.root / "out").symlink_to(outside)
    (app.root / "dest-link.py").symlink_to(outside / "x.py")
    refused(app, "[app/settings.py#BC00]\nMV ../escape.py\n", "path_refused")
    refused(app, "[app/settings.py#BC00]\nMV /tmp/escape.py\n", "path_refused")
    refused(app, "[app/settings.py#BC00]\nMV out/escape.py\n", "path_refused")
    refused(app, "[app/settings.py#BC00]\nMV dest-link.py\n", "path_refused")
    (app.root / "adir").mkdir()
    refused(app, "[app/settings.py#BC00]\nMV adir\n", "path_refused")
    assert list(outside.iterdir()) == []


@pytest.mark.rule("R-086")
def test_duplicate_destinations_are_refused(app: Workspace):
    refused(app, "[app/settings.py#BC00]\nMV app/x.py\n[app/util.py#D831]\nMV app/x.py\n",
            "duplicate_destination")
    refused(app, "[app/settings.py#BC00]\nMV app/util.py\n[app/util.py#D831]\nPUT 1.=1:\n"
            "+y\n", "duplicate_destination")


@pytest.mark.rule("R-086", "R-157")
def test_files_over_two_mib_are_refused(ws: Workspace):
    ws.write("big.txt", "x" * (2 * 1024 * 1024 + 1))
    with pytest.raises(HashlineError) as err:
        ws.read("big.txt")
    assert err.value.code == "file_too_large"
    refused(ws, "[big.txt#0000]\nPUT 1.=1:\n+y\n", "file_too_large")
    # An edit may not grow a file past the limit either.
    ws.write("near.txt", "y" * (2 * 1024 * 1024 - 10) + "\n")
    tag = ws.read("near.txt").tag
    refused(ws, f"[near.txt#{tag}]\nPUT >$:\n+{'z' * 20}\n", "file_too_large")


@pytest.mark.rule("R-082", "R-086")
def test_a_tag_never_issued_for_the_path_is_refused(app: Workspace):
    app.write("fresh.py", SETTINGS)  # hashes to BC00 too, but was never read at this path
    err = refused(app, "[fresh.py#BC00]\nPUT 3.=3:\n+x\n", "unknown_tag")
    assert "not from this session" in str(err)
    refused(app, "[app/settings.py#ABCD]\nPUT 3.=3:\n+x\n", "unknown_tag")


@pytest.mark.rule("R-084")
def test_a_tag_from_another_member_or_conversation_cannot_widen_a_write(app: Workspace):
    # Bob's identical workspace content: Alice's tag resolves only in Alice's namespace.
    for key in (WorkspaceKey("bob", "conv-1"), WorkspaceKey("alice", "conv-2")):
        other = Workspace(app.root, state=app.state, key=key)
        refused(other, "[app/settings.py#BC00]\nPUT 3.=3:\n+x\n", "unknown_tag")


@pytest.mark.rule("R-084")
def test_expired_history_cannot_be_used(app: Workspace):
    for i in range(4):  # four newer versions push BC00 out of the 4-version history
        app.write("app/settings.py", SETTINGS + f"# {i}\n")
        app.read("app/settings.py")
    assert all(v.tag != "BC00" for v in app.state.versions(app.key, "app/settings.py"))
    app.write("app/settings.py", SETTINGS)
    refused(app, "[app/settings.py#BC00]\nPUT 3.=3:\n+x\n", "unknown_tag")


@pytest.mark.rule("R-084")
def test_colliding_content_goes_through_recovery_not_the_fresh_path(app: Workspace):
    # Forge a collision: the retained BC00 text differs from a live file hashing to BC00 is
    # simulated by editing the retained version's text in trusted state.
    (version,) = app.state.versions(app.key, "app/settings.py")
    version.text = SETTINGS.replace("RETRIES = 3", "RETRIES = 7")
    refused(app, "[app/settings.py#BC00]\nPUT 4.=4:\n+RETRIES = 9\n", "stale_tag")


def test_missing_file_not_text_and_directory(ws: Workspace):
    refused(ws, "[nope.txt#0000]\nPUT 1.=1:\n+x\n", "not_found")
    ws.write("bin.dat", b"\x00\x01\x02")
    with pytest.raises(HashlineError) as err:
        ws.read("bin.dat")
    assert err.value.code == "not_text"
    (ws.root / "d").mkdir()
    with pytest.raises(HashlineError) as err:
        ws.read("d")
    assert err.value.code == "path_refused"


@pytest.mark.rule("R-086")
def test_unseen_anchor_in_a_later_section_writes_nothing(ws: Workspace):
    ws.write("a.txt", "1\n2\n3\n")
    ws.write("b.txt", "".join(f"{i}\n" for i in range(50)))
    ta = ws.read("a.txt").tag
    tb = ws.read("b.txt", limit=2).tag
    refused(ws, f"[a.txt#{ta}]\nPUT 1.=1:\n+x\n[b.txt#{tb}]\nCUT 30.=45\n", "unseen_anchor")


# --- commit failures and rollback --------------------------------------------------------------

class FaultyFS(WorkspaceFS):
    """Fails the ``fail_at``-th call of one primitive (once)."""

    def __init__(self, root: Path, primitive: str, fail_at: int) -> None:
        super().__init__(root)
        self.primitive = primitive
        self.fail_at = fail_at
        self.calls: dict[str, int] = {}

    def _tick(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if name == self.primitive and self.calls[name] == self.fail_at:
            raise OSError(28, "No space left on device (injected)")

    def _write_temp(self, dir_fd: int, name: str, data: bytes, mode: int) -> None:
        self._tick("write_temp")
        super()._write_temp(dir_fd, name, data, mode)

    def _rename(self, src_fd: int, src: str, dst_fd: int, dst: str) -> None:
        self._tick("rename")
        super()._rename(src_fd, src, dst_fd, dst)

    def _unlink(self, dir_fd: int, name: str) -> None:
        self._tick("unlink")
        super()._unlink(dir_fd, name)

    def _mkdir(self, dir_fd: int, name: str) -> None:
        self._tick("mkdir")
        super()._mkdir(dir_fd, name)


BATCH = ("[app/settings.py#BC00]\nPUT 3.=3:\n+TIMEOUT = 1\n"
         "[notes.txt#{notes}]\nCUT 1.=1 @kept\n"
         "[app/util.py#D831]\nPUT 1.=1:\n+def helper(y):\nMV lib/deep/util.py\n"
         "[gone.txt#{gone}]\nREM\n")


@pytest.mark.rule("R-087", "R-156")
@pytest.mark.parametrize(("primitive", "fail_at"), [
    ("write_temp", 1), ("write_temp", 3), ("mkdir", 2), ("rename", 1), ("rename", 2),
    ("rename", 3), ("unlink", 1), ("unlink", 2),
])
def test_a_failure_anywhere_in_the_commit_rolls_the_whole_batch_back(
        app: Workspace, primitive: str, fail_at: int):
    app.write("notes.txt", "keep me\nand me\n")
    app.write("gone.txt", "bye\n")
    program = BATCH.format(notes=app.read("notes.txt").tag, gone=app.read("gone.txt").tag)
    before = app.tree()
    registers = app.state.registers(app.key)
    app.fs = FaultyFS(app.root, primitive, fail_at)
    with pytest.raises(HashlineError) as err:
        app.edit(program)
    assert err.value.code == "commit_failed" and err.value.domain == "tool"
    assert "nothing changed" in str(err.value)
    assert app.tree() == before  # no temp files, no created directories, every byte restored
    assert app.state.registers(app.key) == registers  # @kept was not published
    # The same batch goes through once the fault is gone.
    app.fs = WorkspaceFS(app.root)
    app.edit(program)
    assert not (app.root / "gone.txt").exists()
    assert (app.root / "lib/deep/util.py").read_text().startswith("def helper(y):")
    assert app.state.registers(app.key) == {"kept": ("keep me",)}


@pytest.mark.rule("R-087")
def test_a_file_changed_during_the_commit_aborts_the_batch(app: Workspace):
    class Racing(WorkspaceFS):
        def _write_temp(self, dir_fd: int, name: str, data: bytes, mode: int) -> None:
            super()._write_temp(dir_fd, name, data, mode)
            path = app.root / "app" / "util.py"
            if path.read_text() != "raced\n":
                path.write_text("raced\n")

    app.fs = Racing(app.root)
    with pytest.raises(HashlineError) as err:
        app.edit("[app/settings.py#BC00]\nPUT 3.=3:\n+TIMEOUT = 1\n"
                 "[app/util.py#D831]\nPUT 1.=1:\n+def helper(y):\n")
    assert err.value.code == "concurrent_change"
    assert app.text("app/settings.py") == SETTINGS
    assert app.text("app/util.py") == "raced\n"
    assert not [n for n in os.listdir(app.root / "app") if n.startswith(".kaizen-hl-")]


@pytest.mark.rule("R-083")
def test_trusted_state_stays_outside_the_workspace(app: Workspace):
    app.edit("[app/util.py#D831]\nCUT 4.=5 @later\n")
    assert sorted(app.tree()) == ["app", "app/settings.py", "app/util.py"]
    # Registers and retained versions live in the state object, which outlives the lease
    # directory: a fresh workspace directory for the same key still sees them.
    assert app.state.registers(app.key) == {"later": ("def unused():", "    pass")}
    assert [v.tag for v in app.state.versions(app.key, "app/settings.py")] == ["BC00"]
