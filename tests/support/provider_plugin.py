"""A third-party model provider as an operator would load it (KAIZEN_PLUGINS): a gateway that
answers every step by echoing the member's last message, registered through the same
``kaizen_register_model_providers`` hook as the built-in providers."""

from __future__ import annotations

from collections.abc import AsyncIterator

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
