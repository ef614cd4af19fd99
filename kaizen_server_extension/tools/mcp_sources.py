"""MCP servers as a source of guarded tools (docs/mcp.md).

An administrator enables MCP servers in the settings (``KAIZEN_MCP_SERVERS``): a stdio server
runs a command from the admin's allowlist (``KAIZEN_MCP_STDIO_COMMANDS``), a streamable-HTTP
server is reached at its URL. Each run discovers the tools of the servers its agent grants,
as the run's member, when it is admitted; what a server lists is **untrusted metadata**
(R-135), never authority:

* each tool is named ``mcp__<server id>__<tool>``, so the name says which source it came from
  and a call reaches only that one server (R-400); a remote name that cannot be part of a
  function name is omitted, never rewritten;
* the effect class comes from the tool's annotations and a missing or unknown one is never
  taken as the safer class (R-341): only an explicit ``readOnlyHint: true`` makes a read, an
  explicit ``destructiveHint: true`` makes a sensitive tool (confirmed every call), everything
  else is a write that the approval gate sees;
* the input schema enters the catalog only through the catalog's own admission (the 2020-12
  meta-schema and size/depth/reference bounds, ``tools/schema.py``, R-328..R-331): a bad one is
  omitted alone; the description is bounded here;
* a server that cannot be reached or answers nonsense gives no tools (fail closed, R-065);
* results are bounded here and then projected by the pipeline like any tool's.

**Credentials** (docs/mcp.md, "Credentials"): the administrator may bind a streamable-HTTP
server to a credential destination (``credential_destination``, one of
``KAIZEN_CREDENTIAL_DESTINATIONS`` on the server URL's origin). Its tools are then
credential-backed: their schema gains the required opaque ``credential_ref`` (the only
credential the model may name, R-350, R-386), the pipeline hands the call a broker handle,
and the call opens a session of its own whose HTTP client carries the member's value, by the
destination's scheme, on that one call's requests only (the initialize handshake, the call,
the session's end) — never a run's shared session, never another call. The value never passes
through the arguments, the result (the pipeline scrubs it with the handle), the journal or a
log line (only exception type names are logged).

**Listing with the member's credential**: a bound server is listed, per run, with the run
member's *remembered* credential for its destination when they have one (a use-once value is
kept for the call it was entered for), brokered like a call — its own session and HTTP client,
the bound origin only, the live policy re-checked and a credential-free receipt claimed — and
whatever the listing says is scrubbed of the value before it becomes a descriptor. Without
one it is listed uncredentialed; a server that answers that ``401``/``403`` gives no tools,
with the reason ``credential_required`` (``credential_rejected`` when it refused the member's
value): fail closed, the run goes on without them.

**Egress** (``tools/mcp_http.py``): every HTTP session's client is built there; under the
deployment's signed egress policy an HTTP server's origin must be in it, or its listing and
its calls are refused before anything is sent.

Every discovered tool is an ordinary :class:`RegisteredTool` handed to the run's frozen
catalog and pipeline, so a call travels the same authority, permission, ceiling, approval,
audit and failure path as a built-in. The ``mcp`` SDK is imported only when a server is
actually contacted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypeVar
from urllib.parse import urlsplit

from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.protocol.tools import Capability, WriteCategory
from kaizen_server_extension.tools.egress import RequestCredential
from kaizen_server_extension.tools.mcp_artifacts import MAX_PRODUCER_TEXT_CHARS, govern
from kaizen_server_extension.tools.mcp_http import (
    AuthWatch,
    McpEgressGate,
    McpEgressRefused,
    session_client,
)
from kaizen_server_extension.tools.openapi_sources import with_credential_ref
from kaizen_server_extension.tools.ports import (
    CREDENTIAL_DESTINATION_KEY,
    CREDENTIAL_HANDLE_ARGUMENT,
)
from kaizen_server_extension.tools.types import (
    MAX_TIMEOUT_S,
    Discovered,
    RegisteredTool,
    RoomClass,
    ToolContext,
    ToolDescriptor,
)

log = logging.getLogger("kaizen.tools.mcp")

#: Every MCP tool's name starts with this, then the server id, then ``__`` and the tool.
PREFIX = "mcp__"
SEPARATOR = "__"
#: A server id: short, lower-case, no underscore (so the name splits one way only).
SERVER_ID_RE = re.compile(r"^[a-z][a-z0-9-]{0,23}$")
#: What a remote tool name may be to become part of ours (the rest of a function name).
REMOTE_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: The whole name as OpenAI-compatible providers accept it.
MAX_NAME_CHARS = 64
#: A remote description is cut to this many characters before it enters a catalog.
MAX_DESCRIPTION_CHARS = 1024
#: Tools one server may contribute to one run; the rest are omitted.
MAX_TOOLS_PER_SERVER = 128
#: Pages of ``tools/list`` read from one server.
MAX_LIST_PAGES = 8
#: How long discovery waits for one server (connect, handshake and listing).
DISCOVERY_TIMEOUT_S = 15.0
#: Characters of text one call's result may carry into the pipeline (which projects less).
MAX_RESULT_CHARS = 64 * 1024
#: The surface (discovery parent) of a server's tools.
SURFACE_PREFIX = "mcp:"
#: ``ctx.services`` name of the run's open MCP sessions (:class:`RunSessions`).
SESSIONS_SERVICE = "mcp_sessions"
#: A run's session with a server is closed after this long without a call.
SESSION_IDLE_S = 30.0


@dataclass(frozen=True, slots=True)
class McpServer:
    """One administrator-enabled MCP server, as the settings validated it."""

    id: str
    transport: Literal["stdio", "http"]
    command: str = ""
    args: tuple[str, ...] = ()
    url: str = ""
    enabled: bool = True
    timeout_s: float = 30.0
    #: Agents the administrator grants every tool of this server (besides agents whose own
    #: tool list names the server or one of its tools).
    agents: tuple[str, ...] = ()
    #: A credential destination (``KAIZEN_CREDENTIAL_DESTINATIONS``) whose member credential
    #: every call of this HTTP server's tools carries; empty: uncredentialed.
    credential_destination: str = ""
    #: Tools the administrator approved as version 2 renderable-artifact producers
    #: (``tools/mcp_artifacts.py``); the server can neither add nor remove one.
    artifact_tools: frozenset[str] = frozenset()

    @property
    def selector(self) -> str:
        """The server's own policy and grant name: ``mcp__<id>``."""
        return server_selector(self.id)


def server_selector(server_id: str) -> str:
    return f"{PREFIX}{server_id}"


def server_origin(server: McpServer) -> str:
    """The origin of an HTTP server's URL as credential destinations spell it
    (``scheme://host[:port]``, lower case, a default port left out)."""
    parts = urlsplit(server.url)
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    shown = f"[{host}]" if ":" in host else host
    port = parts.port
    default = {"https": 443, "http": 80}.get(scheme)
    return f"{scheme}://{shown}" + (f":{port}" if port and port != default else "")


def tool_name(server_id: str, remote: str) -> str | None:
    """Our name of ``remote`` on ``server_id``, or None when it cannot be one (never
    repaired into another name)."""
    if not REMOTE_NAME_RE.fullmatch(remote):
        return None
    name = f"{PREFIX}{server_id}{SEPARATOR}{remote}"
    return name if len(name) <= MAX_NAME_CHARS else None


def parse_name(name: str) -> tuple[str, str | None] | None:
    """(server id, remote tool or None for the server selector) of an MCP name, else None."""
    if not name.startswith(PREFIX):
        return None
    server, sep, remote = name[len(PREFIX):].partition(SEPARATOR)
    if not SERVER_ID_RE.fullmatch(server):
        return None
    if not sep:
        return server, None
    return (server, remote) if REMOTE_NAME_RE.fullmatch(remote) else None


def effect_of(annotations: object) -> Capability:
    """The effect class of an MCP tool from its annotations (R-341).

    Only an explicit boolean ``read_only_hint`` of True is a read. An explicit
    ``destructive_hint`` of True is sensitive. Missing annotations, missing hints, and
    anything that is not exactly a boolean are a write: the server's name for the tool, its
    description or an earlier run never make it safer."""
    read_only = getattr(annotations, "read_only_hint", None)
    destructive = getattr(annotations, "destructive_hint", None)
    if read_only is True:
        return Capability.READ
    if destructive is True:
        return Capability.SENSITIVE
    return Capability.WRITE


def bounded_description(server: McpServer, remote: str, text: object) -> str:
    """The remote description cut to :data:`MAX_DESCRIPTION_CHARS`, marked as the server's."""
    body = text.strip() if isinstance(text, str) else ""
    if len(body) > MAX_DESCRIPTION_CHARS:
        body = body[:MAX_DESCRIPTION_CHARS].rstrip() + "…"
    head = f"[MCP server {server.id}] "
    return head + (body or f"The {remote} tool of this MCP server.")


def descriptor_for(server: McpServer, remote_tool: Any) -> ToolDescriptor | None:
    """The descriptor of one listed tool, or None when it cannot be named (logged)."""
    remote = getattr(remote_tool, "name", None)
    name = tool_name(server.id, remote) if isinstance(remote, str) else None
    if name is None:
        log.warning("MCP server %s lists a tool whose name cannot be a tool name (%r); "
                    "omitted", server.id, str(remote)[:80])
        return None
    schema = getattr(remote_tool, "input_schema", None)
    capability = effect_of(getattr(remote_tool, "annotations", None))
    category = (WriteCategory.NONE if capability is Capability.READ
                else WriteCategory.EXTERNAL_EFFECT)
    if remote in server.artifact_tools and capability is Capability.READ:
        # An approved producer's call writes a governed artifact to the member's store, so
        # a read-only hint cannot make it a read: it passes the write guard like
        # create_artifact does (tools/mcp_artifacts.py).
        capability, category = Capability.WRITE, WriteCategory.MEMBER_STORE
    return ToolDescriptor(
        name=name,
        description=bounded_description(server, name[len(server.selector) + 2:],
                                        getattr(remote_tool, "description", None)),
        # Handed to the catalog as listed: its admission checks it and omits it if bad.
        input_schema=schema if isinstance(schema, Mapping) else {"invalid": repr(schema)[:80]},
        capability=capability,
        timeout_s=min(server.timeout_s, MAX_TIMEOUT_S),
        # A remote tool's repeat may well create a second object: never deduplicated.
        repeat_creates_object=capability is not Capability.READ,
        # No reviewed audience class: private turns only.
        room_class=RoomClass.UNKNOWN,
        write_category=category,
        surface=f"{SURFACE_PREFIX}{server.id}",
        first_party=False,
        extra={"mcp_server": server.id, "mcp_tool": remote},
    )


class McpUnavailable(MemberSafeError):
    """The server could not be reached before anything was sent: nothing ran."""


T = TypeVar("T")


class ListingCredential(Protocol):
    """A broker handle for one listing (``credentials/broker.py: BrokerHandle``)."""

    async def attach(self, target_origin: str,
                     perform: Callable[[Any], Awaitable[T]]) -> T: ...

    def scrub(self, value: object) -> object: ...

    def close(self) -> None: ...


class ListingCredentials(Protocol):
    """The credential quarantine as discovery asks it (``credentials/service.py``)."""

    async def listing_credential(self, member: str, destination_id: str,
                                 operation: str) -> ListingCredential | None:
        """A handle on ``member``'s remembered credential for the destination that the live
        policy allows now, or None."""
        ...


#: Why a server gave no tools this run (``Discovered.reasons``).
REASON_UNREACHABLE = "mcp_unavailable"
REASON_CREDENTIAL_REQUIRED = "credential_required"
REASON_CREDENTIAL_REJECTED = "credential_rejected"


class McpCallFailed(Exception):
    """The server failed after the call was sent (its outcome is unknown for a write)."""


NOTHING_DISCOVERED = Discovered()


class McpSources:
    """The enabled MCP servers: discovery for a run, and the call of one tool."""

    def __init__(self, servers: Iterable[McpServer], *,
                 stdio_commands: Iterable[str] = (),
                 egress: McpEgressGate | None = None) -> None:
        self._servers = {s.id: s for s in servers}
        self._commands = frozenset(stdio_commands)
        # The signed egress policy's gate, when the deployment configured one (docs/mcp.md,
        # "Egress"); None: HTTP servers answer to KAIZEN_MCP_SERVERS alone.
        self._egress = egress

    @property
    def servers(self) -> Mapping[str, McpServer]:
        return self._servers

    def enabled(self) -> tuple[McpServer, ...]:
        return tuple(s for s in self._servers.values() if s.enabled)

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a configured server's selector or could be one of its tools
        (for the admin tool policies)."""
        parsed = parse_name(name)
        return parsed is not None and parsed[0] in self._servers

    def parent_of(self, name: str) -> str | None:
        """The server selector above an MCP tool name (its policy ceiling), else None."""
        parsed = parse_name(name)
        if parsed is None or parsed[1] is None:
            return None
        return server_selector(parsed[0])

    def granted_servers(self, agent_id: str, ceiling: Iterable[str]) -> tuple[McpServer, ...]:
        """The enabled servers this agent may use some tool of: the agent's tool list names
        the server or one of its tools, or the server's settings grant the agent."""
        names = set(ceiling)
        granted = []
        for server in self.enabled():
            if agent_id in server.agents or server.selector in names or any(
                    n.startswith(server.selector + SEPARATOR) for n in names):
                granted.append(server)
        return tuple(granted)

    @staticmethod
    def agent_grants(server: McpServer, agent_id: str, ceiling: Iterable[str],
                     name: str) -> bool:
        names = set(ceiling)
        return agent_id in server.agents or server.selector in names or name in names

    async def discover(self, servers: Sequence[McpServer], *, member: str = "",
                       credentials: ListingCredentials | None = None) -> Discovered:
        """The tools of ``servers``, each contacted once, concurrently, as ``member`` (whose
        remembered credential lists a bound server); a server that fails contributes nothing
        and is named in ``unavailable``, with its reason in ``reasons``."""
        if not servers:
            return NOTHING_DISCOVERED
        results = await asyncio.gather(*(self._discover_one(s, member, credentials)
                                         for s in servers))
        tools: list[RegisteredTool] = []
        down: list[str] = []
        reasons: list[tuple[str, str]] = []
        for server, (found, reason) in zip(servers, results, strict=True):
            if found is None:
                down.append(server.id)
                reasons.append((server.id, reason))
            else:
                tools.extend(found)
        return Discovered(tuple(tools), tuple(down), tuple(reasons))

    async def _discover_one(self, server: McpServer, member: str,
                            credentials: ListingCredentials | None,
                            ) -> tuple[list[RegisteredTool] | None, str]:
        watch = AuthWatch()
        handle: ListingCredential | None = None
        try:
            async with asyncio.timeout(min(DISCOVERY_TIMEOUT_S, server.timeout_s)):
                if server.credential_destination and credentials is not None and member:
                    handle = await credentials.listing_credential(
                        member, server.credential_destination,
                        f"{server.selector} tools/list")
                if handle is None:
                    listed = await self._list_tools(server, watch=watch)
                else:
                    bound = handle

                    async def listing(injector: RequestCredential) -> list[Any]:
                        return await self._list_tools(server, credential=injector,
                                                      watch=watch)

                    listed = await bound.attach(server_origin(server), listing)
        except Exception as exc:
            if handle is not None:
                handle.close()
            reason = _reason(exc, watch, credentialed=handle is not None)
            log.warning("MCP server %s: discovery failed (%s, %s); it gives no tools this run",
                        server.id, reason, _kind(exc))
            return None, reason
        try:
            return self._registered(server, listed, handle), ""
        finally:
            if handle is not None:
                handle.close()

    def _registered(self, server: McpServer, listed: Sequence[Any],
                    handle: ListingCredential | None) -> list[RegisteredTool]:
        tools: list[RegisteredTool] = []
        seen: set[str] = set()
        for remote_tool in listed[:MAX_TOOLS_PER_SERVER]:
            descriptor = descriptor_for(server, remote_tool)
            if descriptor is None or descriptor.name in seen:
                continue
            if handle is not None:
                # Listed with the member's value: what the server said may echo it.
                if handle.scrub(descriptor.extra["mcp_tool"]) != descriptor.extra["mcp_tool"]:
                    continue  # a name carrying the value is not offered under any name
                schema = handle.scrub(descriptor.input_schema)
                descriptor = replace(
                    descriptor, description=str(handle.scrub(descriptor.description)),
                    input_schema=schema if isinstance(schema, Mapping) else {})
            seen.add(descriptor.name)
            registered = RegisteredTool(descriptor=descriptor,
                                        impl=self._impl(server, descriptor))
            if server.credential_destination:
                if not isinstance(descriptor.input_schema.get("properties", {}), Mapping):
                    continue  # the catalog would refuse it anyway
                registered = replace(registered, descriptor=replace(
                    descriptor, input_schema=with_credential_ref(descriptor.input_schema),
                    extra={**descriptor.extra,
                           CREDENTIAL_DESTINATION_KEY: server.credential_destination}))
            tools.append(registered)
        if len(listed) > MAX_TOOLS_PER_SERVER:
            log.warning("MCP server %s lists %d tools; the first %d are used", server.id,
                        len(listed), MAX_TOOLS_PER_SERVER)
        return tools

    def _impl(self, server: McpServer, descriptor: ToolDescriptor) -> Any:
        remote = str(descriptor.extra["mcp_tool"])
        sources = self

        async def call_mcp_tool(ctx: ToolContext, **arguments: Any) -> dict[str, Any]:
            body = await send_call(ctx, arguments)
            if remote in server.artifact_tools:
                # The admin's registration, read here from the settings, never the server's
                # descriptor, makes this result a governed artifact.
                if server.credential_destination:
                    handle = arguments.get(CREDENTIAL_HANDLE_ARGUMENT)
                    body = _scrubbed(handle, body)
                return await govern(ctx, server_id=server.id, remote=remote,
                                    producer=descriptor.name, body=body)
            return body

        async def send_call(ctx: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
            arguments = dict(arguments)
            handle = arguments.pop(CREDENTIAL_HANDLE_ARGUMENT, None)
            if server.credential_destination:
                if handle is None:
                    raise MemberSafeError(f"{remote} on the MCP server {server.id} needs a "
                                          "credential, so it was not run.",
                                          code="credential_required")

                async def send(injector: RequestCredential) -> dict[str, Any]:
                    return await sources.call(server, remote, arguments, credential=injector)

                # The broker checks the origin and the live policy, claims the receipt and
                # hands over the injector for this one call (docs/credentials.md).
                result: dict[str, Any] = await handle.attach(server_origin(server), send)
                return result
            sessions = ctx.services.get(SESSIONS_SERVICE)
            if isinstance(sessions, RunSessions):
                return await sessions.call(server, remote, arguments)
            return await sources.call(server, remote, arguments)

        call_mcp_tool.__name__ = descriptor.name
        return call_mcp_tool

    # --- the SDK ------------------------------------------------------------------------

    def _target(self, server: McpServer) -> Any:
        """What the SDK's ``Client`` connects to. A stdio command is re-checked against the
        allowlist here, at the one place a process is started."""
        if server.transport == "stdio":
            if server.command not in self._commands:
                raise McpUnavailable(
                    f"The MCP server {server.id} is not allowed to start here.",
                    code="mcp_command_not_allowed")
            from mcp import StdioServerParameters

            # The SDK starts it with its own small default environment: the server's
            # secrets are not inherited.
            return StdioServerParameters(command=server.command, args=list(server.args))
        return server.url

    async def _open(self, stack: AsyncExitStack, server: McpServer, *,
                    credential: RequestCredential | None = None,
                    watch: AuthWatch | None = None) -> Any:
        """An entered SDK ``Client`` for one session with ``server``, closed with ``stack``.
        An HTTP session gets its own client from ``tools/mcp_http.py`` (the egress policy,
        the credential); :class:`McpUnavailable` when the policy refuses it (nothing sent)."""
        from mcp import Client

        target = self._target(server)
        if server.transport == "http":
            from mcp.client.streamable_http import streamable_http_client

            try:
                http = await session_client(server.url, timeout_s=server.timeout_s,
                                            gate=self._egress, credential=credential,
                                            watch=watch)
            except McpEgressRefused as refused:
                log.warning("MCP server %s refused by the signed egress policy (%s)",
                            server.id, refused.code)
                # The member is told which server and why, never its address.
                raise McpUnavailable(
                    f"The MCP server {server.id} cannot be reached: this server's signed "
                    f"egress policy does not allow it now ({refused.code}). An administrator "
                    "must add its origin to the policy or renew the policy.",
                    code=refused.code) from None
            http = await stack.enter_async_context(http)
            target = streamable_http_client(server.url, http_client=http)
        elif credential is not None:
            raise McpUnavailable(f"The MCP server {server.id} takes no credentials.",
                                 code="mcp_credential_refused")
        return await stack.enter_async_context(
            Client(target, read_timeout_seconds=server.timeout_s, cache=None))

    async def _list_tools(self, server: McpServer, *,
                          credential: RequestCredential | None = None,
                          watch: AuthWatch | None = None) -> list[Any]:
        async with AsyncExitStack() as stack:
            client = await self._open(stack, server, credential=credential, watch=watch)
            listed: list[Any] = []
            cursor: str | None = None
            for _ in range(MAX_LIST_PAGES):
                page = await client.list_tools(cursor=cursor)
                listed.extend(page.tools)
                cursor = page.next_cursor
                if not cursor or len(listed) >= MAX_TOOLS_PER_SERVER:
                    break
            return listed

    async def call(self, server: McpServer, remote: str, arguments: Mapping[str, Any], *,
                   credential: RequestCredential | None = None) -> dict[str, Any]:
        """Call one tool on its own server; a bounded body. Raises :class:`McpUnavailable`
        when the server could not be reached (nothing was sent), :class:`McpCallFailed`
        when it failed after the call was sent. With ``credential`` the call has a session
        and an HTTP client of its own carrying it, closed when the call ends."""
        sent = False
        result: Any = None
        try:
            async with AsyncExitStack() as stack:
                client = await self._open(stack, server, credential=credential)
                sent = True
                result = await client.call_tool(remote, dict(arguments))
        except McpUnavailable:
            raise
        except Exception as exc:
            if not sent:
                log.warning("MCP server %s unreachable for %s (%s)", server.id, remote,
                            _kind(exc))
                raise _unreachable(server, remote) from None
            if result is None:
                raise McpCallFailed(f"MCP server {server.id} failed during {remote} "
                                    f"({_kind(exc)})") from None
            # The result arrived; closing the session failed afterwards, which changes nothing.
            log.info("MCP server %s: closing after %s failed (%s)", server.id, remote,
                     _kind(exc))
        return result_body(server, remote, result)


@dataclass(slots=True)
class _Call:
    remote: str
    arguments: dict[str, Any]
    future: asyncio.Future[dict[str, Any]]
    sent: bool = False


class _Session:
    """One run's open session with one server, served by a task of its own (the SDK's client
    is entered and left in that one task); calls are sent one at a time, in order."""

    def __init__(self, sources: McpSources, server: McpServer) -> None:
        self._sources = sources
        self._server = server
        self._queue: asyncio.Queue[_Call] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def _ensure_worker(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._serve(), name=f"mcp-{self._server.id}")

    async def call(self, remote: str, arguments: dict[str, Any]) -> dict[str, Any]:
        item = _Call(remote, arguments, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(item)
        self._ensure_worker()
        try:
            return await item.future
        except asyncio.CancelledError:
            # Given up (its timeout, the turn stopped): awaiting the future cancelled it, so
            # a call still waiting is never sent; one already sent stops with its session
            # (which also ends a stdio server).
            if item.sent and self._task is not None:
                self._task.cancel()
            raise

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _serve(self) -> None:
        server = self._server
        try:
            async with AsyncExitStack() as stack:
                client = await self._sources._open(stack, server)
                while True:
                    try:
                        item = await asyncio.wait_for(self._queue.get(), SESSION_IDLE_S)
                    except TimeoutError:
                        return
                    if item.future.done():
                        continue  # given up before it was sent
                    item.sent = True
                    try:
                        result = await client.call_tool(item.remote, item.arguments)
                    except Exception as exc:
                        if not item.future.done():
                            item.future.set_exception(McpCallFailed(
                                f"MCP server {server.id} failed during {item.remote} "
                                f"({_kind(exc)})"))
                        return  # the session may be broken: the next call opens another
                    if not item.future.done():
                        item.future.set_result(result_body(server, item.remote, result))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Connecting failed (or closing did, after the last answer): nothing waiting
            # was sent.
            log.warning("MCP server %s: session failed (%s)", server.id, _kind(exc))
            self._fail_waiting(exc)
        finally:
            if not self._queue.empty():
                # Calls queued behind one that ended the session get a fresh one.
                self._task = asyncio.create_task(self._serve(), name=f"mcp-{server.id}")

    def _fail_waiting(self, error: Exception) -> None:
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item.future.done():
                continue
            if isinstance(error, McpUnavailable):
                item.future.set_exception(McpUnavailable(str(error), code=error.code))
            else:
                item.future.set_exception(_unreachable(self._server, item.remote))


def _unreachable(server: McpServer, remote: str) -> McpUnavailable:
    return McpUnavailable(
        f"The MCP server {server.id} is not reachable, so {remote} was not run. "
        "Try again later or answer without it.", code="mcp_unavailable")


class RunSessions:
    """The MCP sessions of one run, opened at a server's first call and kept for the next
    ones (a stdio server is started once per run, not per call); each closes after
    :data:`SESSION_IDLE_S` without a call."""

    def __init__(self, sources: McpSources) -> None:
        self._sources = sources
        self._sessions: dict[str, _Session] = {}

    async def call(self, server: McpServer, remote: str,
                   arguments: Mapping[str, Any]) -> dict[str, Any]:
        session = self._sessions.get(server.id)
        if session is None:
            session = self._sessions[server.id] = _Session(self._sources, server)
        return await session.call(remote, dict(arguments))

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()


def result_body(server: McpServer, remote: str, result: Any) -> dict[str, Any]:
    """A call's result as a JSON body, bounded to :data:`MAX_RESULT_CHARS` of text (a
    declared artifact producer's to :data:`MAX_PRODUCER_TEXT_CHARS`: its envelope never
    reaches the model, the governed writer takes it). Binary content is described (type,
    media type, size), never carried. A result the server marks as an error says so in the
    body, which the pipeline reads as a failure (R-274)."""
    budget = (MAX_PRODUCER_TEXT_CHARS if remote in server.artifact_tools
              else MAX_RESULT_CHARS)
    parts: list[dict[str, Any]] = []
    truncated = False
    for block in getattr(result, "content", None) or ():
        kind = getattr(block, "type", "unknown")
        if kind == "text":
            text = str(getattr(block, "text", ""))
            if len(text) > budget:
                text, truncated = text[:budget], True
            budget -= len(text)
            parts.append({"type": "text", "text": text})
        else:
            data = getattr(block, "data", None)
            parts.append({"type": str(kind)[:40],
                          "mime_type": str(getattr(block, "mime_type", "") or "")[:100],
                          **({"bytes": len(data)} if isinstance(data, str) else {})})
        if budget <= 0:
            truncated = True
            break
    body: dict[str, Any] = {"server": server.id, "tool": remote, "content": parts}
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        try:
            text = json.dumps(structured, ensure_ascii=False)
        except (TypeError, ValueError):
            text = ""
        if text and len(text) <= max(budget, 0):
            body["structured"] = structured
        elif text:
            truncated = True
    if truncated:
        body["truncated"] = True
    if getattr(result, "is_error", False):
        first = next((p["text"] for p in parts if p.get("type") == "text"), "")
        body["ok"] = False
        body["error"] = {"message": first[:500] or f"{remote} reported an error."}
    return body


def _scrubbed(handle: object, body: dict[str, Any]) -> dict[str, Any]:
    """A credential-backed producer's body scrubbed of the member's value before it is
    stored (the pipeline scrubs only what it is handed back, after the write)."""
    scrub = getattr(handle, "scrub", None)
    if scrub is None:
        return body
    cleaned = scrub(body)
    return cleaned if isinstance(cleaned, dict) else body


def _reason(exc: BaseException, watch: AuthWatch, *, credentialed: bool) -> str:
    """Why a listing gave nothing, as a code (``Discovered.reasons``)."""
    if watch.refused:
        return REASON_CREDENTIAL_REJECTED if credentialed else REASON_CREDENTIAL_REQUIRED
    if isinstance(exc, MemberSafeError) and exc.code:
        return exc.code  # the egress policy's, the broker's (e.g. destination_denied)
    return REASON_UNREACHABLE


def _kind(exc: BaseException) -> str:
    """The exception's type names (an exception group's members too), never its text."""
    if isinstance(exc, BaseExceptionGroup):
        return ", ".join(sorted({_kind(e) for e in exc.exceptions}))
    return type(exc).__name__


__all__ = ["Discovered", "McpCallFailed", "McpServer", "McpSources", "McpUnavailable",
           "descriptor_for", "effect_of", "parse_name", "result_body", "server_selector",
           "tool_name"]
