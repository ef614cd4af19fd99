"""Third-party model providers as an operator would load them (KAIZEN_PLUGINS), registered
through the same ``kaizen_register_model_providers`` hook as the built-in providers: a gateway
that answers every step by echoing the member's last message, and an OpenAI-compatible one
under the compact prompt profile."""

from __future__ import annotations

from collections.abc import AsyncIterator

from kaizen_server_extension.models.client import ModelGateway
from kaizen_server_extension.models.config import GatewayConfig
from kaizen_server_extension.models.profiles import COMPACT
from kaizen_server_extension.models.providers import ModelProvider, ProviderSettings
from kaizen_server_extension.protocol.model import (
    StepEvent,
    StepFinished,
    StepSnapshot,
    TextDelta,
    Usage,
)
from kaizen_server_extension.tools import hookimpl
from kaizen_server_extension.tools.hookspecs import Registrar

ECHO_PROVIDER = "echo-test"
#: An OpenAI-compatible endpoint (the fake model server in tests) under the compact prompt
#: profile the embedded local model uses, so the profile's admission is testable over HTTP.
COMPACT_PROVIDER = "compact-openai-test"


class EchoGateway:
    def __init__(self, settings: ProviderSettings) -> None:
        self._model = settings.model or "echo-model"

    async def stream_step(self, snapshot: StepSnapshot, *,
                          model: str | None = None) -> AsyncIterator[StepEvent]:
        heard = next((m.content for m in reversed(snapshot.messages) if m.role == "user"), "")
        yield TextDelta(f"echo provider ({model or self._model}) heard: {heard}")
        yield StepFinished(usage=Usage(prompt_tokens=3, completion_tokens=5),
                           finish_reason="stop", model=model or self._model)

    async def aclose(self) -> None:
        return None


@hookimpl
def kaizen_register_model_providers(register: Registrar) -> None:
    register(ModelProvider(name=ECHO_PROVIDER, create=EchoGateway,
                           description="Echoes the member's message (tests)."))
    register(ModelProvider(
        name=COMPACT_PROVIDER, prompt_profile=COMPACT,
        create=lambda settings: ModelGateway(GatewayConfig(
            base_url=settings.base_url, model=settings.model or "fake")),
        description="An OpenAI-compatible endpoint with the compact prompt profile (tests)."))
