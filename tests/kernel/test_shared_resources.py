"""The turn's authorized files in REAL jailed kernels: a read-only projection, a manifest in
the environment only while there are files, and a digest check before anything runs.

These tests drive :class:`RunCodeService` directly with a :class:`ResourceGrant` (the host's
port); ``tests/api/test_attachments.py`` drives the same path from a REST message through the
real store and a model's run_code call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from kaizen_kernel.provisioner import find_bwrap
from kaizen_kernel.resources import FetchedVersion, Fetcher, ResourceGrant
from kaizen_kernel.schema import INPUT_SCHEMA, RunCodeArgumentsError
from kaizen_kernel.service import RunCodeConfig, RunCodeService
from kaizen_server_extension.protocol.tools import FailureDomain
from kaizen_server_extension.resources import AdmittedResources, SharedResource
from tests.kernel.conftest import TEST_BUDGET, TEST_LIMITS

pytestmark = [
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.skipif(find_bwrap() is None, reason="the read-only mount needs bubblewrap"),
]

REPORT = """
import errno, hashlib, json, os
out = {"dir": os.environ.get("KAIZEN_SHARED_RESOURCES_DIR"),
       "manifest": os.environ.get("KAIZEN_SHARED_RESOURCES_MANIFEST")}
if out["manifest"]:
    entries = json.loads(out["manifest"])
    out["read"] = [hashlib.sha256(open(e["path"], "rb").read()).hexdigest() for e in entries]
    for attempt, target in (("overwrite", entries[0]["path"]),
                            ("create", os.path.join(out["dir"], "new.txt"))):
        try:
            with open(target, "w") as handle:
                handle.write("tampered")
            out[attempt] = "written"
        except OSError as exc:
            out[attempt] = errno.errorcode[exc.errno]
print(json.dumps(out))
"""

CSV = b"region,total\nnorth,12\nsouth,30\n"
NOTES = b"# Notes\n\nsecret-looking body text\n"


def _pinned(reference: str, content: bytes, filename: str, media_type: str,
            version: int = 1) -> SharedResource:
    return SharedResource(reference_id=reference, kind="artifact", version=version,
                          sha256=hashlib.sha256(content).hexdigest(), filename=filename,
                          media_type=media_type, size=len(content))


@dataclasses.dataclass
class FakeArtifacts:
    """The host's fetcher over an in-memory version table: (id, version) -> bytes."""

    versions: dict[tuple[str, int], bytes]
    fetched: list[tuple[str, int]] = dataclasses.field(default_factory=list)

    async def fetch(self, pinned: SharedResource) -> FetchedVersion:
        self.fetched.append((pinned.reference_id, pinned.version))
        content = self.versions.get((pinned.reference_id, pinned.version))
        if content is None:
            raise LookupError(pinned.reference_id)
        return FetchedVersion(pinned.version, pinned.media_type, content)


def _grant(store: FakeArtifacts, *resources: SharedResource) -> ResourceGrant:
    return ResourceGrant(AdmittedResources.of(resources), store.fetch)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def jailed(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunCodeService]:
    """A service whose kernels run in the bubblewrap jail (as the server's do)."""
    service = RunCodeService(RunCodeConfig(
        state_root=tmp_path_factory.mktemp("kaizen-shared"), budget=TEST_BUDGET,
        process_limits=TEST_LIMITS, jail="required", pool_sizes={"python": 0}))
    await service.start()
    try:
        yield service
    finally:
        await service.close()


async def _report(service: RunCodeService, conversation: str, grant: ResourceGrant | None,
                  persistent: bool = False) -> dict[str, object]:
    result = await service.run("alice", conversation, REPORT, "python", persistent, [],
                               resources=grant)
    assert result.status == "ok", result
    return dict(json.loads(result.stdout))


@pytest.mark.rule("R-175", "R-176", "R-454")
async def test_files_are_projected_read_only_outside_the_workspace(
        jailed: RunCodeService) -> None:
    store = FakeArtifacts({("a1", 1): CSV, ("a2", 3): NOTES})
    grant = _grant(store, _pinned("a1", CSV, "sales.csv", "text/csv"),
                   _pinned("a2", NOTES, "Notes.md", "text/markdown", version=3))
    result = await jailed.run("alice", "conv-files", REPORT, "python", False, [],
                              resources=grant)
    assert result.status == "ok", result
    seen = json.loads(result.stdout)
    manifest = json.loads(seen["manifest"])
    assert [(e["reference_id"], e["version"], e["filename"], e["media_type"], e["size"],
             e["kind"]) for e in manifest] == [
        ("a1", 1, "sales.csv", "text/csv", len(CSV), "artifact"),
        ("a2", 3, "Notes.md", "text/markdown", len(NOTES), "artifact")]
    assert [e["sha256"] for e in manifest] == seen["read"] == [
        hashlib.sha256(CSV).hexdigest(), hashlib.sha256(NOTES).hexdigest()]
    directory = Path(seen["dir"])
    assert all(Path(e["path"]).parent == directory for e in manifest)
    workspace = jailed.workspace("alice", "conv-files")
    assert not directory.is_relative_to(workspace)  # server-assigned, outside the workspace
    # The jail mounts it read-only: neither an overwrite nor a new file gets in.
    assert seen["overwrite"] == seen["create"] == "EROFS"
    assert (directory / "sales.csv").read_bytes() == CSV
    assert not (directory / "new.txt").exists()
    # The bounded list the call (and so its audit) reports: identities, never bytes.
    assert result.resources == [
        {"reference_id": "a1", "version": 1, "sha256": hashlib.sha256(CSV).hexdigest(),
         "size": len(CSV)},
        {"reference_id": "a2", "version": 3, "sha256": hashlib.sha256(NOTES).hexdigest(),
         "size": len(NOTES)}]
    payload = json.dumps(result.to_payload())
    assert "north,12" not in payload and "secret-looking" not in payload


@pytest.mark.rule("R-175")
async def test_both_variables_are_absent_without_files_even_in_a_reused_kernel(
        jailed: RunCodeService) -> None:
    assert await _report(jailed, "conv-none", None) == {"dir": None, "manifest": None}
    store = FakeArtifacts({("a1", 1): CSV})
    with_files = await _report(jailed, "conv-persist",
                               _grant(store, _pinned("a1", CSV, "sales.csv", "text/csv")),
                               persistent=True)
    assert with_files["dir"] and with_files["manifest"]
    directory = Path(str(with_files["dir"]))
    # The same persistent kernel serves a later turn that attached nothing.
    later = await _report(jailed, "conv-persist", None, persistent=True)
    assert later == {"dir": None, "manifest": None}
    assert not any(directory.iterdir())  # noqa: ASYNC240 - and its files are gone
    # Written once per kernel: the same files on later calls are verified, not rewritten.
    again = _grant(store, _pinned("a1", CSV, "sales.csv", "text/csv"))
    await _report(jailed, "conv-persist", again, persistent=True)
    first = (directory / "sales.csv").stat().st_ino
    fetched = len(store.fetched)
    await _report(jailed, "conv-persist", again, persistent=True)
    assert (directory / "sales.csv").stat().st_ino == first
    assert len(store.fetched) == fetched + 1  # but verified against the store every call


MARKER = "import pathlib\npathlib.Path('ran.txt').write_text('the program ran')\n"


@pytest.mark.rule("R-455")
async def test_a_forged_or_changed_manifest_is_refused_before_anything_runs(
        jailed: RunCodeService) -> None:
    workspace = jailed.workspace("alice", "conv-forged")
    store = FakeArtifacts({("a1", 1): CSV, ("a1", 2): b"region,total\nnorth,99\n"})
    honest = _pinned("a1", CSV, "sales.csv", "text/csv")
    cases = {
        # A list whose digest is not its own.
        "forged digest": ResourceGrant(
            dataclasses.replace(AdmittedResources.of([honest]), digest="0" * 64), store.fetch),
        # A list claiming bytes the pinned version does not have.
        "forged sha256": _grant(store, dataclasses.replace(honest, sha256="f" * 64)),
        # The fetch answers with another version than the admitted one.
        "new version": ResourceGrant(AdmittedResources.of([honest]), _newer(store)),
        # The file is no longer readable by the member.
        "gone": _grant(FakeArtifacts({}), honest),
    }
    for label, grant in cases.items():
        result = await jailed.run("alice", "conv-forged", MARKER, "python", False, [],
                                  resources=grant)
        assert result.status == "error", label
        assert result.code in ("resource_manifest_mismatch", "resource_unavailable"), label
        assert result.failure_domain == FailureDomain.TOOL
        assert "nothing was run" in result.message
        assert not (workspace / "ran.txt").exists(), label
    # The honest grant of the same file runs.
    ok = await jailed.run("alice", "conv-forged", MARKER, "python", False, [],
                          resources=_grant(store, honest))
    assert ok.status == "ok" and (workspace / "ran.txt").exists()


def _newer(store: FakeArtifacts) -> Fetcher:
    """A fetcher that answers with the latest version instead of the pinned one."""

    async def fetch(pinned: SharedResource) -> FetchedVersion:
        latest = max(v for (ref, v) in store.versions if ref == pinned.reference_id)
        return FetchedVersion(latest, pinned.media_type,
                              store.versions[(pinned.reference_id, latest)])
    return fetch


@pytest.mark.rule("R-456")
async def test_arguments_cannot_name_a_file(jailed: RunCodeService) -> None:
    # The schema has no field that could carry a file; an extra one is a schema error.
    assert set(INPUT_SCHEMA["properties"]) == {"code", "language", "persistent",
                                               "artifact_targets"}
    for extra in ({"resources": ["a1"]}, {"attachments": ["a1"]},
                  {"shared_resources_dir": "/etc"}):
        with pytest.raises(RunCodeArgumentsError):
            await jailed.run_arguments("alice", "conv-args", {
                "code": "print(1)", "artifact_targets": [], **extra})
    # A path or id inside the code itself grants nothing: still no variables.
    seen = await _report(jailed, "conv-args", None)
    assert seen == {"dir": None, "manifest": None}


async def test_the_contract_tells_the_model_where_the_files_are() -> None:
    from kaizen_plugins.code import run_code

    for text in (run_code.descriptor.description,
                 INPUT_SCHEMA["properties"]["code"]["description"]):
        assert "in the working directory under their own names" in text
        assert "KAIZEN_SHARED_RESOURCES_MANIFEST" in text
