"""An operator plugin (KAIZEN_PLUGINS) for the static mutual-TLS destination tests: a
third-party tool that asks a local HTTPS service which client certificate its connection
presented, through the credential broker, for the administrator's ``peer`` destination
(kind ``mtls``), and an agent granted it."""

from __future__ import annotations

from typing import Any

from kaizen_server_extension.credentials.broker import BrokerHandle
from kaizen_server_extension.credentials.service import credential_backed
from kaizen_server_extension.tools import hookimpl, tool
from kaizen_server_extension.tools.hookspecs import Registrar

MTLS_AGENT = "mtls-user"
DESTINATION = "peer"
PEER_TOOL = "peer_whoami"


@tool(name=PEER_TOOL, capability="read", timeout_s=15, room_class="actor_private_read",
      input_schema={"type": "object", "properties": {}, "additionalProperties": False},
      description="Ask the peer service which client certificate you presented.")
async def peer_whoami(ctx: Any, credential: BrokerHandle) -> dict[str, Any]:
    response = await credential.send("GET", f"{credential.origin}/api/peer")
    return {"status": response.status_code, "body": response.json()}


@hookimpl
def kaizen_register_tools(register: Registrar) -> None:
    register(credential_backed(peer_whoami, DESTINATION))


@hookimpl
def kaizen_register_agents(register: Registrar) -> None:
    register({"agent_id": MTLS_AGENT, "name": "mTLS user", "mode": "chat",
              "persona": "You call the peer service with the credential_ref you are given.",
              "tool_ceiling": [PEER_TOOL]})
