"""The server side of the ``tools.call`` bridge (the kernel side is in ``prelude_py``).

Code in a kernel calls ``tools.call(name, {...})``; the prelude POSTs
``{"tool": name, "arguments": {...}}`` over loopback HTTP to :class:`BridgeHandler` with
``Authorization: Bearer <lease token>``. The handler

1. refuses oversize bodies (413) — by ``Content-Length`` before reading and by counting
   while streaming;
2. authenticates the token against the live leases (401 ``unknown_token``) and requires an
   execution in flight on that lease (401 ``expired``): a token outside its call grants
   nothing;
3. refuses recursive ``run_code`` (403 ``recursive_run_code``), names not advertised to the
   call (404 ``unknown_tool``, R-171) and anything but read tools (403 ``write_refused``,
   R-174);
4. awaits the injected ``dispatch(lease, tool_name, arguments) -> dict``, which is where the
   host repeats its snapshot, descriptor, guardrail and permission checks (R-173); a run
   whose admitted snapshot no longer holds is refused with 409 ``run_authority_changed``.

It deliberately does not subclass jupyter_server's ``JupyterHandler``: the kernel holds no
server credential, only the lease secret, and cookie/XSRF auth does not apply.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import tornado.web

from kaizen_kernel.leases import KernelLease, LeaseManager
from kaizen_kernel.schema import TOOL_NAME
from kaizen_server_extension.protocol.authority import AuthorityRejected
from kaizen_server_extension.protocol.errors import MemberSafeError, RunCancelled
from kaizen_server_extension.protocol.tools import Capability

log = logging.getLogger(__name__)

BRIDGE_PATH = "kaizen/kernel-bridge"
DEFAULT_MAX_BODY_BYTES = 256 * 1024
DEFAULT_MAX_RESULT_BYTES = 4 * 1024 * 1024
_LOOPBACK = ("127.", "::1", "::ffff:127.")

DispatchFn = Callable[[KernelLease, str, dict[str, Any]], Awaitable[Any]]


class BridgeRefusal(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def bridge_url(server_url: str) -> str:
    """The bridge endpoint under a server's loopback base URL (``http://127.0.0.1:8888/``)."""
    return server_url.rstrip("/") + "/" + BRIDGE_PATH


@tornado.web.stream_request_body
class BridgeHandler(tornado.web.RequestHandler):
    leases: LeaseManager
    dispatch: DispatchFn

    def initialize(self, leases: LeaseManager, dispatch: DispatchFn, *,
                   max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                   max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
                   loopback_only: bool = True) -> None:
        self.leases = leases
        self.dispatch = dispatch
        self.max_body_bytes = max_body_bytes
        self.max_result_bytes = max_result_bytes
        self.loopback_only = loopback_only
        self._chunks: list[bytes] = []
        self._received = 0
        self._oversize = False

    def check_xsrf_cookie(self) -> None:
        """Authenticated by the lease secret, not by cookies."""

    def _refuse(self, status: int, code: str, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"ok": False, "error": {"code": code, "message": message}}))

    def prepare(self) -> None:
        if self.request.method != "POST":
            return
        if self.loopback_only and not str(self.request.remote_ip or "").startswith(_LOOPBACK):
            self._refuse(403, "not_loopback", "the bridge answers loopback callers only")
            return
        length = self.request.headers.get("Content-Length")
        if length is not None:
            try:
                too_big = int(length) > self.max_body_bytes
            except ValueError:
                too_big = True
            if too_big:
                self._refuse(413, "body_too_large",
                             f"request body exceeds {self.max_body_bytes} bytes")

    def data_received(self, chunk: bytes) -> None:
        self._received += len(chunk)
        if self._received > self.max_body_bytes:
            self._oversize = True
            self._chunks.clear()
        elif not self._oversize:
            self._chunks.append(chunk)

    def _authenticate(self) -> KernelLease:
        header = self.request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise BridgeRefusal(401, "unknown_token", "missing bridge token")
        lease = self.leases.by_token(token.strip())
        if lease is None:
            raise BridgeRefusal(401, "unknown_token", "unknown or expired bridge token")
        if lease.active is None:
            raise BridgeRefusal(401, "expired", "no run_code execution is in flight")
        return lease

    def _parse(self) -> tuple[str, dict[str, Any]]:
        try:
            body = json.loads(b"".join(self._chunks) or b"null")
        except ValueError:
            raise BridgeRefusal(400, "bad_request", "body is not JSON") from None
        if not isinstance(body, dict):
            raise BridgeRefusal(400, "bad_request", "body is not a JSON object")
        name = body.get("tool")
        arguments = body.get("arguments", {})
        if not isinstance(name, str) or not name or len(name) > 128:
            raise BridgeRefusal(400, "bad_request", "tool must be a non-empty name")
        if not isinstance(arguments, dict):
            raise BridgeRefusal(400, "bad_request", "arguments must be an object")
        return name, arguments

    @staticmethod
    def _authorize(lease: KernelLease, name: str) -> None:
        if name == TOOL_NAME:
            raise BridgeRefusal(403, "recursive_run_code", "run_code cannot be called back")
        assert lease.active is not None
        capability = lease.active.callable_tools.get(name)
        if capability is None:
            raise BridgeRefusal(404, "unknown_tool", f"{name!r} is not available here")
        if capability != Capability.READ:
            raise BridgeRefusal(403, "write_refused",
                                f"{name!r} is not a read tool; callbacks may only read")

    async def post(self) -> None:
        if self._oversize:
            self._refuse(413, "body_too_large",
                         f"request body exceeds {self.max_body_bytes} bytes")
            return
        try:
            lease = self._authenticate()
            name, arguments = self._parse()
            self._authorize(lease, name)
        except BridgeRefusal as refusal:
            self._refuse(refusal.status, refusal.code, refusal.message)
            return
        try:
            result = await self.dispatch(lease, name, arguments)
        except MemberSafeError as exc:
            self._refuse(422, exc.code, str(exc)[:2000])
            return
        except (AuthorityRejected, RunCancelled):
            # The run's admitted snapshot no longer holds (roster changed, run settled or
            # stopped): an expected refusal of the backend's re-check, not a fault.
            self._refuse(409, "run_authority_changed",
                         "the run this call belongs to is no longer authorized to call tools")
            return
        except Exception:
            log.warning("bridge dispatch of %s raised", name, exc_info=True)
            self._refuse(502, "tool_failed", f"{name!r} failed")
            return
        try:
            payload = json.dumps({"ok": True, "result": result}, default=str)
        except (TypeError, ValueError):
            self._refuse(502, "bad_result", "tool result is not JSON-serialisable")
            return
        if len(payload.encode("utf-8")) > self.max_result_bytes:
            self._refuse(502, "result_too_large", "tool result exceeds the bridge bound")
            return
        self.set_header("Content-Type", "application/json")
        self.finish(payload)


def bridge_handlers(base_url: str, leases: LeaseManager, dispatch: DispatchFn,
                    **options: Any) -> list[tuple[str, type[BridgeHandler], dict[str, Any]]]:
    """Route spec for ``web_app.add_handlers(".*$", ...)`` under the server's base URL."""
    pattern = "/" + base_url.strip("/") + "/" + BRIDGE_PATH if base_url.strip("/") \
        else "/" + BRIDGE_PATH
    return [(pattern, BridgeHandler, {"leases": leases, "dispatch": dispatch, **options})]
