"""``AsyncClient``: the same API as ``Client``, for asyncio code (httpx, websockets).

Every method is the coroutine of ``Client``'s method of the same name; ``events`` is an async
iterator.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from kaizen.client import _calls as c
from kaizen.client import models as m
from kaizen.client._calls import Answer, KaizenError, TurnFollower

T = TypeVar("T")


class AsyncClient:
    """``AsyncClient(url, token)``, as ``Client``."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url if url.endswith("/") else url + "/"
        self._headers = {"Authorization": f"token {token}"}
        self._http = httpx.AsyncClient(base_url=self.url, headers=self._headers, timeout=timeout,
                                  transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _do(self, call: c.Call[T]) -> T:
        return call.read(await self._http.send(call.request(self._http)))

    # --- REST -------------------------------------------------------------------------

    async def me(self) -> m.Me:
        return await self._do(c.me())

    async def openapi(self) -> dict[str, Any]:
        return await self._do(c.openapi())

    async def agents(self) -> list[m.Agent]:
        return await self._do(c.agents())

    async def conversations(self) -> list[m.Conversation]:
        return await self._do(c.conversations())

    async def conversation(self, conversation_id: str) -> m.Conversation:
        return await self._do(c.conversation(conversation_id))

    async def create_conversation(self, agent_id: str = "general", *, title: str | None = None,
                            shared: bool = False) -> m.Conversation:
        return await self._do(c.create_conversation(agent_id, title, shared))

    async def post_message(self, conversation_id: str, text: str, *,
                     attachments: Sequence[str] = (), kind: str = "message",
                     idempotency_key: str | None = None) -> m.Accepted:
        """Queue a message; retrying with the same ``idempotency_key`` accepts it once."""
        return await self._do(c.post_message(conversation_id, text, attachments=attachments,
                                       kind=kind, idempotency_key=idempotency_key))

    async def journal(self, conversation_id: str, *, after: int = 0,
                limit: int = 100) -> m.JournalPage:
        return await self._do(c.journal(conversation_id, after, limit))

    async def iter_journal(self, conversation_id: str, *, after: int = 0,
                           page: int = 500) -> AsyncIterator[m.Event]:
        """Every durable event after ``after``, page by page, in seq order."""
        while True:
            got = await self.journal(conversation_id, after=after, limit=page)
            for event in got.events:
                yield event
            if len(got.events) < page:
                return
            after = got.next

    async def run(self, run_id: str) -> m.Run:
        return await self._do(c.run(run_id))

    async def cancel_run(self, run_id: str) -> m.Run:
        return await self._do(c.cancel_run(run_id))

    async def approvals(self, status: str | None = None) -> list[m.Approval]:
        return await self._do(c.approvals(status))

    async def decide_approval(self, approval_id: str, *, approve: bool) -> dict[str, Any]:
        return await self._do(c.decide_approval(approval_id, approve))

    async def artifacts(self, conversation_id: str | None = None) -> list[m.Artifact]:
        return await self._do(c.artifacts(conversation_id))

    async def download_artifact(self, artifact_id: str, *, version: int | None = None,
                          conversation_id: str | None = None) -> bytes:
        return await self._do(c.download_artifact(artifact_id, version, conversation_id))

    async def attach_notebook(self, conversation_id: str, path: str) -> m.AttachedNotebook:
        return await self._do(c.attach_notebook(conversation_id, path))

    async def upload(self, conversation_id: str, filename: str, content: bytes,
               media_type: str) -> m.UploadedFile:
        return await self._do(c.upload(conversation_id, filename, content, media_type))

    async def kernel_access(self, conversation_id: str) -> m.NotebookKernelAccess:
        return await self._do(c.kernel_access(conversation_id, "GET"))

    async def allow_kernel_access(self, conversation_id: str) -> m.NotebookKernelAccess:
        return await self._do(c.kernel_access(conversation_id, "PUT"))

    async def revoke_kernel_access(self, conversation_id: str) -> m.NotebookKernelAccess:
        return await self._do(c.kernel_access(conversation_id, "DELETE"))

    async def proposal(self, proposal_id: str) -> m.NotebookEditProposal:
        return await self._do(c.proposal(proposal_id))

    async def decide_cell(self, proposal_id: str, ordinal: int, *, accept: bool,
                    run_after: bool = False) -> m.NotebookEditCell:
        return await self._do(c.decide_cell(proposal_id, ordinal, accept, run_after))

    async def record_cell_result(self, proposal_id: str, ordinal: int, outcome: str,
                           detail: str = "") -> m.NotebookEditCell:
        return await self._do(c.cell_result(proposal_id, ordinal, outcome, detail))

    # --- live events ----------------------------------------------------------------------

    async def events(self, conversation_id: str, *, after: int = 0, reconnect: bool = True,
                     max_reconnects: int = 8) -> AsyncIterator[m.Frame]:
        """The conversation's frames: durable events after ``after`` in seq order (no gap,
        no duplicate), then as they are appended, with live-only frames between. A dropped
        connection is resumed from the last durable seq received."""
        last, failures = after, 0
        while True:
            try:
                async with connect(c.events_url(self.url, conversation_id, last),
                                   additional_headers=self._headers,
                                   open_timeout=30) as socket:
                    failures = 0
                    async for raw in socket:
                        frame = c.parse_frame(raw)
                        if isinstance(frame, m.EventFrame):
                            last = frame.seq
                        yield frame
            except InvalidStatus as refused:
                status = refused.response.status_code
                raise KaizenError(status, "events_refused",
                                  "The server refused the events websocket.") from None
            except ConnectionClosed as closed:
                if closed.rcvd is not None and closed.rcvd.code == c.CLOSE_NOT_PARTICIPANT:
                    raise KaizenError(404, "not_participant",
                                      "You are no longer a participant.") from None
            except OSError:
                pass
            failures += 1
            if not reconnect or failures > max_reconnects:
                raise KaizenError(0, "events_unavailable",
                                  "The events websocket could not be kept open.")
            await asyncio.sleep(min(0.2 * 2 ** failures, 5.0))

    async def ask(self, conversation_id: str, text: str, *, attachments: Sequence[str] = (),
            on_text: Callable[[str], None] | None = None,
            idempotency_key: str | None = None) -> Answer:
        """Send ``text`` and follow its run to the end: ``on_text`` gets the answer as it
        streams; the result has the run as it settled and the committed answer."""
        start = (await self.conversation(conversation_id)).last_seq
        accepted = await self.post_message(conversation_id, text, attachments=attachments,
                                     idempotency_key=idempotency_key)
        follower = TurnFollower(accepted.run_id)
        async for frame in self.events(conversation_id, after=start):
            piece = follower.feed(frame)
            if piece and on_text is not None:
                on_text(piece)
            if follower.terminal is not None:
                break
        return Answer(await self.run(accepted.run_id), follower.text, follower.events)
