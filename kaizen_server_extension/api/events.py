"""``WS kaizen/api/conversations/{id}/events?after=SEQ``: the journal, live (API.md).

Durable frames are ``{...EventRecord.public(), "live": false}`` in ``seq`` order, with no gap
and no duplicate: the socket subscribes to the bus *before* reading the backlog, always reads
the database from the last seq it sent, and treats every bus notice only as "read again".
Live-only frames are ``{"type", "live": true, "conversation_id", "run_id", "data"}``.

The socket is an observer: closing it unsubscribes and cancels nothing else. Every database
read re-checks that the member is a participant, so a removed member is disconnected (close
code 4404) as soon as the removal's own notice arrives, or at the periodic re-check.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WS_PING_INTERVAL, WebSocketMixin
from tornado import web
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from kaizen_server_extension.api.params import (
    allow_header,
    query_int,
    query_value,
    refuse_undeclared_method,
)
from kaizen_server_extension.context import KaizenContext
from kaizen_server_extension.events import LiveEvent, Resync, Subscription
from kaizen_server_extension.protocol.errors import MemberError, NotFound
from kaizen_server_extension.store.records import EventRecord
from kaizen_server_extension.store.storable import UNSTORABLE, UnstorableText

log = logging.getLogger("kaizen.api")

AUTH_RESOURCE = "kaizen"
# Application close codes (4000-4999): like the REST 404, "not yours to see (any more)".
CLOSE_NOT_PARTICIPANT = 4404
CLOSE_INTERNAL_ERROR = 1011


class UpgradeRequired(MemberError):
    """A plain HTTP GET of the events route: it is only a websocket (RFC 9110, 426)."""

    status = 426
    default_code = "websocket_required"


class ConversationEventsHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):
    """One observer of one conversation's journal."""

    auth_resource = AUTH_RESOURCE
    page_size = 200
    # Without any notice, re-read this often anyway: catches a notice lost between
    # processes and a membership change, at the price of one small query per socket.
    recheck_seconds = 30.0

    conversation_id: str
    _last_seq: int
    _subscription: Subscription | None = None
    _pump: asyncio.Task[None] | None = None
    # True while the pump waits for news (nothing of the store in flight); set on close.
    _pump_idle = False
    _left = False

    @property
    def kaizen(self) -> KaizenContext:
        ctx: KaizenContext = self.settings["kaizen"]
        return ctx

    @property
    def member(self) -> str:
        name: str = self.current_user.username
        return name

    def set_default_headers(self) -> None:
        """No page headers on a websocket (as jupyter_server's kernel websocket)."""

    def get_compression_options(self) -> dict[str, Any] | None:
        options: dict[str, Any] | None = self.settings.get("websocket_compression_options")
        return options

    @property
    def ping_interval(self) -> float:
        """Seconds between keep-alive pings, from jupyter_server's ``ws_ping_interval``
        (milliseconds). Tornado sends the pings and closes the socket when the pong is
        later than one interval, so a vanished client is unsubscribed."""
        millis: float = self.settings.get("ws_ping_interval", WS_PING_INTERVAL)
        return millis / 1000

    @property
    def ping_timeout(self) -> float:
        return self.ping_interval

    async def prepare(self, *args: Any, **kwargs: Any) -> None:
        refuse_undeclared_method(self)
        try:
            # Resolves the identity (token header, ?token=, cookie) the jupyter_server way.
            await super().prepare(*args, **kwargs)
        except web.HTTPError as exc:
            # jupyter_server refuses an anonymous websocket with 403; our API says 401.
            if exc.status_code == 403 and self.current_user is None and self.check_host():
                raise web.HTTPError(401) from None
            raise
        if self.current_user is None:
            # Reached when the server allows unauthenticated access by default; this
            # socket never does.
            raise web.HTTPError(401)

    # -- handshake: every refusal happens here, before the upgrade ---------------------------

    @ws_authenticated
    async def get(self, conversation_id: str) -> None:
        user = self.current_user
        if not await ensure_async(self.authorizer.is_authorized(self, user, "read",
                                                                AUTH_RESOURCE)):
            raise web.HTTPError(403)
        if UNSTORABLE.search(conversation_id):
            raise UnstorableText("path")  # no stored room has such an id (store/storable.py)
        self.conversation_id = conversation_id
        self._last_seq = query_int(query_value(self, "after"), "after", 0,
                                   minimum=0)
        # Unknown conversation and someone else's look the same: 404 (API.md).
        await self.kaizen.store.conversations.get_for(conversation_id, self.member)
        if self.request.headers.get("Upgrade", "").lower() != "websocket":
            # Tornado's own answer is a text/html 400; say it in the API's words.
            raise UpgradeRequired("This is a websocket: connect with Upgrade: websocket.")
        await super().get(conversation_id)

    async def open(self, conversation_id: str) -> None:
        # No WebSocketMixin.open(): its millisecond PeriodicCallback pings would duplicate
        # tornado's own (see ping_interval).
        # Subscribe before the first read: whatever commits after that read is announced.
        self._subscription = self.kaizen.bus.subscribe(conversation_id)
        self._pump = asyncio.create_task(self._stream(self._subscription),
                                         name=f"kaizen-events-{conversation_id}")

    def on_message(self, message: str | bytes) -> None:
        """Clients have nothing to say on this socket; resuming is done with ``after``."""

    def on_close(self) -> None:
        # An observer leaves: unsubscribe and stop sending. Runs are not touched. The pump is
        # cancelled only while it waits for news; inside a journal read it stops after that
        # read instead, so no store transaction is cut off mid-statement.
        self._left = True
        if self._subscription is not None:
            self._subscription.close()
        if self._pump is not None and self._pump_idle \
                and self._pump is not asyncio.current_task():
            self._pump.cancel()

    # -- streaming ---------------------------------------------------------------------------

    async def _stream(self, subscription: Subscription) -> None:
        try:
            await self._catch_up()
            while not self._left:
                message = None
                self._pump_idle = True
                try:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.recheck_seconds):
                            message = await subscription.get()
                finally:
                    self._pump_idle = False
                if self._left:
                    return
                if isinstance(message, LiveEvent):
                    await self._send(message.frame())
                elif message is None or isinstance(message, Resync) \
                        or message.seq > self._last_seq:
                    await self._catch_up()
        except NotFound:
            self.close(CLOSE_NOT_PARTICIPANT, "Not a participant of this conversation.")
        except (WebSocketClosedError, StreamClosedError):
            pass  # the client left; on_close unsubscribes
        except Exception:
            log.exception("kaizen events websocket failed (conversation %s)",
                          self.conversation_id)
            self.close(CLOSE_INTERNAL_ERROR, "Internal error; reconnect with ?after=.")

    async def _catch_up(self) -> None:
        """Send every journal event after the last one sent, page by page."""
        journal = self.kaizen.store.journal
        while not self._left:
            # ``read`` checks participation in the same transaction: NotFound once removed.
            events = await journal.read(self.conversation_id, self.member,
                                        after=self._last_seq, limit=self.page_size)
            for event in events:
                await self._send({**event.public(), "live": False})
                self._last_seq = event.seq
                if self._removes_me(event):
                    # Re-check now rather than trust an old event: they may be back since.
                    await self.kaizen.store.conversations.get_for(self.conversation_id,
                                                                  self.member)
            if len(events) < self.page_size:
                return

    def _removes_me(self, event: EventRecord) -> bool:
        return event.type == "participant.removed" and event.data.get("member") == self.member

    async def _send(self, frame: dict[str, Any]) -> None:
        # Awaiting the write is the back-pressure: a slow client slows only its own pump,
        # and its subscription overflows into a resync instead of blocking publishers.
        await self.write_message(json.dumps(frame))

    # -- refusals before the upgrade are JSON, like every other Kaizen error -----------------

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc_info = kwargs.get("exc_info")
        exc = exc_info[1] if exc_info else None
        if isinstance(exc, MemberError):
            status_code, code, message = exc.status, exc.code, exc.message
            if isinstance(exc, UpgradeRequired):
                self.set_header("Upgrade", "websocket")
        elif status_code < 500:
            code, message = _HTTP_ERRORS.get(status_code, ("bad_request", "Bad request."))
        else:
            log.error("kaizen events handshake failed", exc_info=exc_info)
            code, message = "internal_error", "Something went wrong on the server."
        self.set_status(status_code)
        self.set_header("Content-Type", "application/json")
        allow_header(self, status_code)
        self.finish(json.dumps({"error": {"code": code, "message": message}}))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, MemberError | web.HTTPError):
            return  # expected refusals, not faults
        super().log_exception(typ, value, tb)


_HTTP_ERRORS = {
    400: ("bad_request", "Bad request."),
    401: ("unauthenticated", "Authentication is required."),
    403: ("forbidden", "You are not allowed to do that."),
    404: ("not_found", "Not found."),
    405: ("method_not_allowed", "That method is not allowed here."),
}

