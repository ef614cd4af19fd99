"""Governed (renderable-envelope) artifacts at the member boundary, through a real server
(spec guardrails: Structured artifact output).

A governed artifact's markings and renderer name are producer data: they never decide who
may read it (R-124). The member attach route pins a version for one turn; it never rebinds a
library result to the room it is attached in (R-128). The panel ships no governed iframe renderer
and no HTML sink (its one frame previews ordinary html/svg only, sandboxed without scripts), so
a governed result can only ever reach a browser as text, a native table or the inert JSON
download (R-121).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kaizen_server_extension.store.artifacts.content import (
    ValidationFailed,
    attest_trusted_result,
    validate_envelope,
)
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, WriteContext
from tests.artifacts.test_rest import _error, _with_store
from tests.support.server import ServerProcess, json_of

REPO = Path(__file__).resolve().parents[2]

# Markings and a renderer name that *claim* wide release. They are data; the ACL ignores them.
WIDE_CLAIMS: dict[str, Any] = {
    "version": 2, "renderer": "public_share", "title": "Release list",
    "text_fallback": "2 rows",
    "markings": {"overall": "UNCLASSIFIED//PUBLIC", "releasable_to": ["*", "bob", "carol"],
                 "acl": {"read": ["everyone"]}},
    "provenance": {"dataset": "d1"},
    "result": {"rows": [["a"], ["b"]]},
}


def _governed(server: ServerProcess, owner: str, envelope: dict[str, Any],
              room: str | None = None) -> str:
    async def seed(artifacts: ArtifactStore) -> str:
        validated = validate_envelope(envelope)
        record = await artifacts.create_governed(
            owner, validated, attest_trusted_result("call-conformance", validated),
            where=WriteContext(room))
        assert record.governed
        return record.artifact_id
    return _with_store(server, seed)


def _shared_room(client: Any, *members: str) -> str:
    created = client.post("conversations", json={"agent_id": "general", "shared": True})
    assert created.status_code == 201, created.text
    room = str(created.json()["id"])
    for member in members:
        added = client.post(f"conversations/{room}/participants", json={"member": member})
        assert added.status_code == 200, added.text
    return room


def _inputs(client: Any, room: str) -> int:
    events = json_of(client.get(f"conversations/{room}/journal",
                                params={"limit": 1000}))["events"]
    return sum(1 for e in events if e["type"] == "input.accepted")


@pytest.mark.rule("R-124")
def test_markings_and_renderer_names_do_not_widen_who_may_read(server: ServerProcess) -> None:
    with server.client("alice") as alice, server.client("bob") as bob, \
            server.client("carol") as carol:
        for client in (alice, bob, carol):
            assert client.get("agents").status_code == 200  # members exist
        room = _shared_room(alice, "bob")
        private = _governed(server, "alice", WIDE_CLAIMS)
        in_room = _governed(server, "alice", WIDE_CLAIMS, room=room)

        # The owner reads both, markings preserved exactly as data.
        assert json_of(alice.get(f"artifacts/{private}/download")) == WIDE_CLAIMS
        assert json_of(alice.get(f"artifacts/{in_room}"))["governed"] is True

        # "releasable_to: *", an "acl" marking and a "public_share" renderer grant nothing:
        # a private governed result stays the owner's, for every read route.
        for path in (f"artifacts/{private}", f"artifacts/{private}/versions/1",
                     f"artifacts/{private}/download",
                     f"artifacts/{private}/versions/1/download"):
            _error(bob.get(path), 404, "artifact_not_found")
            _error(carol.get(path), 404, "artifact_not_found")
        assert private not in {a["id"] for a in json_of(bob.get("artifacts"))}

        # Bound to a room: its participants read it, carol (named in the markings) does not.
        assert json_of(bob.get(f"artifacts/{in_room}",
                               params={"conversation_id": room}))["id"] == in_room
        for path in (f"artifacts/{in_room}", f"artifacts/{in_room}/download"):
            _error(carol.get(path), 404, "artifact_not_found")
        _error(carol.get("artifacts", params={"conversation_id": room}), 404)
        # Nor can carol pin it into a room of her own by naming it.
        hers = _shared_room(carol)
        refused = carol.post(f"conversations/{hers}/messages",
                             json={"text": "look", "attachments": [in_room]})
        _error(refused, 404, "attachment_not_found")


@pytest.mark.rule("R-128")
def test_the_attach_route_cannot_move_a_library_result_into_another_room(
        server: ServerProcess) -> None:
    with server.client("alice") as alice, server.client("bob") as bob, \
            server.client("carol") as carol:
        for client in (alice, bob, carol):
            assert client.get("agents").status_code == 200
        origin = _shared_room(alice, "bob")
        # A governed result the server-attested producer path scoped to room A.
        result = _governed(server, "alice", WIDE_CLAIMS | {"title": "Room A result"},
                           room=origin)
        before = json_of(alice.get(f"artifacts/{result}"))
        assert before["room_id"] == origin

        # bob may read it in room A, but attaching it in his own room B (with carol) is the
        # same 404 a missing id gets, and nothing is accepted there.
        other = _shared_room(bob, "carol")
        count = _inputs(bob, other)
        refused = bob.post(f"conversations/{other}/messages",
                           json={"text": "see this", "attachments": [result]})
        _error(refused, 404, "attachment_not_found")
        assert _inputs(bob, other) == count

        # The owner may attach her own result to a turn in room C (with carol): that pins a
        # version for her turn; it does not rebind the result to room C.
        third = _shared_room(alice, "carol")
        accepted = alice.post(f"conversations/{third}/messages",
                              json={"text": "use my result", "attachments": [result]})
        assert accepted.status_code == 202, accepted.text
        after = json_of(alice.get(f"artifacts/{result}"))
        assert (after["room_id"], after["conversation_id"], after["version"]) == (
            before["room_id"], before["conversation_id"], before["version"])
        assert after["versions"] == [1]
        _error(carol.get(f"artifacts/{result}", params={"conversation_id": third}), 404,
               "artifact_not_found")
        _error(carol.get(f"artifacts/{result}"), 404, "artifact_not_found")
        assert result not in {a["id"] for a in
                              json_of(carol.get("artifacts", params={"conversation_id": third}))}
        # Room A keeps it, exactly as before.
        assert [a["id"] for a in json_of(bob.get("artifacts",
                                                 params={"conversation_id": origin}))] \
            == [result]


# --- R-121: no governed iframe renderer ships ----------------------------------------------
# The panel has one frame: the preview of an ORDINARY html or svg artifact, sandboxed without
# any permission. R-121 forbids a governed renderer, so the scan proves that the frame lives
# in one module, has no permission and no messaging, refuses governed artifacts itself, and is
# reached only from the preview's ordinary "frame" branch, while the governed branch renders
# through a component with no frame, no markup and no rendermime.

PANEL_SRC = "labextension/src"
FRAME_MODULE = f"{PANEL_SRC}/components/SandboxedFrame.tsx"
PREVIEW_MODULE = f"{PANEL_SRC}/components/ArtifactPreview.tsx"
GOVERNED_MODULE = f"{PANEL_SRC}/components/GovernedArtifactView.tsx"
DECISION_MODULE = f"{PANEL_SRC}/artifacts.ts"

# Constructs a governed (or any producer-data) iframe renderer, or an HTML sink, would need.
_FRAME_CONSTRUCTS = {
    "an iframe element": re.compile(r"<iframe\b|createElement\(\s*['\"]iframe", re.I),
    "srcdoc": re.compile(r"\bsrcdoc\b", re.I),
}
_FORBIDDEN_IN_PANEL = {
    **_FRAME_CONSTRUCTS,
    "a frame's window": re.compile(r"\bcontentWindow\b|\bwindow\.frames\b"),
    "a cross-window postMessage": re.compile(r"\b(?:window|parent|opener|top|self)\s*"
                                             r"(?:\?\.|\.)\s*postMessage\b|\.contentWindow"),
    # A frame's READY/DELIVER arrive as window message events (a websocket's onmessage is not
    # one).
    "a window message listener": re.compile(
        r"addEventListener\(\s*['\"]message['\"]|\b(?:window|self|globalThis)\s*\.\s*"
        r"onmessage\s*=(?!=)"),
    "raw HTML injection": re.compile(r"dangerouslySetInnerHTML|\.(?:inner|outer)HTML\s*=(?!=)"
                                     r"|insertAdjacentHTML|document\.write\("),
    "trusted rendermime output": re.compile(r"trusted\s*:\s*true"),
}
_IMPORTS_FRAME = re.compile(r"from\s+['\"][./\w]*SandboxedFrame['\"]")
_IMPORTS_RENDERING = re.compile(r"from\s+['\"](?:[./\w]*(?:SandboxedFrame|Markdown)|"
                                r"@jupyterlab/rendermime)['\"]")
# The frame's refusal: an early return on the governed test, before the one <iframe>.
_FRAME_REFUSES_GOVERNED = re.compile(
    r"if\s*\((?:[^{]*\|\|\s*)?isGovernedArtifact\(artifact\)[^{]*\)\s*\{\s*return\b")
_IFRAME_ELEMENT = re.compile(r"<iframe\b[^>]*>", re.S)
# previewMode: the governed check is its first decision and answers 'governed'.
_GOVERNED_FIRST = re.compile(
    r"export function previewMode\([^{]*\{\s*(?://[^\n]*\n\s*)*"
    r"if\s*\(isGovernedArtifact\(artifact\)\)\s*\{\s*return 'governed';")


def _frame_violations(text: str) -> list[str]:
    """The one allowed frame: exactly one <iframe>, ``sandbox=""`` (no permission at all),
    and governed artifacts refused before it."""
    problems = []
    frames = _IFRAME_ELEMENT.findall(text)
    if len(frames) != 1:
        problems.append(f"{len(frames)} <iframe> elements (one allowed)")
    for frame in frames:
        if not re.search(r"\bsandbox=\"\"(?=[\s/>])", frame):
            problems.append("an iframe without sandbox=\"\"")
        if re.search(r"\bsrc=", frame):
            problems.append("an iframe loading a URL")
    if re.search(r"allow-|createElement\(\s*['\"]iframe", text, re.I):
        problems.append("a sandbox permission or a scripted frame")
    refusal = _FRAME_REFUSES_GOVERNED.search(text)
    if not refusal or (frames and refusal.start() > text.index(frames[0])):
        problems.append("no refusal of governed artifacts before the frame")
    return problems


def _panel_violations(sources: dict[str, str]) -> list[str]:
    out = []
    for name, text in sorted(sources.items()):
        allowed = _FRAME_CONSTRUCTS if name == FRAME_MODULE else {}
        out += [f"{name}: {label}" for label, pattern in _FORBIDDEN_IN_PANEL.items()
                if label not in allowed and pattern.search(text)]
        if name == FRAME_MODULE:
            out += [f"{name}: {problem}" for problem in _frame_violations(text)]
        elif _IMPORTS_FRAME.search(text) and name != PREVIEW_MODULE:
            out.append(f"{name}: uses the frame outside the ordinary preview branch")
    governed = sources.get(GOVERNED_MODULE)
    if governed is None or _IMPORTS_RENDERING.search(governed) or "<iframe" in governed:
        out.append(f"{GOVERNED_MODULE}: the governed view is missing or can render markup")
    preview = sources.get(PREVIEW_MODULE, "")
    branches = dict(re.findall(r"case '([\w-]+)':\s*return\s*(?:\(\s*)?<(\w+)", preview))
    if branches.get("governed") != "GovernedArtifactView" or preview.count("<SandboxedFrame") \
            != (branches.get("frame") == "SandboxedFrame"):
        out.append(f"{PREVIEW_MODULE}: the frame is reachable outside the 'frame' branch, or "
                   "the governed branch is not the native view")
    if not _GOVERNED_FIRST.search(sources.get(DECISION_MODULE, "")):
        out.append(f"{DECISION_MODULE}: previewMode does not decide 'governed' first")
    return out


def _panel_sources() -> dict[str, str]:
    root = REPO / "labextension" / "src"
    files = [p for p in root.rglob("*") if p.suffix in {".ts", ".tsx", ".js", ".jsx"}]
    assert files, f"no panel sources under {root}"
    return {p.relative_to(REPO).as_posix(): p.read_text(encoding="utf-8") for p in files}


def test_the_panel_walk_recognizes_an_iframe_renderer() -> None:
    """The walk below must be able to fail: each construct of a governed frame renderer, and
    each way the one ordinary frame could loosen or reach governed data, is caught."""
    shipped = _panel_sources()
    assert _panel_violations(shipped) == []
    renderer = {
        "a.tsx": "return <iframe sandbox='' src={url} />;",
        "b.ts": "frame.srcdoc = envelope.result;",
        "c.ts": "frame.contentWindow.postMessage({type: 'DELIVER'}, '*');",
        "d.ts": "window.addEventListener('message', onReady);",
        "d2.ts": "window.onmessage = onReady;",
        "e.tsx": "<div dangerouslySetInnerHTML={{__html: html}} />",
        "f.ts": "const model = new MimeModel({ data, trusted: true });",
    }
    for name, text in renderer.items():
        assert _panel_violations({**shipped, name: text}), name
    assert _panel_violations({**shipped, "ok.ts": "api.postMessage(id, body); "
                                                  "socket.onmessage = f; "
                                                  "if (a.innerHTML == b) {}"}) == []
    frame = shipped[FRAME_MODULE]
    loosened = {
        "scripts allowed": frame.replace('sandbox=""', 'sandbox="allow-scripts"'),
        "same origin allowed": frame.replace('sandbox=""', 'sandbox="allow-same-origin"'),
        "no sandbox": frame.replace('sandbox=""', ""),
        "governed not refused": frame.replace("isGovernedArtifact(artifact) || ", ""),
        "a second frame": frame.replace("<iframe", "<iframe sandbox=\"\" /><iframe", 1),
        "frame messaging": frame + "\nwindow.addEventListener('message', onReady);",
    }
    for label, text in loosened.items():
        assert text != frame, label
        assert _panel_violations({**shipped, FRAME_MODULE: text}), label
    governed = shipped[GOVERNED_MODULE]
    preview = shipped[PREVIEW_MODULE]
    decision = shipped[DECISION_MODULE]
    rerouted = {
        GOVERNED_MODULE: "import { SandboxedFrame } from './SandboxedFrame';\n" + governed,
        PREVIEW_MODULE: preview.replace("return <GovernedArtifactView artifact={artifact} />",
                                        "return <SandboxedFrame artifact={artifact} />"),
        DECISION_MODULE: decision.replace("return 'governed';", "return 'frame';", 1),
        f"{PANEL_SRC}/components/Other.tsx": "import { SandboxedFrame } from './SandboxedFrame';",
    }
    for name, text in rerouted.items():
        assert text != shipped.get(name), name
        assert _panel_violations({**shipped, name: text}), name


@pytest.mark.rule("R-121")
def test_no_iframe_renderer_or_html_sink_ships_in_the_panel(server: ServerProcess) -> None:
    # The shipped panel: no frame messaging, no raw-HTML sink, no trusted output, and its one
    # frame (ordinary html/svg previews, sandbox="") never given a governed artifact: those
    # render through the native view (markings, table of text nodes, inert text fallback).
    # Tool results are <pre> text and answers untrusted (sanitized) rendermime. The browser
    # half is exercised in tests/e2e/test_panel.py::test_panel_artifacts_pane.
    assert _panel_violations(_panel_sources()) == []

    # The server side of the same boundary: a governed artifact leaves only as the inert
    # canonical JSON envelope (its text_fallback included), never as a page to render.
    with server.client("alice") as alice:
        assert alice.get("agents").status_code == 200
        governed = _governed(server, "alice", WIDE_CLAIMS | {"renderer": "iframe_html",
                                                              "text_fallback": "<b>2</b>"})
        download = alice.get(f"artifacts/{governed}/download")
        assert download.status_code == 200
        assert download.headers["content-type"].startswith("application/json")
        assert download.headers["content-disposition"].startswith("attachment;")
        assert download.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in download.headers["content-security-policy"]
        assert json_of(download)["text_fallback"] == "<b>2</b>"  # data, not markup
        view = json_of(alice.get(f"artifacts/{governed}"))
        assert view["mime"] != "text/html" and isinstance(view["content"], str)


# --- result_ref: validated and preserved, never resolved (backend half of R-113) -----------
# The browser half (the pane labels the reference, shows the text_fallback and fetches
# nothing) runs in Chromium in tests/e2e/test_panel.py::test_panel_artifacts_pane, which cites
# R-113 too, and in labextension/test/artifacts.test.ts.

REF_ENVELOPE: dict[str, Any] = {
    "version": 2, "renderer": "table", "title": "Remote rows", "text_fallback": "12 rows",
    "markings": {"overall": "UNCLASSIFIED"}, "provenance": {"job": "j-7"},
    "result_ref": {"id": "jobs:j-7:result", "sha256": "ab" * 32},
}


@pytest.mark.rule("R-113")
@pytest.mark.parametrize("ref", [
    {"id": "https://cluster.example/results/7", "sha256": "ab" * 32},  # a fetchable URL
    {"id": "jobs:j-7", "sha256": "not-a-digest"},
    {"id": "jobs:j-7"},
    {"id": "jobs:j-7", "sha256": "ab" * 32, "url": "/results/7"},
    "jobs:j-7",
])
def test_a_result_ref_that_is_not_an_opaque_digest_bound_id_is_refused(ref: object) -> None:
    with pytest.raises(ValidationFailed):
        validate_envelope(REF_ENVELOPE | {"result_ref": ref})
    with pytest.raises(ValidationFailed):  # never both the result and a reference
        validate_envelope(REF_ENVELOPE | {"result": {"rows": []}})


@pytest.mark.rule("R-113")
def test_a_result_ref_is_preserved_exactly_and_nothing_resolves_it(
        server: ServerProcess) -> None:
    with server.client("alice") as alice:
        assert alice.get("agents").status_code == 200
        # The reference names nothing that exists anywhere; storing and reading it still
        # works, because nothing tries to fetch it.
        governed = _governed(server, "alice", REF_ENVELOPE)
        assert json_of(alice.get(f"artifacts/{governed}/download")) == REF_ENVELOPE
        view = json_of(alice.get(f"artifacts/{governed}"))
        assert json.loads(view["content"]) == REF_ENVELOPE
    # Only the envelope validator mentions result_ref on the server side: no resolver there,
    # no fetch in the kernel bridge. (The panel's built bundle is not server code.)
    built_panel = REPO / "kaizen_server_extension" / "labextension"
    mentions = sorted(
        p.relative_to(REPO).as_posix() for root in ("kaizen_server_extension", "plugins",
                                                    "kaizen_kernel", "labextension/src")
        for p in (REPO / root).rglob("*")
        if p.suffix in {".py", ".ts", ".tsx", ".js"} and "node_modules" not in p.parts
        and built_panel not in p.parents
        and "result_ref" in p.read_text(encoding="utf-8", errors="replace"))
    # The panel reads it only to label it ("the browser labels it", never resolves it): in
    # the governed envelope reader and the governed view, which make no request at all.
    panel_readers = {"labextension/src/artifacts.ts",
                     "labextension/src/components/GovernedArtifactView.tsx"}
    assert [m for m in mentions if m not in panel_readers] == [
        "kaizen_server_extension/store/artifacts/content.py"]
    requests = re.compile(r"\bfetch\(|makeRequest|XMLHttpRequest|sendBeacon|WebSocket|"
                          r"\b(?:src|href)\s*=|\bimport\(")
    for reader in panel_readers & set(mentions):
        assert not requests.search((REPO / reader).read_text(encoding="utf-8")), reader
