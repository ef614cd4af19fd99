"""The completion inbox over REST, and the attendance an events websocket signals.

``GET kaizen/api/notifications?unread=1`` lists the member's own notices (newest first);
``POST kaizen/api/notifications/{id}/ack`` marks one read. Another member's notice is a 404.
``POST kaizen/api/notifications/ack`` with ``{kind, resource_id, run_id?}`` marks read the
member's notices of exactly the destination the client has open, and no other (R-033).
Notices are written only by trusted producers (``lanes.inbox``): there is no way to create
one, or to give one a destination, over REST.
"""

from __future__ import annotations

from collections.abc import Callable

from tornado import web

from kaizen_server_extension.api.base import KaizenHandler
from kaizen_server_extension.api.events import ConversationEventsHandler
from kaizen_server_extension.api.params import query_value
from kaizen_server_extension.api.schemas import OpenDestination
from kaizen_server_extension.context import KaizenContext
from kaizen_server_extension.lanes.inbox import CompletionInbox, PresenceRegistry
from kaizen_server_extension.protocol.errors import BadRequest


def _inbox(kaizen: KaizenContext) -> CompletionInbox:
    inbox: CompletionInbox = kaizen.lanes.inbox
    return inbox


def _presence(kaizen: KaizenContext) -> PresenceRegistry:
    presence: PresenceRegistry = kaizen.lanes.presence
    return presence


class NotificationsHandler(KaizenHandler):
    @web.authenticated
    async def get(self) -> None:
        raw = query_value(self, "unread")
        if raw not in (None, "0", "1", "true", "false"):
            raise BadRequest("Query parameter 'unread' must be 1 or 0.", code="invalid_query")
        records = await _inbox(self.kaizen).repository.list_for(
            self.member, unread_only=raw in ("1", "true"))
        self.write_json([r.public() for r in records])


class NotificationAckHandler(KaizenHandler):
    @web.authenticated
    async def post(self, notification_id: str) -> None:
        record = await _inbox(self.kaizen).repository.ack(notification_id, self.member)
        self.write_json(record.public())


class NotificationDestinationAckHandler(KaizenHandler):
    @web.authenticated
    async def post(self) -> None:
        opened = self.parse_body(OpenDestination, limit=4096)
        records = await _inbox(self.kaizen).repository.ack_destination(
            self.member, kind=opened.kind, resource_id=opened.resource_id,
            run_id=opened.run_id)
        self.write_json({"acknowledged": [r.public() for r in records]})


class AttendedEventsHandler(ConversationEventsHandler):
    """The conversation events websocket, which also tells the completion inbox that its
    member is watching this conversation's foreground stream while it is open (R-031)."""

    _release_presence: Callable[[], None] | None = None

    async def open(self, conversation_id: str) -> None:
        await super().open(conversation_id)
        self._release_presence = _presence(self.kaizen).attend(self.member, conversation_id)

    def on_close(self) -> None:
        if self._release_presence is not None:
            self._release_presence()
            self._release_presence = None
        super().on_close()
