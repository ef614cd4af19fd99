"""Model gateway: an OpenAI-compatible Chat Completions client for the trusted backend."""

from kaizen_server_extension.models.client import ModelGateway
from kaizen_server_extension.models.config import GatewayConfig
from kaizen_server_extension.models.payload import build_payload

__all__ = ["GatewayConfig", "ModelGateway", "build_payload"]
