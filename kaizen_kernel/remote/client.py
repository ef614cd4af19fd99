"""Talking to a Jupyter gateway (jupyter-kernel-gateway, Enterprise Gateway): settings, the
REST calls of a kernel's lifecycle, and an asyncio websocket client for its channels.

When the Jupyter server runs with ``--gateway-url`` its own kernels live on the gateway, and
run_code kernels follow them there. Two choices, both made for robustness:

* **Lifecycle over REST through jupyter_server's** :func:`gateway_request` (``POST
  /api/kernels``, ``.../interrupt``, ``.../restart``, ``DELETE``): it applies the server's
  ``GatewayClient`` configuration — URL, auth token and its renewer, TLS client certs,
  cookies, retries on connection errors — so an operator configures the gateway once.
* **Our own start body and channel client**, not ``GatewayKernelManager`` /
  ``GatewayKernelClient``. The manager copies the *server's whole environment* filtered by
  ``KERNEL_*`` and ``GatewayClient.allowed_envs`` into the start request (and writes
  ``KERNEL_USERNAME`` into ``os.environ``); run_code kernels must receive only an allowlisted
  environment. The client opens its websocket without the gateway's auth header, reads it on a
  thread per kernel and waits on its queues with a busy ``sleep(0)`` loop. The client here is
  one tornado websocket per kernel, read by an asyncio task into per-channel queues, exposing
  the small ``AsyncKernelClient`` surface :mod:`kaizen_kernel.execute` uses
  (``execute``, ``get_iopub_msg``, ``get_shell_msg``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, WebSocketClosedError, websocket_connect

from kaizen_kernel.files import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_TOTAL_BYTES
from kaizen_kernel.provisioner import MATPLOTLIB_BACKEND, looks_secret

log = logging.getLogger(__name__)

WorkspaceMode = Literal["auto", "shared", "transfer"]
WORKSPACE_MODES: tuple[WorkspaceMode, ...] = ("auto", "shared", "transfer")
# Transfer mode's bounds on what is sent *to* the kernel before a call (workspace files and
# shared resources); the defaults are capture's, so what comes back can also go out again.
# The server sets them from KAIZEN_GATEWAY_TRANSFER_MAX_* (settings.py).
DEFAULT_TRANSFER_MAX_FILES = 2000

# Names of the server's environment that a gateway kernel may receive. No PATH: the kernel
# host has its own. Secret-looking names are dropped even when listed (provisioner guard).
DEFAULT_GATEWAY_ENV_ALLOWLIST: tuple[str, ...] = (
    "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "LC_NUMERIC", "TZ",
)
# Fixed, server-authored values every run_code kernel gets (no paths of the server host).
_FIXED_ENV = {"MPLBACKEND": MATPLOTLIB_BACKEND, "PYTHONNOUSERSITE": "1",
              "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
MAX_WS_MESSAGE_BYTES = 64 * 1024 * 1024
_CHANNELS = ("shell", "iopub", "stdin", "control")


class GatewayUnavailable(RuntimeError):
    """The gateway refused or could not be reached (a tool failure, never the caller's)."""


class TransferRefused(Exception):
    """Transfer mode could not bring the call's files to the kernel's host: nothing ran.

    ``caller``: whose failure it is. Workspace contents over the transfer bounds are the
    caller's (they can remove or shrink files); a shared file that does not arrive with its
    admitted digest is the tool's, as the same refusal is locally.
    """

    def __init__(self, code: str, message: str, *, caller: bool) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.caller = caller


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """Kaizen's side of a gateway deployment; URL and credentials stay in ``GatewayClient``."""

    workspace_mode: WorkspaceMode = "auto"
    env_allowlist: tuple[str, ...] = DEFAULT_GATEWAY_ENV_ALLOWLIST
    alive_check_timeout_s: float = 2.0
    # Transfer mode, per call: the largest single file sent to the kernel, the bytes sent in
    # one sync (new or changed workspace files; separately, the call's shared resources) and
    # the number of workspace files mirrored.
    transfer_max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    transfer_max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES
    transfer_max_files: int = DEFAULT_TRANSFER_MAX_FILES



def gateway_enabled() -> bool:
    """True when this process's jupyter_server is configured with a gateway URL."""
    from jupyter_server.gateway.gateway_client import GatewayClient

    return bool(GatewayClient.instance().gateway_enabled)


def start_env(source: Mapping[str, str], allowlist: Iterable[str]) -> dict[str, str]:
    """The ``env`` of a kernel start request: allowlisted, non-secret names and fixed values.

    Never the server's ``KERNEL_*`` variables, database URL, model keys or tokens.
    """
    env: dict[str, str] = {}
    for name in allowlist:
        value = source.get(name)
        if value is not None and not looks_secret(name):
            env[name] = value
    env.update(_FIXED_ENV)
    return env


class GatewayREST:
    """A kernel's lifecycle on the gateway, through jupyter_server's ``gateway_request``."""

    def _client(self) -> Any:
        from jupyter_server.gateway.gateway_client import GatewayClient

        return GatewayClient.instance()

    @property
    def url(self) -> str:
        return str(self._client().url or "")

    def _endpoint(self, endpoint: str, *parts: str) -> str:
        base = self.url.rstrip("/") + "/" + endpoint.strip("/")
        return "/".join([base, *(quote(p, safe="") for p in parts)])

    def kernel_url(self, kernel_id: str, *parts: str) -> str:
        return self._endpoint(self._client().kernels_endpoint, kernel_id, *parts)

    def channels_request(self, kernel_id: str, session_id: str) -> HTTPRequest:
        """The websocket request for a kernel's channels, with the gateway's credentials."""
        client = self._client()
        ws_base = str(client.ws_url or "").rstrip("/") + "/" + \
            str(client.kernels_endpoint).strip("/")
        url = f"{ws_base}/{quote(kernel_id, safe='')}/channels?session_id={quote(session_id)}"
        args = dict(client.load_connection_args())
        allowed = ("headers", "validate_cert", "ca_certs", "client_cert", "client_key",
                   "connect_timeout", "auth_username", "auth_password")
        return HTTPRequest(url, **{k: v for k, v in args.items() if k in allowed})

    async def _call(self, url: str, method: str, body: Any = None) -> Any:
        from jupyter_server.gateway.gateway_client import gateway_request
        from tornado import web

        kwargs: dict[str, Any] = {"method": method}
        if body is not None:
            kwargs["body"] = json.dumps(body)
            kwargs["headers"] = {"Content-Type": "application/json"}
        try:
            response = await gateway_request(url, **kwargs)
        except web.HTTPError as exc:
            if isinstance(exc.__cause__, OSError):  # refused, reset, unreachable
                raise GatewayUnavailable(
                    "the Jupyter gateway could not be reached "
                    f"({type(exc.__cause__).__name__})") from exc
            raise GatewayUnavailable(
                f"the Jupyter gateway answered {exc.status_code} to {method}") from exc
        except (OSError, TimeoutError) as exc:
            raise GatewayUnavailable(
                f"the Jupyter gateway could not be reached ({type(exc).__name__})") from exc
        raw = response.body or b""
        return json.loads(raw) if raw.strip() else None

    async def kernelspecs(self) -> dict[str, Any]:
        data = await self._call(self._endpoint(self._client().kernelspecs_endpoint), "GET")
        if not isinstance(data, dict):
            raise GatewayUnavailable("the Jupyter gateway sent no kernelspecs")
        return data

    async def start(self, kernel_name: str, env: Mapping[str, str]) -> str:
        model = await self._call(self._endpoint(self._client().kernels_endpoint), "POST",
                                 {"name": kernel_name, "env": dict(env)})
        if not isinstance(model, dict) or not isinstance(model.get("id"), str):
            raise GatewayUnavailable("the Jupyter gateway did not return a kernel")
        return str(model["id"])

    async def model(self, kernel_id: str) -> dict[str, Any] | None:
        """The kernel's model, or None when the gateway no longer knows it."""
        try:
            data = await self._call(self.kernel_url(kernel_id), "GET")
        except GatewayUnavailable as exc:
            cause = exc.__cause__
            if getattr(cause, "status_code", None) == 404:
                return None
            raise
        return data if isinstance(data, dict) else None

    async def interrupt(self, kernel_id: str) -> None:
        await self._call(self.kernel_url(kernel_id, "interrupt"), "POST", {})

    async def restart(self, kernel_id: str) -> None:
        await self._call(self.kernel_url(kernel_id, "restart"), "POST", {})

    async def delete(self, kernel_id: str) -> None:
        try:
            await self._call(self.kernel_url(kernel_id), "DELETE")
        except GatewayUnavailable as exc:
            if getattr(exc.__cause__, "status_code", None) != 404:
                raise


class GatewayChannels:
    """One kernel's channels over the gateway websocket (JSON text protocol).

    Offers what :mod:`kaizen_kernel.execute` needs of a kernel client. A closed socket is
    reported by :attr:`closed`; reads then time out and the kernel's liveness check says dead.
    """

    def __init__(self, kernel_id: str) -> None:
        self.kernel_id = kernel_id
        self.session = Session(key=b"", username="kaizen")
        self._queues: dict[str, asyncio.Queue[dict[str, Any]]] = {
            name: asyncio.Queue() for name in _CHANNELS}
        self._ws: WebSocketClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self.closed = True
        # The gateway restarted the kernel behind our back (its own restarter) or lost it.
        self.kernel_lost = False

    async def connect(self, request: HTTPRequest, seconds: float) -> None:
        try:
            self._ws = await asyncio.wait_for(
                websocket_connect(request, max_message_size=MAX_WS_MESSAGE_BYTES), seconds)
        except Exception as exc:
            raise GatewayUnavailable(
                f"the kernel's channels on the gateway could not be opened "
                f"({type(exc).__name__})") from exc
        self.closed = False
        self._reader = asyncio.create_task(self._read_forever())

    async def _read_forever(self) -> None:
        ws = self._ws
        assert ws is not None
        try:
            while True:
                raw = await ws.read_message()
                if raw is None:
                    break
                if not isinstance(raw, str):
                    continue  # binary frames carry comm buffers: run_code never uses them
                try:
                    msg = json.loads(raw)
                except ValueError:
                    continue
                channel = msg.get("channel")
                if channel not in self._queues:
                    continue
                if (channel == "iopub" and msg.get("msg_type") == "status"
                        and msg.get("content", {}).get("execution_state")
                        in ("restarting", "dead")):
                    self.kernel_lost = True
                self._queues[channel].put_nowait(msg)
        except Exception:
            log.debug("gateway channel reader stopped", exc_info=True)
        finally:
            self.closed = True

    def _send(self, channel: str, msg_type: str, content: dict[str, Any]) -> str:
        if self._ws is None or self.closed:
            raise WebSocketClosedError()
        msg = self.session.msg(msg_type, content)
        msg["channel"] = channel
        self._ws.write_message(json.dumps(msg, default=json_default))
        return str(msg["header"]["msg_id"])

    def execute(self, code: str, silent: bool = False, store_history: bool = True,
                user_expressions: dict[str, str] | None = None,
                allow_stdin: bool = False, stop_on_error: bool = True) -> str:
        return self._send("shell", "execute_request", {
            "code": code, "silent": silent, "store_history": store_history,
            "user_expressions": user_expressions or {}, "allow_stdin": allow_stdin,
            "stop_on_error": stop_on_error})

    def interrupt_request(self) -> str:
        """The kernel protocol's interrupt, on the control channel."""
        self._drain("control")  # earlier replies nobody reads
        return self._send("control", "interrupt_request", {})

    def kernel_info(self) -> str:
        return self._send("shell", "kernel_info_request", {})

    async def _get(self, channel: str, seconds: float | None) -> dict[str, Any]:
        q = self._queues[channel]
        if q.empty() and self.closed:
            # Nothing more will come: wait out the timeout (no busy loop), then say so.
            await asyncio.sleep(min(seconds or 0.0, 0.25))
            raise queue.Empty
        try:
            return await asyncio.wait_for(q.get(), seconds)
        except TimeoutError:
            raise queue.Empty from None

    # ``timeout`` as jupyter_client's AsyncKernelClient names it: execute.py calls these.
    async def get_iopub_msg(self, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        return await self._get("iopub", timeout)

    async def get_shell_msg(self, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        return await self._get("shell", timeout)

    async def wait_for_ready(self, seconds: float) -> None:
        """kernel_info round trip: the kernel answers on shell; stale iopub is dropped."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            msg_id = self.kernel_info()
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError("kernel did not answer kernel_info in time")
                try:
                    reply = await self.get_shell_msg(timeout=min(remaining, 1.0))
                except queue.Empty:
                    if self.closed:
                        raise GatewayUnavailable("the gateway closed the kernel's channels") \
                            from None
                    break  # ask again: the first request may have raced the kernel's start
                if reply.get("parent_header", {}).get("msg_id") == msg_id:
                    self._drain("iopub")
                    return

    def _drain(self, channel: str) -> None:
        q = self._queues[channel]
        while not q.empty():
            q.get_nowait()

    def stop_channels(self) -> None:
        self.closed = True
        if self._ws is not None:
            with contextlib.suppress(Exception):
                self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
        for name in _CHANNELS:
            self._drain(name)
