"""The signed egress policy: the deployment's network ceiling for external sources (R-379).

Turning ``KAIZEN_OPENAPI_SOURCES_ENABLED`` on is not authority to reach a host. Every schema
fetch and every operation call of an external OpenAPI source also needs a **signed egress
policy** that the deployment issued (docs/openapi-sources.md, "The signed egress policy"):

* the policy is a small JSON document — the origins sources may be reached on, the protected
  networks they may resolve into, when it was issued and when it expires — signed with an
  Ed25519 key the operator keeps *off* the server (``python -m
  kaizen_server_extension.tools.egress_sign``). The server holds only the public key
  (``KAIZEN_OPENAPI_EGRESS_POLICY_KEY``) and the signed file
  (``KAIZEN_OPENAPI_EGRESS_POLICY_FILE``), so nothing a member or a Kaizen admin can change
  from inside the server widens it;
* :class:`EgressCeiling` verifies it and is asked before each request by the egress door
  (``tools/egress.py``). No key, no file, a file that does not verify (any changed byte), a
  policy of another purpose or version, or an expired one: the request is refused before
  anything is resolved or sent — the ceiling fails closed;
* an origin must be listed in the policy *exactly* (scheme ``https``, host, port), even when a
  member registered it; a resolved address that is protected (loopback, private …) must be in
  a network both the policy and the server's own ``KAIZEN_OPENAPI_EGRESS_NETWORKS`` list: the
  signed policy and the server's settings each only tighten the other.

The file is re-read when it changes (its size, modification time or inode), so a renewed
policy takes effect without a restart; expiry is checked at every request.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from kaizen_server_extension.key_text import decode_key
from kaizen_server_extension.tools.egress import (
    EgressRefused,
    IPAddress,
    IPNetwork,
    Origin,
)

log = logging.getLogger("kaizen.tools.egress_policy")

#: The ``purpose`` a signed egress policy carries: a signature over anything else is refused.
PURPOSE = "kaizen-egress-policy"
VERSION = 1
#: A policy file larger than this is not one the signing tool wrote.
MAX_POLICY_BYTES = 64 * 1024
MAX_ORIGINS = 1000
MAX_NETWORKS = 256
#: The longest a policy may be valid for; the signing tool's default is 30 days.
MAX_LIFETIME_S = 366 * 24 * 3600
#: How far in the future ``issued_at`` may be (clock skew between signer and server).
CLOCK_SKEW_S = 300
_PUBLIC_KEY_BYTES = 32


class PolicyRejected(Exception):
    """A policy that does not verify; ``code`` says why (never which byte)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def parse_public_key(text: str) -> Ed25519PublicKey:
    """The Ed25519 public key of ``KAIZEN_OPENAPI_EGRESS_POLICY_KEY`` (32 bytes, URL-safe
    base64, padding optional); ``ValueError`` otherwise."""
    return Ed25519PublicKey.from_public_bytes(
        decode_key(text, _PUBLIC_KEY_BYTES, "an Ed25519 public key"))


def public_key_text(key: Ed25519PublicKey) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return _b64(key.public_bytes(Encoding.Raw, PublicFormat.Raw))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def policy_origin(url: str) -> Origin:
    """The origin of a policy entry: ``https://host[:port]`` and nothing more (no user
    information, path, query or fragment); ``ValueError`` otherwise."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError(f"{url[:200]!r} is not a URL") from None
    if parts.scheme != "https" or not parts.hostname or "@" in parts.netloc \
            or parts.path not in ("", "/") or parts.query or parts.fragment \
            or "?" in url or "#" in url:
        raise ValueError(f"{url[:200]!r} is not a bare https origin (https://host[:port])")
    return Origin.of(url)


@dataclass(frozen=True, slots=True)
class SignedEgressPolicy:
    """A verified policy (see the module docstring)."""

    origins: frozenset[Origin]
    networks: tuple[IPNetwork, ...]
    issued_at: int
    expires_at: int

    def allows_origin(self, origin: Origin) -> bool:
        return origin in self.origins

    def address_allowed(self, address: IPAddress) -> bool:
        """Inside a network the policy lists, or globally routable (and not multicast)."""
        if any(address in network for network in self.networks):
            return True
        return address.is_global and not address.is_multicast

    def document(self) -> dict[str, Any]:
        return policy_document(sorted(str(o) for o in self.origins),
                               [str(n) for n in self.networks],
                               issued_at=self.issued_at, expires_at=self.expires_at)


def policy_document(origins: Iterable[str], networks: Iterable[str], *, issued_at: int,
                    expires_at: int) -> dict[str, Any]:
    """The JSON document a policy signs (origins normalized, networks validated)."""
    return {"purpose": PURPOSE, "version": VERSION, "issued_at": int(issued_at),
            "expires_at": int(expires_at),
            "origins": sorted({str(policy_origin(o)) for o in origins}),
            "networks": [str(ipaddress.ip_network(n, strict=True)) for n in networks]}


def sign_policy(document: Mapping[str, Any], key: Ed25519PrivateKey) -> str:
    """``<payload>.<signature>``: the canonical JSON of ``document`` and its Ed25519
    signature, both URL-safe base64."""
    payload = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    body = _b64(payload.encode("ascii"))
    return f"{body}.{_b64(key.sign(body.encode('ascii')))}"


def open_policy(token: str, key: Ed25519PublicKey, *, now: float) -> SignedEgressPolicy:
    """The policy ``token`` carries once its signature verifies and it is in force at
    ``now``; :class:`PolicyRejected` ``egress_policy_invalid`` (tampered, malformed, another
    purpose or version), ``egress_policy_not_yet_valid`` (issued in the future, beyond clock
    skew) or ``egress_policy_expired`` otherwise."""
    token = token.strip()
    if len(token) > MAX_POLICY_BYTES or token.count(".") != 1:
        raise PolicyRejected("egress_policy_invalid")
    body, _, signature_text = token.partition(".")
    try:
        signature = _unb64(signature_text)
        # One spelling per token (base64 leaves low bits of the last character free).
        if _b64(signature) != signature_text:
            raise PolicyRejected("egress_policy_invalid")
        key.verify(signature, body.encode("ascii"))
        document = json.loads(_unb64(body))
    except (InvalidSignature, binascii.Error, ValueError, UnicodeEncodeError):
        raise PolicyRejected("egress_policy_invalid") from None
    policy = _parsed(document)
    if policy.issued_at > now + CLOCK_SKEW_S:
        raise PolicyRejected("egress_policy_not_yet_valid")
    if now >= policy.expires_at:
        raise PolicyRejected("egress_policy_expired")
    return policy


def _parsed(document: Any) -> SignedEgressPolicy:
    if not isinstance(document, dict) or document.get("purpose") != PURPOSE \
            or document.get("version") != VERSION:
        raise PolicyRejected("egress_policy_invalid")
    issued, expires = document.get("issued_at"), document.get("expires_at")
    origins, networks = document.get("origins"), document.get("networks", [])
    if not isinstance(issued, int) or not isinstance(expires, int) \
            or isinstance(issued, bool) or isinstance(expires, bool) \
            or not 0 < expires - issued <= MAX_LIFETIME_S \
            or not isinstance(origins, list) or not isinstance(networks, list) \
            or len(origins) > MAX_ORIGINS or len(networks) > MAX_NETWORKS \
            or not all(isinstance(o, str) for o in (*origins, *networks)):
        raise PolicyRejected("egress_policy_invalid")
    try:
        parsed_origins = frozenset(policy_origin(o) for o in origins)
        parsed_networks = tuple(ipaddress.ip_network(n, strict=True) for n in networks)
    except ValueError:
        raise PolicyRejected("egress_policy_invalid") from None
    return SignedEgressPolicy(parsed_origins, parsed_networks, issued, expires)


_REFUSALS = {
    "egress_policy_missing": "External sources cannot be reached: this server has no signed "
                             "egress policy. An administrator must install one.",
    "egress_policy_invalid": "External sources cannot be reached: this server's egress "
                             "policy does not verify. An administrator must install a "
                             "valid one.",
    "egress_policy_expired": "External sources cannot be reached: this server's egress "
                             "policy has expired. An administrator must renew it.",
    "egress_policy_not_yet_valid": "External sources cannot be reached: this server's "
                                   "egress policy is not valid yet (its issue time is "
                                   "ahead of this server's clock).",
}


@dataclass(frozen=True, slots=True)
class _Loaded:
    stamp: tuple[int, int, int]
    policy: SignedEgressPolicy | None
    code: str


class EgressCeiling:
    """The signed policy in force, read from ``path`` and verified with ``key`` (see the
    module docstring). :meth:`check` is the egress door's question before every request."""

    def __init__(self, path: str, key: Ed25519PublicKey | None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._key = key
        self._clock = clock
        self._loaded: _Loaded | None = None
        self._lock = threading.Lock()

    def current(self) -> SignedEgressPolicy:
        """The verified policy in force now; :class:`EgressRefused` when there is none."""
        if not self._path or self._key is None:
            raise EgressRefused(_REFUSALS["egress_policy_missing"],
                                code="egress_policy_missing")
        loaded = self._load()
        if loaded.policy is None:
            raise EgressRefused(_REFUSALS[loaded.code], code=loaded.code)
        if self._clock() >= loaded.policy.expires_at:
            raise EgressRefused(_REFUSALS["egress_policy_expired"],
                                code="egress_policy_expired")
        return loaded.policy

    def check(self, origin: Origin) -> SignedEgressPolicy:
        """The policy in force, when it lists ``origin``; :class:`EgressRefused` otherwise."""
        policy = self.current()
        if not policy.allows_origin(origin):
            raise EgressRefused(f"{origin} is not in this server's signed egress policy, so "
                                "it cannot be reached. An administrator must add it.",
                                code="egress_origin_not_in_policy")
        return policy

    def _load(self) -> _Loaded:
        try:
            stat = os.stat(self._path)
        except OSError:
            return _Loaded((0, 0, 0), None, "egress_policy_missing")
        stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        with self._lock:
            # A policy not valid yet is read again: the clock, not the file, may change.
            if self._loaded is not None and self._loaded.stamp == stamp \
                    and self._loaded.code != "egress_policy_not_yet_valid":
                return self._loaded
            self._loaded = self._read(stamp)
            return self._loaded

    def _read(self, stamp: tuple[int, int, int]) -> _Loaded:
        assert self._key is not None
        try:
            with open(self._path, "rb") as handle:
                raw = handle.read(MAX_POLICY_BYTES + 1)
        except OSError:
            log.warning("KAIZEN_OPENAPI_EGRESS_POLICY_FILE cannot be read: external sources "
                        "are refused")
            return _Loaded(stamp, None, "egress_policy_missing")
        try:
            policy = open_policy(raw.decode("ascii"), self._key, now=self._clock())
        except (PolicyRejected, UnicodeDecodeError) as exc:
            code = exc.code if isinstance(exc, PolicyRejected) else "egress_policy_invalid"
            log.warning("KAIZEN_OPENAPI_EGRESS_POLICY_FILE refused (%s): external sources are "
                        "refused until a valid signed policy is installed", code)
            return _Loaded(stamp, None, code)
        log.info("Signed egress policy loaded: %d origins, %d networks, expires at %d",
                 len(policy.origins), len(policy.networks), policy.expires_at)
        return _Loaded(stamp, policy, "")


__all__ = ["EgressCeiling", "PolicyRejected", "SignedEgressPolicy", "open_policy",
           "parse_public_key", "policy_document", "policy_origin", "public_key_text",
           "sign_policy"]
