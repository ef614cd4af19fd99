"""The member's Jupyter files as run_code inputs, and artifacts saved back, through REST
against a real server: the ContentsManager reads (never browser bytes), the path rules
(``..``, absolute paths, hidden files, symlinks out of the root, the size bound), the copy as
a member-owned artifact version, its projection into run_code's working directory under its
own name (read-only), and "save next to the notebook" without silent overwrites."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kaizen_kernel.provisioner import find_bwrap
from kaizen_server_extension.settings import MAX_JUPYTER_FILE_BYTES, KaizenSettings, SettingsError
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, WriteContext
from kaizen_server_extension.store.store import Store
from tests.conftest import BACKENDS, scripted_server, with_server_store
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.server import ServerProcess

SALES = "region,units\nnorth,12\nsouth,30\n"

# The program the scripted model sends: it reads the attached file by its own name with the
# csv module, tries to change it, and reports what it found.
READ_SALES = """
import csv, os
with open("sales.csv", newline="") as f:
    total = sum(int(row["units"]) for row in csv.DictReader(f))
try:
    with open("sales.csv", "a") as f:
        f.write("east,1\\n")
    written = "wrote"
except OSError as exc:
    written = type(exc).__name__
print(json.dumps({"total": total, "written": written, "link": os.path.islink("sales.csv")}))
""".replace("import csv, os", "import csv, json, os")
LOOK_AGAIN = """
import json, os
print(json.dumps({"exists": os.path.lexists("sales.csv")}))
"""


def _run_code(code: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_code", "arguments": {
        "code": code, "language": "python", "persistent": True, "artifact_targets": []}}]}


SCRIPTS: list[dict[str, Any]] = [
    {"match": "total units", "responses": [_run_code(READ_SALES), {"text": "42 units."}]},
    {"match": "look again", "responses": [_run_code(LOOK_AGAIN), {"text": "Looked."}]},
    {"responses": [{"text": "Default answer."}]},
]


def _root(server: ServerProcess) -> Path:
    """The Jupyter server's root directory (tests/support/server.py: root_dir)."""
    return Path(server.env["JUPYTER_DATA_DIR"]).parent


@pytest.fixture(scope="module", params=BACKENDS)
def files_server(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp(f"files-{request.param}")
    with scripted_server(str(request.param), root, SCRIPTS) as proc:
        yield proc


@pytest.fixture(scope="module")
def tree(files_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files under the root, and one outside it that a symlink inside points to."""
    root = _root(files_server)
    (root / "work").mkdir()
    (root / "work" / "sales.csv").write_text(SALES)
    (root / "work" / "nested").mkdir()
    (root / ".secret").mkdir()
    (root / ".secret" / "keys.csv").write_text("k,v\n")
    (root / "work" / ".hidden.csv").write_text("h\n")
    outside = tmp_path_factory.mktemp("outside")
    (outside / "passwd.csv").write_text("root:x:0:0\n")
    (root / "work" / "escape.csv").symlink_to(outside / "passwd.csv")
    (root / "work" / "outdir").symlink_to(outside, target_is_directory=True)
    (root / "work" / "peek.csv").symlink_to(root / ".secret" / "keys.csv")
    (root / "work" / "inside.csv").symlink_to(root / "work" / "sales.csv")
    # Sparse: over the 25 MiB bound without writing 25 MiB.
    with (root / "work" / "huge.bin").open("wb") as big:
        big.truncate(MAX_JUPYTER_FILE_BYTES + 1)
    return root


def _read(client: httpx.Client, path: str) -> httpx.Response:
    return client.post("jupyter-files", json={"path": path})


def test_a_file_is_read_through_the_contents_manager_into_a_member_owned_artifact(
        files_server: ServerProcess, tree: Path) -> None:
    with files_server.client("alice") as alice, files_server.client("bob") as bob:
        first = _read(alice, "work/sales.csv")
        assert first.status_code == 201, first.text
        body = first.json()
        artifact = body["artifact"]
        assert (body["path"], body["reused"]) == ("work/sales.csv", False)
        assert (artifact["kind"], artifact["title"], artifact["mime"], artifact["size"],
                artifact["owner"], artifact["version"], artifact["room_id"]) == (
            "file", "sales.csv", "text/csv", len(SALES), "alice", 1, None)
        download = alice.get(f"artifacts/{artifact['id']}/download")
        assert download.content == SALES.encode()
        # Unchanged bytes: the same version again, nothing new stored.
        again = _read(alice, "work/sales.csv")
        assert again.status_code == 200 and again.json()["reused"] is True
        assert again.json()["artifact"]["version"] == 1
        # A symlink that stays inside the root is an ordinary file.
        assert _read(alice, "work/inside.csv").status_code == 201
        # Changed on disk: the next version of the same artifact.
        (tree / "work" / "sales.csv").write_text(SALES + "west,5\n")
        try:
            changed = _read(alice, "work/sales.csv")
            assert changed.status_code == 201
            assert (changed.json()["artifact"]["id"], changed.json()["artifact"]["version"]) \
                == (artifact["id"], 2)
        finally:
            (tree / "work" / "sales.csv").write_text(SALES)
        # The copy is alice's alone: another member cannot see it.
        assert bob.get(f"artifacts/{artifact['id']}").status_code == 404
        assert artifact["id"] not in [a["id"] for a in bob.get("artifacts").json()]


@pytest.mark.parametrize(("path", "status", "code"), [
    ("../outside.csv", 400, "invalid_path"),
    ("work/../../etc/passwd", 400, "invalid_path"),
    ("work/./sales.csv", 400, "invalid_path"),
    ("/etc/passwd", 400, "invalid_path"),
    ("~/notes.csv", 400, "invalid_path"),
    ("C:/Windows/win.ini", 400, "invalid_path"),
    ("work//sales.csv", 400, "invalid_path"),
    ("data\\sales.csv", 400, "invalid_path"),
    (".secret/keys.csv", 403, "hidden_path"),
    ("work/.hidden.csv", 403, "hidden_path"),
    ("work/escape.csv", 403, "outside_root"),
    ("work/outdir/passwd.csv", 403, "outside_root"),
    ("work/peek.csv", 403, "hidden_path"),
    ("work/nested", 400, "not_a_file"),
    ("work/missing.csv", 404, "file_not_found"),
    ("work/huge.bin", 413, "file_too_large"),
], ids=lambda v: str(v))
def test_paths_outside_the_rules_are_refused_and_store_nothing(
        files_server: ServerProcess, tree: Path, path: str, status: int, code: str) -> None:
    with files_server.client("carol") as carol:
        before = carol.get("artifacts").json()
        refused = _read(carol, path)
        assert refused.status_code == status, refused.text
        error = refused.json()["error"]
        assert error["code"] == code, error
        # Member-safe: no server path or exception text in the sentence.
        assert str(tree) not in error["message"] and "Traceback" not in error["message"]
        if code == "file_too_large":
            assert "25.0 MiB" in error["message"]
            assert "KAIZEN_JUPYTER_FILE_MAX_BYTES" in error["message"]
        assert carol.get("artifacts").json() == before


def test_the_size_bound_is_a_setting_no_larger_than_an_artifact_version() -> None:
    assert KaizenSettings.from_environ({}).KAIZEN_JUPYTER_FILE_MAX_BYTES == \
        MAX_JUPYTER_FILE_BYTES
    with pytest.raises(SettingsError, match="KAIZEN_JUPYTER_FILE_MAX_BYTES"):
        KaizenSettings.from_environ({"KAIZEN_JUPYTER_FILE_MAX_BYTES":
                                     str(MAX_JUPYTER_FILE_BYTES + 1)})
    from kaizen_server_extension.store.artifacts.repository import MAX_FILE_BYTES

    assert MAX_JUPYTER_FILE_BYTES == MAX_FILE_BYTES


def _save(client: httpx.Client, artifact_id: str, path: str, **extra: Any) -> httpx.Response:
    return client.post(f"artifacts/{artifact_id}/save-to-jupyter", json={"path": path, **extra})


def test_an_artifact_is_saved_into_the_jupyter_tree_never_over_a_file_unasked(
        files_server: ServerProcess, tree: Path) -> None:
    with files_server.client("dave") as dave, files_server.client("bob") as bob:
        artifact = _read(dave, "work/sales.csv").json()["artifact"]
        (tree / "out").mkdir(exist_ok=True)
        saved = _save(dave, artifact["id"], "out/sales-copy.csv")
        assert saved.status_code == 201, saved.text
        assert saved.json() == {"path": "out/sales-copy.csv", "name": "sales-copy.csv",
                                "size": len(SALES), "overwritten": False,
                                "artifact_id": artifact["id"], "version": 1}
        assert (tree / "out" / "sales-copy.csv").read_text() == SALES
        # The file is there now: no silent overwrite, and nothing changes.
        (tree / "out" / "sales-copy.csv").write_text("mine\n")
        exists = _save(dave, artifact["id"], "out/sales-copy.csv")
        assert exists.status_code == 409 and exists.json()["error"]["code"] == "file_exists"
        assert (tree / "out" / "sales-copy.csv").read_text() == "mine\n"
        # Only with the explicit choice; an exact version may be named.
        replaced = _save(dave, artifact["id"], "out/sales-copy.csv", overwrite=True, version=1)
        assert replaced.status_code == 201 and replaced.json()["overwritten"] is True
        assert (tree / "out" / "sales-copy.csv").read_text() == SALES

        for path, status, code in [
            ("../sales.csv", 400, "invalid_path"),
            ("/tmp/sales.csv", 400, "invalid_path"),
            (".hidden/sales.csv", 403, "hidden_path"),
            ("out/.sales.csv", 403, "hidden_path"),
            ("work/outdir/sales.csv", 403, "outside_root"),
            ("work/escape.csv", 403, "outside_root"),
            ("no-such-folder/sales.csv", 404, "folder_not_found"),
            ("out", 409, "not_a_file"),
        ]:
            refused = _save(dave, artifact["id"], path, overwrite=True)
            assert (refused.status_code, refused.json()["error"]["code"]) == (status, code), (
                path, refused.text)
        assert not list((tree / "work" / "outdir").glob("sales*"))
        assert (tree / "work" / "escape.csv").read_text() == "root:x:0:0\n"
        # Another member's artifact is not theirs to save: invisible, so 404.
        foreign = _save(bob, artifact["id"], "out/bobs.csv")
        assert foreign.status_code == 404
        assert not (tree / "out" / "bobs.csv").exists()


def test_a_room_members_artifact_is_saved_by_its_owner_only(
        files_server: ServerProcess, tree: Path) -> None:
    with files_server.client("alice") as alice, files_server.client("bob") as bob:
        room = _room(alice, shared=True)
        assert alice.post(f"conversations/{room}/participants",
                          json={"member": "bob"}).status_code == 200

        async def make(store: Store) -> str:
            record = await ArtifactStore(store).create(
                "alice", title="Room note", kind="markdown", content="# Shared\n",
                where=WriteContext(conversation_id=room))
            return record.artifact_id

        artifact_id = with_server_store(files_server, make)
        # bob sees it through the room, but it is alice's to save.
        assert bob.get(f"artifacts/{artifact_id}", params={"conversation_id": room}
                       ).status_code == 200
        refused = _save(bob, artifact_id, "room-note.md")
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "not_owner"
        assert not (tree / "room-note.md").exists()
        assert _save(alice, artifact_id, "room-note.md").status_code == 201
        assert (tree / "room-note.md").read_text() == "# Shared\n"


def test_the_routes_are_in_the_openapi_document(files_server: ServerProcess) -> None:
    with files_server.client("alice") as alice:
        paths = alice.get("openapi.json").json()["paths"]
    assert "post" in paths["/kaizen/api/jupyter-files"]
    assert "post" in paths["/kaizen/api/artifacts/{artifact_id}/save-to-jupyter"]


@pytest.mark.rule("R-175", "R-454", "R-455", "R-456")
def test_an_attached_jupyter_file_is_read_by_name_in_run_code_and_only_in_its_turn(
        files_server: ServerProcess, tree: Path) -> None:
    """The file read through the ContentsManager is pinned to the message and appears in the
    run's working directory under its own name, read-only; the next turn, without it, does
    not see it (the persistent kernel's link is gone)."""
    with files_server.client("alice") as alice:
        artifact = _read(alice, "work/sales.csv").json()["artifact"]
        room = _room(alice)
        accepted = _send(alice, room, "total units in the sales file?",
                         attachments=[artifact["id"]])
        run = _settled(alice, accepted["run_id"], timeout=120)
        assert run["status"] == "completed", run
        events = _events(alice, room, accepted["run_id"])
        [pinned] = [e["data"]["attachments"] for e in events if e["type"] == "input.accepted"]
        assert [(p["reference_id"], p["version"], p["filename"], p["media_type"])
                for p in pinned] == [(artifact["id"], artifact["version"], "sales.csv", "text/csv")]
        [settled] = [e["data"] for e in events if e["type"] == "tool.settled"]
        assert settled["outcome"] == "ok", settled
        found = json.loads(json.loads(settled["content"])["stdout"])
        assert found["total"] == 42 and found["link"] is True
        # The copy is read-only: EROFS inside the jail, EACCES without it (where the server
        # runs as root without a jail, the mode bits alone cannot stop the program).
        if find_bwrap() is not None or os.geteuid() != 0:
            assert found["written"] in ("PermissionError", "OSError"), found

        later = _send(alice, room, "look again please")
        assert _settled(alice, later["run_id"], timeout=120)["status"] == "completed"
        [look] = [e["data"] for e in _events(alice, room, later["run_id"])
                  if e["type"] == "tool.settled"]
        assert json.loads(json.loads(look["content"])["stdout"]) == {"exists": False}
    # The Jupyter file itself is untouched.
    assert (tree / "work" / "sales.csv").read_text() == SALES
    assert os.path.isfile(tree / "work" / "sales.csv")
