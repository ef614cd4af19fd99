"""Fixtures for gateway tests: a fake OpenAI server over real loopback HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Protocol

import pytest

from kaizen_server_extension.models import GatewayConfig, ModelGateway
from kaizen_server_extension.testing.fake_openai import FakeOpenAI


class FakeFactory(Protocol):
    def __call__(
        self,
        scenario: Any = None,
        *,
        api_key: str | None = None,
        models: Sequence[str] | None = None,
    ) -> FakeOpenAI: ...


@pytest.fixture
def fake_openai_factory() -> Iterator[FakeFactory]:
    """Start as many fake servers as a test needs; all are closed afterwards."""
    started: list[FakeOpenAI] = []

    def start(
        scenario: Any = None,
        *,
        api_key: str | None = None,
        models: Sequence[str] | None = None,
    ) -> FakeOpenAI:
        fake = FakeOpenAI(scenario, api_key=api_key, models=models)
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.close()


GatewayFactory = Callable[..., ModelGateway]


@pytest.fixture
async def gateway_for() -> AsyncIterator[GatewayFactory]:
    """``gateway_for(fake_or_base_url, **config_overrides)``; gateways closed afterwards."""
    opened: list[ModelGateway] = []

    def make(target: FakeOpenAI | str, **overrides: Any) -> ModelGateway:
        base_url = target.base_url if isinstance(target, FakeOpenAI) else target
        settings: dict[str, Any] = {
            "base_url": base_url,
            "model": "fake-model",
            "api_key": None,
            "connect_timeout": 2.0,
            "read_timeout": 5.0,
        }
        settings.update(overrides)
        gateway = ModelGateway(GatewayConfig(**settings))
        opened.append(gateway)
        return gateway

    yield make
    for gateway in opened:
        await gateway.aclose()
