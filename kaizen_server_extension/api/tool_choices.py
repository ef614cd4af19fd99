"""REST for the member's per-conversation source tool choices (``store/tool_choices.py``).

``GET conversations/{id}/tool-choices`` answers ``{"off": [...]}``, the caller's own; ``PUT``
with the same body replaces them. Only ever the calling member's: another participant's
choices in a shared room are theirs, and a conversation the caller does not take part in is
404. A choice takes effect at the caller's next turn there (a run's catalog is frozen).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from tornado import web

from kaizen_server_extension.api.base import KaizenHandler
from kaizen_server_extension.api.openapi_parts import (
    answer,
    error_answers,
    operation,
    path_param,
    ref,
)
from kaizen_server_extension.store.tool_choices import (
    MAX_CHOICES,
    SOURCE_NAME_PATTERN,
    ToolChoices,
)

_NAME = Annotated[str, StringConstraints(pattern=SOURCE_NAME_PATTERN)]


class ToolChoicesBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    off: Annotated[list[_NAME], Field(max_length=MAX_CHOICES)]


class ToolChoicesHandler(KaizenHandler):
    @web.authenticated
    async def get(self, conversation_id: str) -> None:
        off = await ToolChoices(self.kaizen.store).list_for(self.member, conversation_id)
        self.write_json({"off": off})

    @web.authenticated
    async def put(self, conversation_id: str) -> None:
        body = self.parse_body(ToolChoicesBody, limit=64 * 1024)
        off = await ToolChoices(self.kaizen.store).replace(self.member, conversation_id,
                                                           body.off)
        self.write_json({"off": off})


def tool_choice_routes(prefix: str,
                       conversation_id: str) -> list[tuple[str, type[web.RequestHandler]]]:
    return [(rf"{prefix}/conversations/({conversation_id})/tool-choices", ToolChoicesHandler)]


_ERROR_TEXT = {401: "Not authenticated", 404: "No such conversation for you",
               422: "A name that is no source tool, source or source family, or too many"}


def tool_choices_openapi() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) for ``api/openapi.py``."""
    conv_id = [path_param("conversation_id")]
    choices = ref("ToolChoices")
    paths = {"/kaizen/api/conversations/{conversation_id}/tool-choices": {
        "get": operation(
            "The source tools the caller left out of their turns here", "getToolChoices",
            {**answer("The caller's choices here", choices),
             **error_answers(_ERROR_TEXT, 404)}, params=conv_id),
        "put": operation(
            "Replace the source tools the caller leaves out of their turns here: exact "
            "source tools, sources (mcp__<id>, openapi__<id>), families (mcp, openapi) or "
            "every source (sources). Only narrows: it never adds a tool the agent, admin "
            "policy or discovery did not allow", "putToolChoices",
            {**answer("The caller's choices here", choices),
             **error_answers(_ERROR_TEXT, 404, 422)}, params=conv_id,
            body_schema="ToolChoices")}}
    components = {"ToolChoices": {
        "type": "object", "required": ["off"], "additionalProperties": False,
        "properties": {"off": {"type": "array", "maxItems": MAX_CHOICES, "items": {
            "type": "string", "pattern": SOURCE_NAME_PATTERN}}}}}
    return paths, components
