"""A small external HTTP API for the credential tests, run as its own process.

``python tests/support/credential_api.py --port N --log FILE`` serves on loopback and appends
one JSON line per request it received (method, path, query, the credential-bearing headers as
sent) to FILE, so a test can see what actually reached the destination and how many times.

* ``GET /whoami``: 200, and echoes the credential it got back in several encodings (the echo
  guard must scrub every one before the model sees the result);
* ``POST /orders``: 201 ``{"created": true}``;
* ``GET /redirect``: 302 to ``/whoami`` (the broker must not follow it);
* ``POST /hang`` and ``GET /hang``: reads the request, then closes the connection without an
  answer (delivery uncertain);
* anything else: 404.
"""

from __future__ import annotations

import argparse
import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, urlsplit

_LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    log_path: Path

    def log_message(self, format: str, *args: object) -> None:
        return

    def _record(self) -> dict[str, object]:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8", errors="replace") if length else ""
        parts = urlsplit(self.path)
        entry = {"method": self.command, "path": parts.path, "query": parts.query,
                 "authorization": self.headers.get("Authorization"),
                 "x_api_key": self.headers.get("X-Api-Key"),
                 "cookie": self.headers.get("Cookie"), "body": body}
        with _LOCK, self.log_path.open("a") as log:
            log.write(json.dumps(entry) + "\n")
        return entry

    def _answer(self, status: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _hang_up(self) -> None:
        # The request was read; no answer ever comes.
        self.close_connection = True
        self.wfile.flush()
        self.connection.shutdown(2)

    def do_GET(self) -> None:
        entry = self._record()
        path = entry["path"]
        if path == "/whoami":
            seen = str(entry["authorization"] or entry["x_api_key"] or "")
            secret = seen.split(" ", 1)[1] if seen.startswith("Bearer ") else seen
            self._answer(200, {
                "ok": True, "you_sent": seen, "token": secret,
                "echo_url": f"https://example.test/cb?state={quote(secret, safe='')}",
                "echo_b64": base64.b64encode(secret.encode()).decode(),
                "note": f"server saw {secret} on this request"})
        elif path == "/hang":
            self._hang_up()
        elif path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/whoami")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._answer(404, {"error": "not found"})

    def do_POST(self) -> None:
        entry = self._record()
        if entry["path"] == "/orders":
            self._answer(201, {"created": True})
        elif entry["path"] == "/hang":
            self._hang_up()
        else:
            self._answer(404, {"error": "not found"})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args()
    Handler.log_path = args.log
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
