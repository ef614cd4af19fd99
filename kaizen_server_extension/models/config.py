"""Where the model provider lives and how long we wait for it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

DEFAULT_BASE_URL = "https://api.openai.com/v1"


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """An OpenAI-compatible Chat Completions endpoint.

    ``base_url`` is the API root that ``/chat/completions`` is appended to (it usually ends
    in ``/v1``). ``extra_params`` are sent verbatim with every request (temperature,
    reasoning effort, ...) but can never override the keys the gateway itself sets.
    """

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    connect_timeout: float = 10.0
    read_timeout: float = 120.0
    extra_params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Fail at start-up, naming the setting, rather than as a per-step provider error.
        try:
            url = httpx.URL(self.base_url)
            port = url.port
        except (httpx.InvalidURL, ValueError):
            raise ValueError("model base_url is not a valid URL") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("model base_url must be an http(s) URL with a host")
        if port is not None and not 0 < port < 65536:
            raise ValueError("model base_url has an invalid port")
        if not self.model.strip():
            raise ValueError("model must name the model to use")
        if self.connect_timeout <= 0 or self.read_timeout <= 0:
            raise ValueError("model connect/read timeouts must be positive")

    @property
    def chat_completions_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    @property
    def models_url(self) -> str:
        return self.base_url.rstrip("/") + "/models"
