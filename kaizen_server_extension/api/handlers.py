"""REST handlers (API.md). Each one is a thin adapter: parse, authorize, call the store."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tornado import web

from kaizen_server_extension.agents import DEFAULT_AGENT_ID
from kaizen_server_extension.api import schemas
from kaizen_server_extension.api.admin import admin_routes
from kaizen_server_extension.api.artifacts import artifact_routes
from kaizen_server_extension.api.base import KaizenHandler
from kaizen_server_extension.api.documents import document_routes
from kaizen_server_extension.api.health import health_routes
from kaizen_server_extension.api.jupyter_files import jupyter_file_routes
from kaizen_server_extension.api.kernel_console import kernel_console_routes
from kaizen_server_extension.api.library import library_routes
from kaizen_server_extension.api.notebooks import notebook_routes
from kaizen_server_extension.api.notifications import (
    AttendedEventsHandler,
    NotificationAckHandler,
    NotificationDestinationAckHandler,
    NotificationsHandler,
)
from kaizen_server_extension.api.openapi import openapi_document
from kaizen_server_extension.api.openapi_sources import openapi_source_routes
from kaizen_server_extension.api.params import (
    ID,
    MEMBER,
    UnknownPathHandler,
    query_int,
    query_value,
)
from kaizen_server_extension.api.tasks import task_routes
from kaizen_server_extension.api.tool_choices import tool_choice_routes
from kaizen_server_extension.api.tool_grants import tool_grant_routes
from kaizen_server_extension.protocol.errors import BadRequest, NotFound, TooLarge
from kaizen_server_extension.store.records import AgentRecord, MemberRecord

MAX_JOURNAL_PAGE = 1000


def _agent_view(agent: AgentRecord, tool_names: frozenset[str]) -> dict[str, Any]:
    """An agent as a member sees it: its tool grant narrowed to the tools this server has, the
    same intersection its catalog is frozen from, so a surface the deployment does not expose
    is named nowhere (R-140)."""
    view = agent.public()
    view["tools"] = [name for name in agent.tool_ceiling if name in tool_names]
    return view


class AgentsHandler(KaizenHandler):
    @web.authenticated
    async def get(self) -> None:
        agents = await self.kaizen.store.agents.list_visible(self.member)
        self.write_json([_agent_view(a, self.kaizen.tool_names) for a in agents])


class AgentHandler(KaizenHandler):
    @web.authenticated
    async def get(self, agent_id: str) -> None:
        agent = await self.kaizen.store.agents.get_visible(agent_id, self.member)
        if agent is None:
            raise NotFound("No such agent.", code="agent_not_found")
        self.write_json(_agent_view(agent, self.kaizen.tool_names))


class ConversationsHandler(KaizenHandler):
    @web.authenticated
    async def get(self) -> None:
        conversations = await self.kaizen.store.conversations.list_for(self.member)
        self.write_json([c.public() for c in conversations])

    @web.authenticated
    async def post(self) -> None:
        body = self.parse_body(schemas.CreateConversation)
        conversation = await self.kaizen.store.conversations.create(
            self.member, body.agent_id, body.title or "New conversation", body.shared
        )
        self.write_json(conversation.public(), status=201)


class ConversationHandler(KaizenHandler):
    @web.authenticated
    async def get(self, conversation_id: str) -> None:
        conversation = await self.kaizen.store.conversations.get_for(conversation_id,
                                                                     self.member)
        self.write_json(conversation.public())


class ParticipantsHandler(KaizenHandler):
    @web.authenticated
    async def post(self, conversation_id: str) -> None:
        body = self.parse_body(schemas.AddParticipant)
        conversation = await self.kaizen.store.conversations.add_participant(
            conversation_id, self.member, body.member
        )
        self.write_json(conversation.public())


class ParticipantHandler(KaizenHandler):
    @web.authenticated
    async def delete(self, conversation_id: str, member: str) -> None:
        conversation = await self.kaizen.store.conversations.remove_participant(
            conversation_id, self.member, member
        )
        self.write_json(conversation.public())


class MessagesHandler(KaizenHandler):
    @web.authenticated
    async def post(self, conversation_id: str) -> None:
        limit = self.kaizen.max_message_bytes
        # JSON escaping can at most sextuple a text; anything larger cannot be within bound.
        body = self.parse_body(schemas.PostMessage, limit=limit * 6 + 4096)
        if len(body.text.encode("utf-8")) > limit:
            raise TooLarge(f"The message is larger than {limit} bytes.",
                           code="message_too_large")
        accepted = await self.kaizen.store.inputs.accept(
            conversation_id, self.member, body.text, kind=body.kind,
            idempotency_key=body.idempotency_key, attachments=tuple(body.attachments),
        )
        # The request's whole job ends here: the lane runs the turn detached.
        self.kaizen.lanes.wake(conversation_id)
        self.write_json(accepted.public(), status=202)


class JournalHandler(KaizenHandler):
    @web.authenticated
    async def get(self, conversation_id: str) -> None:
        after = query_int(query_value(self, "after"), "after", 0, minimum=0)
        limit = query_int(query_value(self, "limit"), "limit", 100, minimum=1,
                          maximum=MAX_JOURNAL_PAGE)
        events = await self.kaizen.store.journal.read(conversation_id, self.member,
                                                      after=after, limit=limit)
        self.write_json({
            "events": [e.public() for e in events],
            "next": events[-1].seq if events else after,
        })


class RunHandler(KaizenHandler):
    @web.authenticated
    async def get(self, run_id: str) -> None:
        run = await self.kaizen.store.runs.get_for(run_id, self.member)
        self.write_json(run.public())


class RunCancelHandler(KaizenHandler):
    @web.authenticated
    async def post(self, run_id: str) -> None:
        run = await self.kaizen.lanes.cancel(run_id, self.member)
        self.write_json(run.public(), status=202)


class ApprovalsHandler(KaizenHandler):
    @web.authenticated
    async def get(self) -> None:
        status = query_value(self, "status")
        if status not in (None, "pending", "approved", "denied", "consumed"):
            raise BadRequest("Unknown approval status.", code="invalid_query")
        self.write_json(await self.kaizen.tools.approvals.list_for(self.member, status))


class ApprovalHandler(KaizenHandler):
    @web.authenticated
    async def post(self, approval_id: str) -> None:
        body = self.parse_body(schemas.ApprovalDecision)
        decided = await self.kaizen.tools.approvals.decide(approval_id, self.member,
                                                           body.decision == "approve",
                                                           scope=body.scope)
        self.write_json(decided)


class ToolsHandler(KaizenHandler):
    @web.authenticated
    async def get(self) -> None:
        """The catalog this member and agent would get in a conversation (or privately)."""
        conversation_id = query_value(self, "conversation_id")
        store = self.kaizen.store
        if conversation_id:
            conversation = await store.conversations.get_for(conversation_id, self.member)
            agent_id = conversation.agent_id
        else:
            agent_id = query_value(self, "agent_id") or DEFAULT_AGENT_ID
            conversation = None
        agent = await store.agents.get_visible(agent_id, self.member)
        if agent is None:
            raise NotFound("No such agent.", code="agent_not_found")
        if conversation is None:
            from kaizen_server_extension.store.records import ConversationRecord

            now = datetime.now(UTC)
            conversation = ConversationRecord("", self.member, agent.id, "", False, 1, 0,
                                              (self.member,), now, now)
        # The source tools (MCP servers, OpenAPI sources) a run would discover now, as this
        # member: the listing is the catalog a turn gets, not only the built-in part of it.
        sources = await self.kaizen.tools.discover(agent=agent, member=self.member,
                                                   conversation_id=conversation.id)
        catalog = self.kaizen.tools.catalog(agent=agent, conversation=conversation,
                                            member=self.member, sources=sources)
        self.write_json({"digest": catalog.digest, "tools": [
            {"name": t.name, "description": t.description, "parameters": t.parameters,
             "capability": t.capability.value} for t in catalog.advertised
        ], "deferred": list(catalog.deferred),
            # Why a source gave nothing (docs/mcp.md): a code, never the server's answer.
            "unavailable": [{"source": source, "reason": reason}
                            for source, reason in sources.reasons]})


class MemberSettingsHandler(KaizenHandler):
    @web.authenticated
    async def get(self) -> None:
        member = await self.kaizen.store.members.get(self.member)
        assert member is not None  # ensured in prepare()
        self.write_json(_settings(member, self))

    @web.authenticated
    async def put(self) -> None:
        body = self.parse_body(schemas.MemberSettings)
        member = await self.kaizen.store.members.update_settings(
            self.member, approval_mode=body.approval_mode, model=body.model,
            tool_result_compression=body.tool_result_compression)
        self.write_json(_settings(member, self))


class MeHandler(KaizenHandler):
    @web.authenticated
    async def get(self) -> None:
        self.write_json({"member": self.member,
                         "admin": self.kaizen.is_admin(self.member)})


class OpenAPIHandler(KaizenHandler):
    @web.authenticated
    async def get(self) -> None:
        self.write_json(openapi_document(
            library=self.kaizen.library_enabled,
            openapi_sources=self.kaizen.openapi_sources_enabled,
            credentials=self.kaizen.credentials is not None))


def _settings(member: MemberRecord, handler: KaizenHandler) -> dict[str, Any]:
    return {"approval_mode": member.approval_mode, "model": member.model,
            "default_model": handler.kaizen.model or None,
            "tool_result_compression": member.tool_result_compression}


PREFIX = r"/kaizen/api"


def routes(*, library: bool = True,
           openapi_sources: bool = False,
           credentials: bool = False) -> list[tuple[str, type[web.RequestHandler]]]:
    """Every REST route; the Library's only when ``library`` (KAIZEN_LIBRARY_ENABLED) is on,
    so with it off those paths are unknown to the server, not refused by it (R-140); the
    member's OpenAPI sources likewise only with ``openapi_sources``
    (KAIZEN_OPENAPI_SOURCES_ENABLED, R-378)."""
    return [
        (rf"{PREFIX}/openapi\.json", OpenAPIHandler),
        # Unauthenticated probes: liveness, and readiness (store reachable, schema at head).
        *health_routes(PREFIX),
        (rf"{PREFIX}/agents", AgentsHandler),
        (rf"{PREFIX}/agents/({ID})", AgentHandler),
        (rf"{PREFIX}/conversations", ConversationsHandler),
        (rf"{PREFIX}/conversations/({ID})", ConversationHandler),
        (rf"{PREFIX}/conversations/({ID})/participants", ParticipantsHandler),
        (rf"{PREFIX}/conversations/({ID})/participants/({MEMBER})", ParticipantHandler),
        (rf"{PREFIX}/conversations/({ID})/messages", MessagesHandler),
        (rf"{PREFIX}/conversations/({ID})/journal", JournalHandler),
        # The events websocket, also marking its member as attending (completion inbox).
        (rf"{PREFIX}/conversations/({ID})/events", AttendedEventsHandler),
        (rf"{PREFIX}/runs/({ID})", RunHandler),
        (rf"{PREFIX}/runs/({ID})/cancel", RunCancelHandler),
        (rf"{PREFIX}/approvals", ApprovalsHandler),
        (rf"{PREFIX}/approvals/({ID})", ApprovalHandler),
        (rf"{PREFIX}/notifications", NotificationsHandler),
        (rf"{PREFIX}/notifications/ack", NotificationDestinationAckHandler),
        (rf"{PREFIX}/notifications/({ID})/ack", NotificationAckHandler),
        (rf"{PREFIX}/tools", ToolsHandler),
        (rf"{PREFIX}/members/me", MeHandler),
        (rf"{PREFIX}/members/me/settings", MemberSettingsHandler),
        *artifact_routes(PREFIX),
        # The member's files of the Jupyter contents tree, in and out of their artifacts.
        *jupyter_file_routes(PREFIX),
        *(library_routes(PREFIX) if library else ()),
        # The member's documents for retrieval: upload, versions, room shares, search.
        *document_routes(PREFIX),
        # The caller's own persistent run_code kernel, and opening it as a console.
        *kernel_console_routes(PREFIX, ID),
        # The member's notebooks: attach, kernel access, reviewed cell edits, data uploads.
        *notebook_routes(PREFIX, ID),
        # The caller's "allow for this conversation" grants (made by approving with a scope).
        *tool_grant_routes(PREFIX, ID),
        *tool_choice_routes(PREFIX, ID),
        # The caller's durable tasks: run now, safe test, cadence (docs/tasks.md).
        *task_routes(PREFIX),
        # The member's external OpenAPI sources (docs/openapi-sources.md), when enabled.
        *(openapi_source_routes(PREFIX, ID) if openapi_sources else ()),
        # Credential forms, references and receipts, only when credentials are enabled.
        *(_credential_routes() if credentials else ()),
        # Admin only (404 to everyone else): the tool policies read on every tool call.
        *admin_routes(PREFIX),
        # Last: any other path under the API is the usual JSON 404, not Jupyter's HTML page.
        (rf"{PREFIX}(?:/.*)?", UnknownPathHandler),
    ]


def _credential_routes() -> list[tuple[str, type[web.RequestHandler]]]:
    from kaizen_server_extension.api.credentials import credential_routes

    return credential_routes(PREFIX)
