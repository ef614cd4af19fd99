"""The deployment's credential key, what is derived from it, and the two uses of those keys.

``KAIZEN_CREDENTIAL_KEY`` is 32 random bytes (URL-safe base64) an operator generates once per
deployment and gives every replica (docs/credentials.md, "Key handling"). Two independent keys
are derived from it with HKDF-SHA256, so neither use can be turned against the other:

* the **form key** signs a credential form's plan with HMAC-SHA256 (:func:`sign_plan`,
  :func:`open_plan`): a form URL is its own proof of what it was issued for, for whom and
  until when, and any changed byte fails the signature;
* the **vault key** seals a remembered credential with AES-256-GCM (:class:`Vault`), with the
  row's identity (reference, member, destination, origin) as associated data, so a sealed
  value copied into another row, or read for another member, does not open.

Rotating the key makes every remembered credential unreadable (members enter them again) and
every outstanding form invalid; nothing else depends on it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from kaizen_server_extension.key_text import decode_key

KEY_BYTES = 32
_NONCE_BYTES = 12
_FORM_INFO = b"kaizen credential form signing v1"
_VAULT_INFO = b"kaizen credential vault v1"


class CredentialKeyInvalid(ValueError):
    """The configured key is unusable; the message names the setting and is safe to print."""


def parse_key(text: str) -> bytes:
    """The 32 bytes of ``KAIZEN_CREDENTIAL_KEY`` (URL-safe base64, padding optional)."""
    try:
        return decode_key(text, KEY_BYTES)
    except ValueError as exc:
        raise CredentialKeyInvalid(f"KAIZEN_CREDENTIAL_KEY {exc}") from None


def new_key_text() -> str:
    """A fresh key as an operator would put it in KAIZEN_CREDENTIAL_KEY."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode("ascii").rstrip("=")


def _derive(master: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(master)


@dataclass(frozen=True, slots=True)
class CredentialKeys:
    """The two derived keys; the master key is not kept."""

    form: bytes
    vault: bytes

    @classmethod
    def from_master(cls, master: bytes) -> CredentialKeys:
        return cls(form=_derive(master, _FORM_INFO), vault=_derive(master, _VAULT_INFO))

    def __repr__(self) -> str:
        return "CredentialKeys(<withheld>)"


# --- signed form plans ----------------------------------------------------------------------

class PlanRejected(Exception):
    """A form token that does not verify; ``code`` says why (never which byte)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign_plan(plan: Mapping[str, Any], key: bytes) -> str:
    """``<payload>.<mac>``: the canonical JSON of ``plan`` and its HMAC-SHA256, URL-safe."""
    payload = json.dumps(plan, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    body = _b64(payload.encode("ascii"))
    mac = hmac.new(key, body.encode("ascii"), hashlib.sha256).digest()
    return f"{body}.{_b64(mac)}"


#: A token longer than this is not one we issued (plans are a few hundred bytes).
MAX_TOKEN_CHARS = 4096


def open_plan(token: str, key: bytes) -> dict[str, Any]:
    """The plan a token carries, once its MAC verifies (compared in constant time). Raises
    :class:`PlanRejected` ``form_tampered`` for anything else; expiry is the caller's check,
    against the plan's own ``expires_at``."""
    if len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
        raise PlanRejected("form_tampered")
    body, _, mac_text = token.partition(".")
    try:
        mac = _unb64(mac_text)
        expected = hmac.new(key, body.encode("ascii"), hashlib.sha256).digest()
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise PlanRejected("form_tampered") from None
    # One spelling per token: base64 leaves the last character's low bits free, so a MAC
    # that decodes right from another spelling is a changed token all the same.
    if not hmac.compare_digest(mac, expected) or _b64(mac) != mac_text:
        raise PlanRejected("form_tampered")
    try:
        plan = json.loads(_unb64(body))
    except (binascii.Error, ValueError):
        raise PlanRejected("form_tampered") from None
    if not isinstance(plan, dict):
        raise PlanRejected("form_tampered")
    return plan


# --- the vault ------------------------------------------------------------------------------

class SealBroken(Exception):
    """A sealed value did not open: another row's, another key's, or altered."""


class Vault:
    """AES-256-GCM over a credential's secret fields, bound to the row that holds them."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def __repr__(self) -> str:
        return "Vault(<withheld>)"

    @staticmethod
    def _aad(identity: Mapping[str, str]) -> bytes:
        return json.dumps(dict(identity), sort_keys=True, separators=(",", ":")).encode()

    def seal(self, secret: Mapping[str, str], identity: Mapping[str, str]) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        plain = json.dumps(dict(secret), separators=(",", ":")).encode("utf-8")
        return nonce + self._aead.encrypt(nonce, plain, self._aad(identity))

    def open(self, sealed: bytes, identity: Mapping[str, str]) -> dict[str, str]:
        try:
            plain = self._aead.decrypt(sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:],
                                       self._aad(identity))
        except (InvalidTag, ValueError):
            raise SealBroken() from None
        value = json.loads(plain)
        if not isinstance(value, dict):
            raise SealBroken()
        return {str(k): str(v) for k, v in value.items()}
