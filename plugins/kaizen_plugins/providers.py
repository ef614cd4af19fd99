"""The built-in model providers, registered through the same ``kaizen_register_model_providers``
hook a third-party package uses.

``openai-compatible``: any Chat Completions endpoint over httpx (``KAIZEN_MODEL_BASE_URL``,
``KAIZEN_MODEL``, the key from ``c.KaizenApp.model_api_key_env``).
``local``: the embedded GGUF model in the server process (``kaizen-local-model setup`` or
``KAIZEN_LOCAL_MODEL_PATH``); no gateway when no model file is provisioned.
"""

from __future__ import annotations

from kaizen_server_extension.models.client import ModelGateway
from kaizen_server_extension.models.config import GatewayConfig
from kaizen_server_extension.models.local import (
    LOCAL_MODEL_NAME,
    LocalModelGateway,
    local_gateway_from_env,
)
from kaizen_server_extension.models.profiles import COMPACT
from kaizen_server_extension.models.providers import (
    LOCAL,
    OPENAI_COMPATIBLE,
    ModelProvider,
    ProviderConfigError,
    ProviderSettings,
)
from kaizen_server_extension.tools import hookimpl
from kaizen_server_extension.tools.hookspecs import Registrar


def openai_compatible_gateway(settings: ProviderSettings) -> ModelGateway | None:
    if not settings.base_url:
        # Named explicitly without an endpoint: say which setting is missing, at start-up.
        raise ProviderConfigError(
            f"Invalid setting KAIZEN_MODEL_BASE_URL: the {OPENAI_COMPATIBLE!r} model provider "
            "needs an endpoint")
    try:
        return ModelGateway(GatewayConfig(base_url=settings.base_url,
                                          model=settings.model or "default",
                                          api_key=settings.api_key))
    except ValueError as exc:
        raise ProviderConfigError(f"Invalid setting KAIZEN_MODEL_BASE_URL: {exc}") from None


def local_gateway(settings: ProviderSettings) -> LocalModelGateway | None:
    try:
        return local_gateway_from_env(settings.environ)
    except ValueError as exc:
        raise ProviderConfigError(f"Invalid local model setting: {exc}") from None


OPENAI_COMPATIBLE_PROVIDER = ModelProvider(
    name=OPENAI_COMPATIBLE, create=openai_compatible_gateway,
    description="An OpenAI-compatible Chat Completions endpoint (KAIZEN_MODEL_BASE_URL).")
LOCAL_PROVIDER = ModelProvider(
    name=LOCAL, create=local_gateway,
    description="The embedded local GGUF model, run in the server process (llama-cpp).",
    fixed_model=LOCAL_MODEL_NAME,
    # A 0.5B model on a laptop CPU: a small prompt is what makes a turn usable.
    prompt_profile=COMPACT)


@hookimpl
def kaizen_register_model_providers(register: Registrar) -> None:
    register(OPENAI_COMPATIBLE_PROVIDER)
    register(LOCAL_PROVIDER)
