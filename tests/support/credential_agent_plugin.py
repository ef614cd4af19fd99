"""An operator plugin (KAIZEN_PLUGINS) for the credential tests: third-party tools that call the
external API of ``tests/support/credential_api.py`` through the credential broker, a plain
source tool for the argument screen, and an agent granted all of them.

Each credential-backed tool is declared with :func:`credential_backed` for the ``echo``
destination: the model passes a ``credential_ref``; the tool gets a broker handle and sends
its one request through it. ``note_search`` takes no credential and records that it ran in
``$KAIZEN_TEST_NOTE_LOG``, so a test can tell a refused call never ran.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from kaizen_server_extension.credentials.broker import BrokerHandle
from kaizen_server_extension.credentials.service import credential_backed
from kaizen_server_extension.tools import hookimpl, tool
from kaizen_server_extension.tools.hookspecs import Registrar

CREDENTIAL_AGENT = "cred-user"
DESTINATION = "echo"
_NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@tool(name="echo_whoami", capability="read", timeout_s=15, room_class="actor_private_read",
      input_schema=_NO_ARGS, description="Ask the echo API who you are.")
async def echo_whoami(ctx: Any, credential: BrokerHandle) -> dict[str, Any]:
    response = await credential.send("GET", f"{credential.origin}/whoami")
    return {"status": response.status_code, "body": response.json()}


@tool(name="echo_create_order", capability="write", write_category="external_effect",
      timeout_s=15, room_class="actor_private_read", repeat_creates_object=True,
      input_schema={"type": "object", "properties": {"item": {"type": "string"}},
                    "required": ["item"], "additionalProperties": False},
      description="Create an order at the echo API.")
async def echo_create_order(ctx: Any, credential: BrokerHandle, item: str) -> dict[str, Any]:
    response = await credential.send("POST", f"{credential.origin}/orders",
                                     json_body={"item": item})
    return {"status": response.status_code, "body": response.json()}


@tool(name="echo_hang_write", capability="write", write_category="external_effect",
      timeout_s=15, room_class="actor_private_read", repeat_creates_object=True,
      input_schema=_NO_ARGS, description="A write the echo API never answers.")
async def echo_hang_write(ctx: Any, credential: BrokerHandle) -> dict[str, Any]:
    response = await credential.send("POST", f"{credential.origin}/hang", json_body={})
    return {"status": response.status_code}


@tool(name="echo_hang_read", capability="read", timeout_s=15, room_class="actor_private_read",
      input_schema=_NO_ARGS, description="A read the echo API never answers.")
async def echo_hang_read(ctx: Any, credential: BrokerHandle) -> dict[str, Any]:
    response = await credential.send("GET", f"{credential.origin}/hang")
    return {"status": response.status_code}


@tool(name="echo_elsewhere", capability="read", timeout_s=15, room_class="actor_private_read",
      input_schema={"type": "object", "properties": {"url": {"type": "string"}},
                    "required": ["url"], "additionalProperties": False},
      description="Tries to send the echo credential to another origin.")
async def echo_elsewhere(ctx: Any, credential: BrokerHandle, url: str) -> dict[str, Any]:
    response = await credential.send("GET", url)
    return {"status": response.status_code}


@tool(name="note_search", capability="read", timeout_s=15, room_class="actor_private_read",
      input_schema={"type": "object", "properties": {
          "query": {"type": "string"}, "url": {"type": "string"},
          "options": {"type": "object"}}, "required": ["query"]},
      description="Search notes (takes no credential).")
async def note_search(ctx: Any, query: str, url: str = "",
                      options: dict[str, Any] | None = None) -> dict[str, Any]:
    log = os.environ.get("KAIZEN_TEST_NOTE_LOG")
    if log:
        await asyncio.to_thread(_append, log, json.dumps({"query": query}))
    return {"ran": True, "query": query}


def _append(path: str, line: str) -> None:
    with open(path, "a") as out:
        out.write(line + "\n")


CREDENTIAL_TOOLS = ("echo_whoami", "echo_create_order", "echo_hang_write", "echo_hang_read",
                    "echo_elsewhere")


@hookimpl
def kaizen_register_tools(register: Registrar) -> None:
    for registered in (echo_whoami, echo_create_order, echo_hang_write, echo_hang_read,
                       echo_elsewhere):
        register(credential_backed(registered, DESTINATION))
    register(note_search)


@hookimpl
def kaizen_register_agents(register: Registrar) -> None:
    register({"agent_id": CREDENTIAL_AGENT, "name": "Credential user", "mode": "chat",
              "persona": "You call the echo API with the credential_ref you are given.",
              "tool_ceiling": [*CREDENTIAL_TOOLS, "note_search"]})
