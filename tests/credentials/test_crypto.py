"""Signed form plans, the sealing of remembered values, and the deployment key's handling."""

from __future__ import annotations

import base64

import pytest

from kaizen_server_extension.credentials.crypto import (
    CredentialKeyInvalid,
    CredentialKeys,
    PlanRejected,
    SealBroken,
    Vault,
    new_key_text,
    open_plan,
    parse_key,
    sign_plan,
)
from kaizen_server_extension.settings import KaizenSettings, SettingsError

KEYS = CredentialKeys.from_master(parse_key(new_key_text()))
PLAN = {"v": 1, "member": "alice", "destination": "echo", "nonce": "n" * 24, "exp": 10}
IDENTITY = {"ref": "cref_x", "member": "alice", "destination": "echo",
            "origin": "https://api.example.com", "scheme": "bearer"}


@pytest.mark.rule("R-387")
def test_a_signed_plan_opens_with_its_key_only() -> None:
    token = sign_plan(PLAN, KEYS.form)
    assert open_plan(token, KEYS.form) == PLAN
    other = CredentialKeys.from_master(parse_key(new_key_text()))
    with pytest.raises(PlanRejected, match="form_tampered"):
        open_plan(token, other.form)
    # The vault key is another key: a plan signed with it does not open.
    with pytest.raises(PlanRejected):
        open_plan(sign_plan(PLAN, KEYS.vault), KEYS.form)


@pytest.mark.rule("R-387")
@pytest.mark.parametrize("mangle", [
    lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),
    lambda t: ("A" if t[0] != "A" else "B") + t[1:],
    lambda t: t.replace(".", ""),
    lambda t: t + ".x",
    lambda t: "x" * 5000,
    lambda t: "",
])
def test_any_changed_byte_is_tampering(mangle) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PlanRejected, match="form_tampered"):
        open_plan(mangle(sign_plan(PLAN, KEYS.form)), KEYS.form)


@pytest.mark.rule("R-394")
def test_a_sealed_value_opens_only_for_its_own_row_and_key() -> None:
    vault = Vault(KEYS.vault)
    sealed = vault.seal({"value": "hunter2-secret"}, IDENTITY)
    assert b"hunter2" not in sealed
    assert vault.open(sealed, IDENTITY) == {"value": "hunter2-secret"}
    for field in IDENTITY:
        moved = {**IDENTITY, field: IDENTITY[field] + "-other"}
        with pytest.raises(SealBroken):
            vault.open(sealed, moved)
    with pytest.raises(SealBroken):
        Vault(CredentialKeys.from_master(parse_key(new_key_text())).vault).open(sealed,
                                                                                IDENTITY)
    flipped = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(SealBroken):
        vault.open(flipped, IDENTITY)
    assert "hunter2" not in repr(vault) and "withheld" in repr(KEYS)


@pytest.mark.parametrize("text", ["", "not base64 !!", base64.urlsafe_b64encode(b"short").decode()])
def test_an_unusable_key_is_refused_naming_the_setting(text: str) -> None:
    with pytest.raises(CredentialKeyInvalid, match="KAIZEN_CREDENTIAL_KEY"):
        parse_key(text)


def test_credentials_enabled_without_a_key_stop_start_up() -> None:
    with pytest.raises(SettingsError, match="KAIZEN_CREDENTIAL_KEY is not set"):
        KaizenSettings.from_environ({"KAIZEN_CREDENTIALS_ENABLED": "1"})
    settings = KaizenSettings.from_environ({"KAIZEN_CREDENTIALS_ENABLED": "1",
                                            "KAIZEN_CREDENTIAL_KEY": new_key_text()})
    # The key never shows in the settings' text.
    assert settings.KAIZEN_CREDENTIAL_KEY.get_secret_value() not in repr(settings)


def test_query_string_destinations_are_refused_in_the_settings() -> None:
    with pytest.raises(SettingsError, match="KAIZEN_CREDENTIAL_DESTINATIONS"):
        KaizenSettings.from_environ({"KAIZEN_CREDENTIAL_DESTINATIONS": (
            '[{"id": "q", "origin": "https://a.example", '
            '"scheme": {"kind": "query", "name": "key"}}]')})


@pytest.mark.rule("R-387")
def test_a_second_spelling_of_the_same_mac_is_tampering() -> None:
    # The last base64 character of a 32-byte MAC carries two free bits: flipping one spells
    # the same bytes differently. A token has one spelling; any other is refused.
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    token = sign_plan(PLAN, KEYS.form)
    twin = token[:-1] + alphabet[alphabet.index(token[-1]) ^ 1]
    assert twin != token
    with pytest.raises(PlanRejected, match="form_tampered"):
        open_plan(twin, KEYS.form)
    assert open_plan(token, KEYS.form) == open_plan(sign_plan(PLAN, KEYS.form), KEYS.form)
