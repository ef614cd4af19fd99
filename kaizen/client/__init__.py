"""A typed Python client of the Kaizen REST API (docs/client.md).

``Client(url, token)`` is synchronous, ``AsyncClient(url, token)`` the asyncio twin; both
cover conversations, messages, journal pagination, the events websocket with resume,
approvals, artifact downloads and the notebook routes, and answer the pydantic models of
``kaizen.client.models`` (matching the served OpenAPI document). A refusal is
``KaizenError`` with the API's status, code and member-safe message.
"""

from kaizen.client import models
from kaizen.client._calls import Answer, KaizenError
from kaizen.client.aio import AsyncClient
from kaizen.client.sync import Client

__all__ = ["Answer", "AsyncClient", "Client", "KaizenError", "models"]
