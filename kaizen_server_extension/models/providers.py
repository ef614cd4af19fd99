"""Model providers: named factories of model gateways, registered through pluggy.

A plugin registers a :class:`ModelProvider` from ``kaizen_register_model_providers``; the
built-in ``openai-compatible`` (aiohttp, :class:`~.client.ModelGateway`) and ``local``
(llama-cpp, :class:`~.local.LocalModelGateway`) providers come through the same hook from
``kaizen_plugins.providers``. The operator picks one by name with ``KAIZEN_MODEL_PROVIDER``
(``c.KaizenApp.model_provider``); an unknown name stops start-up naming the setting.

Providers are collected once, at start-up, from the plugin manager. Nothing that runs during a
turn (tools, guardrails, pipeline extensions) is handed this registry, so none of them can add
or swap a provider (R-461).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kaizen_server_extension.models.profiles import FULL, PromptProfile
from kaizen_server_extension.protocol.model import StepEvent, StepSnapshot

PROVIDER_SETTING = "KAIZEN_MODEL_PROVIDER"
OPENAI_COMPATIBLE = "openai-compatible"
LOCAL = "local"
PROVIDER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


class ProvidedGateway(Protocol):
    """What a provider's factory returns: the interface the room lanes stream steps from."""

    def stream_step(self, snapshot: StepSnapshot, *,
                    model: str | None = None) -> AsyncIterator[StepEvent]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """The operator's model settings, handed to the chosen provider's factory."""

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    # The server's environment, for provider-specific variables (KAIZEN_LOCAL_MODEL_*).
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)


class ProviderConfigError(ValueError):
    """The chosen provider cannot work with these settings; the message names the setting and
    is safe to print at start-up."""


@dataclass(frozen=True, slots=True)
class ModelProvider:
    """A named way to build the server's model gateway.

    ``create`` returns the gateway, or None when the provider is not provisioned here (the
    server then answers each turn that no model is configured). It raises
    :class:`ProviderConfigError` (or ``ValueError``) for settings it cannot use.
    ``fixed_model`` is the model id the provider always serves (the embedded local model);
    it replaces ``KAIZEN_MODEL`` when the provider yields a gateway.
    """

    name: str
    create: Callable[[ProviderSettings], ProvidedGateway | None]
    description: str = ""
    fixed_model: str | None = None
    #: How much context its models get: ``FULL`` (every tool direct), or a budget such as
    #: ``COMPACT`` for small local models (models/profiles.py).
    prompt_profile: PromptProfile = FULL


class ProviderRegistrationError(Exception):
    """A provider registration refused at start-up; the message names the plugin."""


class ModelProviderRegistry:
    """Provider name → :class:`ModelProvider`, filled once at start-up."""

    def __init__(self) -> None:
        self._providers: dict[str, ModelProvider] = {}
        self._owner: dict[str, str] = {}

    @classmethod
    def from_registrations(cls, registrations: Iterable[tuple[str, Any]]
                           ) -> ModelProviderRegistry:
        """``registrations`` are (plugin name, item) pairs in plugin order, first-party
        first, so a built-in name is claimed by its owner and a later claim is refused."""
        registry = cls()
        for owner, item in registrations:
            registry.register(item, owner=owner)
        return registry

    def register(self, item: object, *, owner: str) -> None:
        if not isinstance(item, ModelProvider):
            raise ProviderRegistrationError(
                f"plugin {owner!r} registered {item!r} as a model provider; expected a "
                "ModelProvider")
        if not PROVIDER_NAME_RE.fullmatch(item.name):
            raise ProviderRegistrationError(
                f"plugin {owner!r} registered a model provider named {item.name!r}; names "
                f"must match {PROVIDER_NAME_RE.pattern}")
        if not isinstance(item.prompt_profile, PromptProfile):
            raise ProviderRegistrationError(
                f"model provider {item.name!r} (plugin {owner!r}) has no PromptProfile")
        if not callable(item.create):
            raise ProviderRegistrationError(
                f"model provider {item.name!r} (plugin {owner!r}) has no callable factory")
        if item.name in self._providers:
            raise ProviderRegistrationError(
                f"model provider name collision: {item.name!r} from plugin {owner!r} is "
                f"already registered by plugin {self._owner[item.name]!r}")
        self._providers[item.name] = item
        self._owner[item.name] = owner

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._providers))

    def owner(self, name: str) -> str | None:
        return self._owner.get(name)

    def select(self, configured: str, *, base_url: str) -> ModelProvider:
        """The provider the operator named; when none is named, ``openai-compatible`` if an
        endpoint is configured, else ``local`` (the behaviour before providers had names).
        Raises :class:`ProviderConfigError` naming the setting for an unknown name."""
        name = configured.strip() or (OPENAI_COMPATIBLE if base_url else LOCAL)
        provider = self._providers.get(name)
        if provider is None:
            known = ", ".join(self.names()) or "none"
            raise ProviderConfigError(
                f"Invalid setting {PROVIDER_SETTING}: unknown model provider {name!r} "
                f"(registered: {known})")
        return provider


def create_gateway(provider: ModelProvider, settings: ProviderSettings
                   ) -> ProvidedGateway | None:
    """Run the provider's factory; any ``ValueError`` becomes a start-up message naming the
    provider, and a returned object without the gateway interface is refused."""
    try:
        gateway = provider.create(settings)
    except ProviderConfigError:
        raise
    except ValueError as exc:
        raise ProviderConfigError(
            f"Invalid settings for model provider {provider.name!r}: {exc}") from None
    if gateway is not None and not (callable(getattr(gateway, "stream_step", None))
                                    and callable(getattr(gateway, "aclose", None))):
        raise ProviderConfigError(
            f"Model provider {provider.name!r} returned {type(gateway).__name__}, which has no "
            "stream_step/aclose; it cannot serve turns")
    return gateway
