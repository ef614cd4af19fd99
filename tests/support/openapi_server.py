"""A local HTTPS OpenAPI service on loopback for the external-source tests.

It serves OpenAPI documents (JSON or YAML, with ETags and ``304`` revalidation) and the
operations they describe, over TLS with a certificate from a throwaway ``trustme`` CA (the
Kaizen server under test trusts it through ``KAIZEN_OPENAPI_CA_FILE``). Every request it
receives is recorded — method, path, query, headers and body — so a test can prove what did
and did not reach it. Runs in a thread of the test process; nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import trustme


@dataclass
class Document:
    body: bytes
    content_type: str = "application/json"
    etag: str | None = None


@dataclass
class Received:
    method: str
    path: str
    query: list[tuple[str, str]]
    headers: dict[str, str]
    body: bytes
    #: The common name of the client certificate the request came with ("" without one).
    peer: str = ""


@dataclass
class ServiceState:
    documents: dict[str, Document] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    #: Paths answered 503 while listed (a source that is down).
    failing: set[str] = field(default_factory=set)
    #: Seconds to wait before answering a document (to overlap concurrent fetches).
    document_delay_s: float = 0.0
    #: Where ``/api/redirect`` sends its caller.
    redirect_to: str = "https://127.0.0.1:1/elsewhere"
    #: Text ``/api/peer`` adds to its answer (a service echoing what it should not).
    peer_note: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _answer(self, status: int, body: bytes = b"", content_type: str = "application/json",
                headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        if body or status not in (204, 304):
            self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _json(self, status: int, value: Any, headers: dict[str, str] | None = None) -> None:
        self._answer(status, json.dumps(value).encode(), headers=headers)

    def _handle(self) -> None:
        state = self.server.state
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with state.lock:
            state.received.append(Received(self.command, parts.path, parse_qsl(parts.query),
                                           {k.lower(): v for k, v in self.headers.items()},
                                           body, _peer_name(self.connection)))
        if parts.path in state.failing:
            self._json(503, {"error": "down"})
            return
        document = state.documents.get(parts.path)
        if document is not None and self.command == "GET":
            if state.document_delay_s:
                time.sleep(state.document_delay_s)
            if document.etag and self.headers.get("If-None-Match") == document.etag:
                self._answer(304, headers={"ETag": document.etag})
                return
            headers = {"ETag": document.etag} if document.etag else {}
            self._answer(200, document.body, document.content_type, headers)
            return
        self._operation(parts.path, parse_qsl(parts.query), body)

    def _operation(self, path: str, query: list[tuple[str, str]], body: bytes) -> None:
        segments = [s for s in path.split("/") if s]
        if segments[:2] == ["api", "items"] and len(segments) == 3:
            item = segments[2]
            if self.command == "GET":
                self._json(200, {"id": item, "name": f"item {item}", "query": dict(query),
                                 "access_token": "tok-123-from-the-source"})
                return
            if self.command == "DELETE":
                self._json(200, {"deleted": item})
                return
        if path == "/api/items" and self.command == "POST":
            self._json(201, {"created": json.loads(body or b"null")})
            return
        if path == "/api/search" and self.command == "POST":
            self._json(200, {"results": ["a", "b"]})
            return
        if path == "/api/redirect":
            self._answer(302, headers={"Location": self.server.state.redirect_to})
            return
        if path == "/api/whoami":
            # Echoes the credential it got (the credential tests' echo guard must scrub it).
            self._json(200, {"x_key": self.headers.get("X-Key"),
                             "authorization": self.headers.get("Authorization"),
                             "query": dict(query)})
            return
        if path == "/api/peer":
            # The client certificate the connection came with (mutual TLS), by common name.
            note = self.server.state.peer_note
            self._json(200, {"peer": _peer_name(self.connection) or None,
                             **({"note": note} if note else {})})
            return
        if path == "/api/headers":
            self._json(200, {"seen": sorted(self.headers.keys())})
            return
        if path == "/api/huge":
            self._answer(200, b"x" * (2 * 1024 * 1024), "text/plain")
            return
        if path == "/api/drop":
            # The request arrived; the connection ends without an answer (outcome unknown).
            self.close_connection = True
            return
        if path == "/api/broken":
            self._json(500, {"error": "internal detail that should stay bounded"})
            return
        self._json(404, {"error": "no such operation"})

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle


def _peer_name(connection: Any) -> str:
    certificate = connection.getpeercert() if hasattr(connection, "getpeercert") else None
    for rdn in (certificate or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: ServiceState

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that refuses the certificate, or a dropped connection, is what some tests
        # do on purpose: nothing to print.
        return


class OpenApiService:
    """``with OpenApiService(tmp) as service: service.origin`` — see the module docstring."""

    def __init__(self, directory: Path, ca: trustme.CA | None = None, *,
                 client_ca: trustme.CA | None = None, client_cert_optional: bool = False,
                 ) -> None:
        """``client_ca``: require a client certificate it issued on every connection (mutual
        TLS); a connection without one fails its handshake. With ``client_cert_optional`` a
        connection may come without one (``Received.peer`` is then empty)."""
        self.ca = ca or trustme.CA()
        self.ca_file = directory / "openapi-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.state = ServiceState()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = self.state
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
        if client_ca is not None:
            context.verify_mode = ssl.CERT_OPTIONAL if client_cert_optional \
                else ssl.CERT_REQUIRED
            client_ca.configure_trust(context)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def origin(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.origin}{path}"

    def serve(self, path: str, document: dict[str, Any] | bytes, *,
              content_type: str = "application/json", etag: str | None = None) -> None:
        body = document if isinstance(document, bytes) else json.dumps(document).encode()
        self.state.documents[path] = Document(body, content_type, etag)

    def received(self, path: str | None = None) -> list[Received]:
        with self.state.lock:
            return [r for r in self.state.received if path is None or r.path == path]

    def __enter__(self) -> OpenApiService:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def items_document(**extra_paths: Any) -> dict[str, Any]:
    """The service's own API: reads, a write, a sensitive delete, annotated and unannotated
    operations, and operations that must be omitted."""
    item_id = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Items", "version": "1"},
        # Ignored by Kaizen: requests go to the registered API base only.
        "servers": [{"url": "https://127.0.0.2:9/elsewhere"}],
        "paths": {
            "/api/items/{id}": {
                "parameters": [item_id],
                "get": {"operationId": "getItem", "summary": "Read one item",
                        "parameters": [{"name": "verbose", "in": "query",
                                        "schema": {"type": "boolean"}},
                                       {"name": "X-Trace", "in": "header",
                                        "schema": {"type": "string"}}]},
                "delete": {"operationId": "deleteItem", "summary": "Delete one item"},
            },
            "/api/items": {"post": {
                "operationId": "createItem", "summary": "Create an item",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/NewItem"}}}}}},
            "/api/search": {"post": {
                "operationId": "searchItems", "summary": "Search (a POST that only reads)",
                "x-effect": "read",
                "requestBody": {"content": {"application/json": {
                    "schema": {"type": "object", "properties": {"q": {"type": "string"}}}}}}}},
            "/api/lookup": {"post": {
                "operationId": "lookupItems",
                "summary": "Looks like a read by its name, but declares nothing"}},
            "/api/redirect": {"get": {"operationId": "followMe"}},
            "/api/headers": {"get": {"operationId": "showHeaders"}},
            "/api/huge": {"get": {"operationId": "hugeText"}},
            "/api/broken": {"get": {"operationId": "brokenRead"}},
            "/api/drop": {"get": {"operationId": "dropRead"},
                          "post": {"operationId": "dropWrite"}},
            "/api/login": {"post": {
                "operationId": "login",
                "requestBody": {"content": {"application/json": {"schema": {
                    "type": "object", "properties": {"user": {"type": "string"},
                                                     "password": {"type": "string"}}}}}}}},
            "/api/private": {"get": {"operationId": "privateThing",
                                     "security": [{"key": []}]}},
            "/api/needs-header": {"get": {"operationId": "needsHeader", "parameters": [
                {"name": "X-Api-Version", "in": "header", "required": True,
                 "schema": {"type": "string"}}]}},
            "/api/bad-effect": {"get": {"operationId": "badEffect", "x-effect": "harmless"}},
            "/api/bad-schema": {"get": {"operationId": "badSchema", "parameters": [
                {"name": "n", "in": "query", "schema": {"type": "integer",
                                                        "minimum": "zero"}}]}},
            "/api/no-id": {"get": {"summary": "no operationId"}},
            **extra_paths,
        },
        "components": {
            "schemas": {"NewItem": {"type": "object", "required": ["name"],
                                    "properties": {"name": {"type": "string"}}}},
            "securitySchemes": {"key": {"type": "apiKey", "in": "header",
                                        "name": "X-Key"}},
        },
    }


def many_operations_document(count: int) -> dict[str, Any]:
    return {"openapi": "3.1.0", "info": {"title": "Many", "version": "1"},
            "paths": {f"/op/{n}": {"get": {"operationId": f"op{n}"}} for n in range(count)}}


def oversized_document(size: int) -> bytes:
    """A valid-looking JSON document of at least ``size`` bytes."""
    head = b'{"openapi": "3.1.0", "info": {"title": "Big"}, "paths": {}, "x-pad": "'
    return head + b"a" * max(0, size - len(head) - 2) + b'"}'


def iter_header_names(received: list[Received]) -> Iterator[str]:
    for request in received:
        yield from request.headers


def reaching(service: OpenApiService, directory: Path) -> dict[str, str]:
    """A Kaizen server's settings to reach ``service`` on loopback: the egress networks and
    port, the service's CA, and a deployment's signed egress policy (written in
    ``directory``) naming its origin (R-379)."""
    from tests.support.egress_policy import policy_env

    return {"KAIZEN_OPENAPI_EGRESS_NETWORKS": "127.0.0.1/32",
            "KAIZEN_OPENAPI_EGRESS_PORTS": str(service.port),
            "KAIZEN_OPENAPI_CA_FILE": str(service.ca_file),
            **policy_env(directory, [service.origin])}
