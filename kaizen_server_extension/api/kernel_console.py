"""REST for the member's persistent run_code kernel in a conversation, and opening it as a
JupyterLab console (``kaizen_kernel/console.py``).

A kernel lease is bound to actor + conversation (R-439): these routes only ever look at the
*calling* member's lease. A conversation the member cannot see is 404; so is one where they
have no live persistent kernel — another member's kernel in the same shared room is not theirs
and is never mentioned.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from tornado import web

from kaizen_server_extension.api.base import KaizenHandler
from kaizen_server_extension.api.openapi_parts import answer, error_answers, path_param, ref
from kaizen_server_extension.protocol.errors import Conflict, Forbidden, NotFound

# Where app.py puts the KernelConsoles once run_code's kernels have started.
SETTINGS_KEY = "kaizen_kernel_consoles"


class OpenConsole(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    language: Literal["python", "node"] = "python"


CONSOLE_OFF = "Opening run_code kernels as consoles is turned off on this server."


class _KernelHandler(KaizenHandler):
    @property
    def consoles(self) -> Any:
        return self.settings.get(SETTINGS_KEY)

    async def _visible(self, conversation_id: str) -> None:
        # NotFound (conversation_not_found) for a conversation the member may not see.
        await self.kaizen.store.conversations.get_for(conversation_id, self.member)


class ConversationKernelHandler(_KernelHandler):
    @web.authenticated
    async def get(self, conversation_id: str) -> None:
        """The caller's live persistent kernels here, and whether a console may attach."""
        await self._visible(conversation_id)
        consoles = self.consoles
        if consoles is None:
            self.write_json({"console_enabled": False, "kernels": []})
            return
        views = await consoles.status(self.member, conversation_id)
        self.write_json({"console_enabled": bool(consoles.enabled and consoles.hostable),
                         "kernels": [v.public() for v in views]})


class KernelConsoleHandler(_KernelHandler):
    @web.authenticated
    async def post(self, conversation_id: str) -> None:
        """Make the caller's persistent kernel reachable by JupyterLab; answer its id."""
        from kaizen_kernel.console import ConsoleDisabled, ConsoleUnavailable, NoPersistentKernel

        body = (self.parse_body(OpenConsole) if (self.request.body or b"").strip()
                else OpenConsole())
        await self._visible(conversation_id)
        # Turned off is known from the settings, also before the kernels have started (the
        # server answers requests while run_code starts in the background).
        if not self.kaizen.settings.KAIZEN_KERNEL_CONSOLE:
            raise Forbidden(CONSOLE_OFF, code="console_disabled")
        consoles = self.consoles
        if consoles is None:
            raise Conflict("Code execution is not available on this server.",
                           code="run_code_unavailable")
        # The console itself goes through the Jupyter kernels API: ask its authorizer now
        # rather than hand out a kernel the member could not open.
        if not self.authorizer.is_authorized(self, self.current_user, "execute", "kernels"):
            raise Forbidden("You are not allowed to use Jupyter kernels on this server.",
                            code="kernels_not_permitted")
        try:
            console = await consoles.open(self.member, conversation_id, body.language)
        except ConsoleDisabled:
            raise Forbidden(CONSOLE_OFF, code="console_disabled") from None
        except ConsoleUnavailable:
            raise Conflict("This Jupyter server cannot open run_code kernels as consoles "
                           "(its kernels run elsewhere).", code="console_unavailable") from None
        except NoPersistentKernel:
            raise NotFound("You have no persistent run_code kernel in this conversation. It "
                           "exists after a run_code call with persistent=true and until the "
                           "sandbox lease is released or idles out.",
                           code="kernel_not_found") from None
        self.write_json(console.public())


def kernel_console_routes(prefix: str, conversation_id: str) -> list[
        tuple[str, type[web.RequestHandler]]]:
    base = rf"{prefix}/conversations/({conversation_id})/kernel"
    return [(base, ConversationKernelHandler), (rf"{base}/console", KernelConsoleHandler)]


#: What each error status means on these routes, in the OpenAPI document.
_ERROR_TEXT = {400: "Malformed request", 401: "Not authenticated",
               403: "Turned off on this server, or Jupyter kernels are not permitted to the "
                    "caller",
               404: "Not found or not yours", 409: "Not available on this server",
               422: "Schema violation"}


def _errors(*codes: int) -> dict[str, Any]:
    return error_answers(_ERROR_TEXT, *codes)


def kernel_console_openapi() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) for ``api/openapi.py``."""
    conv_id = path_param("conversation_id")

    paths = {
        "/kaizen/api/conversations/{conversation_id}/kernel": {"get": {
            "summary": "The caller's own live persistent run_code kernels in this "
                       "conversation, and whether they can be opened as a console",
            "operationId": "getConversationKernel", "parameters": [conv_id],
            "responses": {**answer("Kernel status", ref("ConversationKernel")), **_errors(404)}}},
        "/kaizen/api/conversations/{conversation_id}/kernel/console": {"post": {
            "summary": "Make the caller's persistent run_code kernel reachable through the "
                       "Jupyter kernels API (idempotent) and answer its kernel id, for "
                       "JupyterLab's console. Withdrawn when the lease lets the kernel go",
            "operationId": "openKernelConsole", "parameters": [conv_id],
            "requestBody": {"required": False, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/OpenConsole"}}}},
            "responses": {**answer("Attached", ref("ConsoleKernel")),
                          **_errors(400, 403, 404, 409, 422)}}},
    }
    schema = OpenConsole.model_json_schema(ref_template="#/components/schemas/{model}")
    components = {
        "OpenConsole": schema,
        "ConsoleKernel": {"type": "object", "required": ["kernel_id", "kernel_name", "language"],
                          "properties": {"kernel_id": {"type": "string"},
                                         "kernel_name": {"type": "string"},
                                         "language": {"type": "string"}}},
        "ConversationKernel": {
            "type": "object", "required": ["console_enabled", "kernels"],
            "properties": {
                "console_enabled": {"type": "boolean"},
                "kernels": {"type": "array", "items": {
                    "type": "object",
                    "required": ["language", "kernel_name", "busy", "console_kernel_id"],
                    "properties": {"language": {"type": "string"},
                                   "kernel_name": {"type": "string"},
                                   "busy": {"type": "boolean"},
                                   "console_kernel_id": {"type": ["string", "null"]}}}}}},
    }
    return paths, components
