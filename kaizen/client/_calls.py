"""The REST calls the clients make, described once: method, path, body, and how to read the
answer. ``Client`` (sync) and ``AsyncClient`` only send them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter

from kaizen.client import models as m

T = TypeVar("T")
PREFIX = "kaizen/api/"


class KaizenError(Exception):
    """The server refused a call: its HTTP status and the API's stable ``code`` and
    member-safe ``message`` (``{"error": {"code", "message"}}``)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    read: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, Any] = field(default_factory=dict)
    content: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def request(self, client: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        return client.build_request(self.method, PREFIX + self.path, json=self.json,
                                    params={k: v for k, v in self.params.items()
                                            if v is not None},
                                    content=self.content, headers=dict(self.headers))


def raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "http_error", response.reason_phrase or "request failed"
    raise KaizenError(response.status_code, code, message)


def _model(kind: Any) -> Callable[[httpx.Response], Any]:
    adapter: TypeAdapter[Any] = TypeAdapter(kind)

    def read(response: httpx.Response) -> Any:
        raise_for(response)
        return adapter.validate_python(response.json())
    return read


def _bytes(response: httpx.Response) -> bytes:
    raise_for(response)
    return response.content


def _json(response: httpx.Response) -> Any:
    raise_for(response)
    return response.json()


def _seg(value: str) -> str:
    return quote(value, safe="")


def me() -> Call[m.Me]:
    return Call("GET", "members/me", _model(m.Me))


def openapi() -> Call[dict[str, Any]]:
    return Call("GET", "openapi.json", _json)


def agents() -> Call[list[m.Agent]]:
    return Call("GET", "agents", _model(list[m.Agent]))


def conversations() -> Call[list[m.Conversation]]:
    return Call("GET", "conversations", _model(list[m.Conversation]))


def conversation(conversation_id: str) -> Call[m.Conversation]:
    return Call("GET", f"conversations/{_seg(conversation_id)}", _model(m.Conversation))


def create_conversation(agent_id: str, title: str | None, shared: bool) -> Call[m.Conversation]:
    body: dict[str, Any] = {"agent_id": agent_id, "shared": shared}
    if title:
        body["title"] = title
    return Call("POST", "conversations", _model(m.Conversation), json=body)


def post_message(conversation_id: str, text: str, *, attachments: Sequence[str],
                 kind: str, idempotency_key: str | None) -> Call[m.Accepted]:
    body: dict[str, Any] = {"text": text, "kind": kind,
                            "idempotency_key": idempotency_key or uuid.uuid4().hex}
    if attachments:
        body["attachments"] = list(attachments)
    return Call("POST", f"conversations/{_seg(conversation_id)}/messages",
                _model(m.Accepted), json=body)


def journal(conversation_id: str, after: int, limit: int) -> Call[m.JournalPage]:
    return Call("GET", f"conversations/{_seg(conversation_id)}/journal",
                _model(m.JournalPage), params={"after": after, "limit": limit})


def run(run_id: str) -> Call[m.Run]:
    return Call("GET", f"runs/{_seg(run_id)}", _model(m.Run))


def cancel_run(run_id: str) -> Call[m.Run]:
    return Call("POST", f"runs/{_seg(run_id)}/cancel", _model(m.Run))


def approvals(status: str | None) -> Call[list[m.Approval]]:
    return Call("GET", "approvals", _model(list[m.Approval]), params={"status": status})


def decide_approval(approval_id: str, approve: bool) -> Call[dict[str, Any]]:
    return Call("POST", f"approvals/{_seg(approval_id)}", _json,
                json={"decision": "approve" if approve else "deny"})


def artifacts(conversation_id: str | None) -> Call[list[m.Artifact]]:
    return Call("GET", "artifacts", _model(list[m.Artifact]),
                params={"conversation_id": conversation_id})


def download_artifact(artifact_id: str, version: int | None,
                      conversation_id: str | None) -> Call[bytes]:
    path = f"artifacts/{_seg(artifact_id)}"
    path += f"/versions/{int(version)}/download" if version is not None else "/download"
    return Call("GET", path, _bytes, params={"conversation_id": conversation_id})


def attach_notebook(conversation_id: str, path: str) -> Call[m.AttachedNotebook]:
    return Call("POST", f"conversations/{_seg(conversation_id)}/notebooks",
                _model(m.AttachedNotebook), json={"path": path})


def upload(conversation_id: str, filename: str, content: bytes,
           media_type: str) -> Call[m.UploadedFile]:
    return Call("POST", f"conversations/{_seg(conversation_id)}/uploads",
                _model(m.UploadedFile), params={"filename": filename}, content=content,
                headers={"Content-Type": media_type})


def kernel_access(conversation_id: str, method: str) -> Call[m.NotebookKernelAccess]:
    return Call(method, f"conversations/{_seg(conversation_id)}/notebook-kernel-access",
                _model(m.NotebookKernelAccess))


def proposal(proposal_id: str) -> Call[m.NotebookEditProposal]:
    return Call("GET", f"notebook-edits/{_seg(proposal_id)}", _model(m.NotebookEditProposal))


def decide_cell(proposal_id: str, ordinal: int, accept: bool,
                run_after: bool) -> Call[m.NotebookEditCell]:
    return Call("POST", f"notebook-edits/{_seg(proposal_id)}/cells/{int(ordinal)}/decision",
                _model(m.NotebookEditCell),
                json={"decision": "accept" if accept else "reject", "run_after": run_after})


def cell_result(proposal_id: str, ordinal: int, outcome: str,
                detail: str) -> Call[m.NotebookEditCell]:
    return Call("POST", f"notebook-edits/{_seg(proposal_id)}/cells/{int(ordinal)}/result",
                _model(m.NotebookEditCell), json={"outcome": outcome, "detail": detail})


# --- the events websocket ---------------------------------------------------------------

#: The server closes with this when the member stops being a participant: do not reconnect.
CLOSE_NOT_PARTICIPANT = 4404
_FRAME: TypeAdapter[m.Frame] = TypeAdapter(m.Frame)


def events_url(base_url: str, conversation_id: str, after: int) -> str:
    scheme, rest = base_url.split("://", 1)
    ws = "wss" if scheme == "https" else "ws"
    base = rest if rest.endswith("/") else rest + "/"
    return f"{ws}://{base}{PREFIX}conversations/{_seg(conversation_id)}/events?after={after}"


def parse_frame(raw: str | bytes) -> m.Frame:
    return _FRAME.validate_python(json.loads(raw))


@dataclass
class Answer:
    """What one message got: its run as it settled and the committed answer text."""

    run: m.Run
    text: str
    events: list[m.Event] = field(default_factory=list)


class TurnFollower:
    """Folds one run's frames: live answer text as it streams, then the committed answer
    and the terminal status (``run.terminal``)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.live: dict[int, str] = {}
        self.committed: dict[int, str] = {}
        self.events: list[m.Event] = []
        self.terminal: dict[str, Any] | None = None

    def feed(self, frame: m.Frame) -> str | None:
        """The new answer text this frame streams, if any."""
        if frame.run_id != self.run_id:
            return None
        if isinstance(frame, m.LiveFrame):
            if frame.type == "answer.delta":
                step, piece = int(frame.data.get("step", 0)), str(frame.data.get("text", ""))
                self.live[step] = self.live.get(step, "") + piece
                return piece
            return None
        self.events.append(frame)
        if frame.type == "answer.committed":
            self.committed[int(frame.data.get("step", 0))] = str(frame.data.get("text", ""))
        elif frame.type == "run.terminal":
            self.terminal = frame.data
        return None

    @property
    def text(self) -> str:
        return "\n\n".join(self.committed[k] for k in sorted(self.committed))
