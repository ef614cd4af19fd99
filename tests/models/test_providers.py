"""Model providers are plugins: registered through ``kaizen_register_model_providers``, chosen
by ``KAIZEN_MODEL_PROVIDER``, and refused at start-up when unknown or colliding."""

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from kaizen_server_extension.models.client import ModelGateway
from kaizen_server_extension.models.providers import (
    LOCAL,
    OPENAI_COMPATIBLE,
    ModelProvider,
    ModelProviderRegistry,
    ProviderConfigError,
    ProviderRegistrationError,
    ProviderSettings,
    create_gateway,
)
from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.tools import hookimpl
from kaizen_server_extension.tools.registry import build_plugin_manager, collect_registrations
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.provider_plugin import ECHO_PROVIDER
from tests.support.server import ServerProcess, start_server

REPO = Path(__file__).resolve().parents[2]
PLUGIN_PATH = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                           os.environ.get("PYTHONPATH")]))}


def _providers(*extra: tuple[str, object]) -> ModelProviderRegistry:
    pm, _ = build_plugin_manager(load_entrypoints=False, extra_plugins=extra)
    return ModelProviderRegistry.from_registrations(
        collect_registrations(pm, "kaizen_register_model_providers"))


def _plugin(*items: object) -> types.SimpleNamespace:
    @hookimpl
    def kaizen_register_model_providers(register):  # type: ignore[no-untyped-def]
        for item in items:
            register(item)

    return types.SimpleNamespace(kaizen_register_model_providers=kaizen_register_model_providers)


def test_the_built_in_providers_come_through_the_plugin_hook() -> None:
    providers = _providers()
    assert set(providers.names()) == {OPENAI_COMPATIBLE, LOCAL}
    assert providers.owner(OPENAI_COMPATIBLE) == "kaizen_plugins.providers"
    assert providers.owner(LOCAL) == "kaizen_plugins.providers"


async def test_the_openai_compatible_provider_builds_the_http_gateway() -> None:
    provider = _providers().select("", base_url="http://127.0.0.1:9/v1")
    assert provider.name == OPENAI_COMPATIBLE
    gateway = create_gateway(provider, ProviderSettings(
        base_url="http://127.0.0.1:9/v1", model="m", api_key="k"))
    assert isinstance(gateway, ModelGateway) and gateway.config.model == "m"
    await gateway.aclose()


def test_without_an_endpoint_the_local_provider_is_chosen_and_unprovisioned_means_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path))  # no model file provisioned here
    provider = _providers().select("", base_url="")
    assert provider.name == LOCAL and provider.fixed_model == "local"
    assert create_gateway(provider, ProviderSettings("", "", environ={})) is None


def test_the_local_provider_refuses_a_model_path_that_is_not_a_file(tmp_path: Path) -> None:
    provider = _providers().select(LOCAL, base_url="http://127.0.0.1:9/v1")
    environ = {"KAIZEN_LOCAL_MODEL_PATH": str(tmp_path / "missing.gguf")}
    with pytest.raises(ProviderConfigError, match="KAIZEN_LOCAL_MODEL_PATH"):
        create_gateway(provider, ProviderSettings("", "", environ=environ))


def test_an_unknown_provider_name_is_refused_naming_the_setting() -> None:
    with pytest.raises(ProviderConfigError) as refused:
        _providers().select("no-such-provider", base_url="")
    message = str(refused.value)
    assert "KAIZEN_MODEL_PROVIDER" in message and "no-such-provider" in message
    assert OPENAI_COMPATIBLE in message  # the registered names help the operator


def test_the_openai_compatible_provider_named_without_an_endpoint_is_refused() -> None:
    provider = _providers().select(OPENAI_COMPATIBLE, base_url="")
    with pytest.raises(ProviderConfigError, match="KAIZEN_MODEL_BASE_URL"):
        create_gateway(provider, ProviderSettings("", "m"))


def test_a_third_party_provider_may_not_take_a_built_in_name() -> None:
    impostor = ModelProvider(name=LOCAL, create=lambda settings: None)
    with pytest.raises(ProviderRegistrationError) as refused:
        _providers(("impostor_plugin", _plugin(impostor)))
    assert "impostor_plugin" in str(refused.value)
    assert "kaizen_plugins.providers" in str(refused.value)


@pytest.mark.parametrize("item", [
    object(),
    ModelProvider(name="Bad Name!", create=lambda settings: None),
    ModelProvider(name="no-factory", create=None),  # type: ignore[arg-type]
])
def test_a_malformed_provider_registration_is_refused(item: object) -> None:
    with pytest.raises(ProviderRegistrationError, match="bad_plugin"):
        _providers(("bad_plugin", _plugin(item)))


def test_a_factory_returning_something_that_is_not_a_gateway_is_refused() -> None:
    provider = ModelProvider(name="not-a-gateway", create=lambda settings: object())
    with pytest.raises(ProviderConfigError, match="not-a-gateway"):
        create_gateway(provider, ProviderSettings("", ""))


def test_a_factory_value_error_names_the_provider() -> None:
    def refuse(settings: ProviderSettings) -> None:
        raise ValueError("needs an access key")

    with pytest.raises(ProviderConfigError, match=r"'picky'.*needs an access key"):
        create_gateway(ModelProvider(name="picky", create=refuse), ProviderSettings("", ""))


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("echo-provider-server")
    server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
        "KAIZEN_PLUGINS": "tests.support.provider_plugin",
        "KAIZEN_MODEL_PROVIDER": ECHO_PROVIDER, "KAIZEN_MODEL": "echo-1", **PLUGIN_PATH,
    })
    try:
        yield server
    finally:
        server.stop()


def test_a_plugin_provider_serves_the_turn(echo_server: ServerProcess) -> None:
    with echo_server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "ping the provider")
        run = _settled(alice, accepted["run_id"])
        assert run["status"] == "completed", run
        committed = [e for e in _events(alice, room, accepted["run_id"])
                     if e["type"] == "answer.committed"]
        assert len(committed) == 1
        assert "echo provider (echo-1) heard: ping the provider" in str(committed[0]["data"])
    assert f"Kaizen model provider: {ECHO_PROVIDER}" in echo_server.log()


def test_an_unknown_provider_stops_start_up(tmp_path: Path) -> None:
    server = start_server(tmp_path, sqlite_url_for(tmp_path / "k.db"), wait=False,
                          extra_env={"KAIZEN_MODEL_PROVIDER": "no-such-provider"})
    try:
        code = server.process.wait(60)
    finally:
        server.stop()
    log = server.log()
    assert code != 0
    assert "Invalid setting KAIZEN_MODEL_PROVIDER" in log and "no-such-provider" in log
