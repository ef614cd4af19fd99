"""GatewayConfig: validated at construction, readable from the documented environment."""

from __future__ import annotations

from typing import Any

import pytest

from kaizen_server_extension.models import GatewayConfig


def config(**overrides: Any) -> GatewayConfig:
    settings: dict[str, Any] = {"base_url": "http://127.0.0.1:8000/v1", "model": "m"}
    settings.update(overrides)
    return GatewayConfig(**settings)


def test_endpoint_urls_are_derived_from_base_url_with_or_without_trailing_slash() -> None:
    assert config().chat_completions_url == "http://127.0.0.1:8000/v1/chat/completions"
    assert config(base_url="https://h/v1/").models_url == "https://h/v1/models"


@pytest.mark.parametrize(
    "overrides",
    [
        {"base_url": "not-a-url/v1"},
        {"base_url": "ftp://host/v1"},
        {"base_url": "http:///v1"},
        {"base_url": "http://127.0.0.1:99999/v1"},
        {"model": "  "},
        {"read_timeout": 0},
        {"connect_timeout": -1},
    ],
)
def test_unusable_settings_are_refused_at_construction(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        config(**overrides)


def test_api_key_is_not_shown_in_repr() -> None:
    assert "sk-secret" not in repr(config(api_key="sk-secret"))
