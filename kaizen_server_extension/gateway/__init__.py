"""Model gateway: an OpenAI-compatible Chat Completions client for the trusted backend."""

from kaizen_server_extension.gateway.client import ModelGateway
from kaizen_server_extension.gateway.config import GatewayConfig
from kaizen_server_extension.gateway.payload import build_payload

__all__ = ["GatewayConfig", "ModelGateway", "build_payload"]
