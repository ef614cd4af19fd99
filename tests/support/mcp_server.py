"""A small real MCP server for the MCP source tests, written with the official SDK's server side.

``python -m tests.support.mcp_server stdio --log PATH`` serves over stdin/stdout;
``python -m tests.support.mcp_server http --port N --log PATH`` serves streamable HTTP on
loopback at ``/mcp``. Each tool that runs appends one JSON line to ``--log``, so a test can
tell whether a call reached the server (an unapproved write must not).

Over HTTP, ``--require-bearer TOKEN`` answers ``401`` to every request (the initialize
handshake and ``tools/list`` included) that does not carry ``Authorization: Bearer TOKEN``,
and logs each request's outcome to ``--log`` as ``{"http": "refused" | "accepted"}``;
``--tls-cert PEM --tls-key PEM`` serves https instead of http.

Tools, by what their annotations declare:

* ``lookup``: ``readOnlyHint: true`` (a read);
* ``get_forecast``: no annotations at all, though its name sounds like a read (a write);
* ``record_note``: ``readOnlyHint: false, destructiveHint: false`` (a write);
* ``wipe_notes``: ``destructiveHint: true`` (sensitive);
* ``huge``: a read whose text result is far larger than any tool result may be;
* ``bad_schema``: a read whose input schema fails the 2020-12 meta-schema;
* ``slow``: a read that answers after ``seconds`` (logged when it answers);
* ``flaky``: a read that reports ``isError``;
* ``whoami``: a read that answers with the ``Authorization`` header its request carried
  (echoing a credential, which the echo guard must scrub) and logs it as ``authorization``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

HUGE_CHARS = 200_000
#: An input schema no 2020-12 validator accepts ("type" must name a JSON type).
INVALID_SCHEMA = {"type": "object", "properties": {"q": {"type": "nonsense"}}}


def build(log: Path) -> MCPServer:
    server = MCPServer("kaizen-test-mcp")

    def ran(tool: str, **arguments: object) -> None:
        with log.open("a") as out:
            out.write(json.dumps({"tool": tool, "arguments": arguments, "at": time.time(),
                                  "pid": os.getpid()}) + "\n")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def lookup(q: str) -> str:
        """Look a word up in the test glossary."""
        ran("lookup", q=q)
        return f"glossary: {q} means testing"

    @server.tool()
    def get_forecast(city: str) -> str:
        """Get the forecast for a city."""
        ran("get_forecast", city=city)
        return f"forecast for {city}: sunny"

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
    def record_note(text: str) -> str:
        """Record a note on the test server."""
        ran("record_note", text=text)
        return f"recorded: {text}"

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    def wipe_notes() -> str:
        """Delete every note on the test server."""
        ran("wipe_notes")
        return "wiped"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def huge() -> str:
        """Return a very large text."""
        ran("huge")
        return "x" * HUGE_CHARS

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def bad_schema(q: str) -> str:
        """A tool whose advertised input schema is invalid."""
        ran("bad_schema", q=q)
        return q

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def slow(seconds: float) -> str:
        """Answer after a while."""
        await anyio.sleep(seconds)
        ran("slow", seconds=seconds)
        return "slow done"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def flaky() -> str:
        """A read that fails."""
        ran("flaky")
        raise RuntimeError("the flaky tool failed on purpose")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def whoami(ctx: Context) -> str:
        """Say which credential the request carried."""
        headers = ctx.headers or {}
        authorization = headers.get("authorization", "")
        ran("whoami", authorization=authorization)
        return f"you sent: {authorization or 'nothing'}"

    # The SDK derives schemas from signatures; this one is replaced by an invalid one.
    server._tool_manager.get_tool("bad_schema").parameters = INVALID_SCHEMA  # type: ignore[union-attr]
    return server


def bearer_required(app: Any, token: str, log: Path) -> Any:
    """``app`` behind a bearer check of every HTTP request (see the module docstring)."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        sent = dict(scope.get("headers") or []).get(b"authorization", b"")
        ok = sent == expected
        with log.open("a") as out:
            out.write(json.dumps({"http": "accepted" if ok else "refused",
                                  "method": scope.get("method")}) + "\n")
        if ok:
            await app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"text/plain"),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": b"a bearer token is required"})

    return guarded


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--require-bearer", default="")
    parser.add_argument("--tls-cert", default="")
    parser.add_argument("--tls-key", default="")
    args = parser.parse_args()
    server = build(args.log)
    if args.transport == "stdio":
        server.run("stdio")
        return
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    # Pinned connections keep the Host the URL named (127.0.0.1:port); no rebinding check
    # beyond loopback is needed for a test server that listens on loopback only.
    app: Any = server.streamable_http_app(
        streamable_http_path="/mcp",
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    if args.require_bearer:
        app = bearer_required(app, args.require_bearer, args.log)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning",
                ssl_certfile=args.tls_cert or None, ssl_keyfile=args.tls_key or None)


if __name__ == "__main__":
    main()
