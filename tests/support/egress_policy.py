"""A throwaway deployment signing key and the signed egress policies tests install (R-379).

Every test that reaches the local HTTPS services through the egress door needs one: the door
refuses everything without a signed policy that lists the origin."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kaizen_server_extension.tools.egress_policy import (
    EgressCeiling,
    policy_document,
    public_key_text,
    sign_policy,
)


class PolicySigner:
    """``signer.write(path, [origin])`` then ``signer.env(path)`` or ``signer.ceiling(path)``."""

    def __init__(self) -> None:
        self.key = Ed25519PrivateKey.generate()

    @property
    def public_key_text(self) -> str:
        return public_key_text(self.key.public_key())

    def token(self, origins: Iterable[str], networks: Iterable[str] = ("127.0.0.1/32",), *,
              issued_at: int | None = None, lifetime_s: int = 3600) -> str:
        issued = int(time.time()) if issued_at is None else issued_at
        return sign_policy(policy_document(origins, networks, issued_at=issued,
                                           expires_at=issued + lifetime_s), self.key)

    def write(self, path: Path, origins: Iterable[str],
              networks: Iterable[str] = ("127.0.0.1/32",), **kwargs: int) -> Path:
        path.write_text(self.token(origins, networks, **kwargs) + "\n", encoding="ascii")
        return path

    def env(self, path: Path) -> dict[str, str]:
        return {"KAIZEN_OPENAPI_EGRESS_POLICY_FILE": str(path),
                "KAIZEN_OPENAPI_EGRESS_POLICY_KEY": self.public_key_text}

    def ceiling(self, path: Path, clock: Callable[[], float] = time.time) -> EgressCeiling:
        return EgressCeiling(str(path), self.key.public_key(), clock=clock)


def allowing(directory: Path, origins: Iterable[str],
             networks: Iterable[str] = ("127.0.0.1/32",)) -> tuple[PolicySigner, Path]:
    """A signer and the policy file it wrote in ``directory`` for ``origins``."""
    signer = PolicySigner()
    return signer, signer.write(directory / "egress-policy.signed", origins, networks)


def signed_ceiling(directory: Path, origins: Iterable[str],
                   networks: Iterable[str] = ("127.0.0.1/32",)) -> EgressCeiling:
    """An egress door's ceiling: a signed policy written in ``directory`` for ``origins``."""
    signer, path = allowing(directory, origins, networks)
    return signer.ceiling(path)


def policy_env(directory: Path, origins: Iterable[str],
               networks: Iterable[str] = ("127.0.0.1/32",)) -> dict[str, str]:
    """The settings of a server whose signed egress policy allows ``origins``."""
    signer, path = allowing(directory, origins, networks)
    return signer.env(path)
