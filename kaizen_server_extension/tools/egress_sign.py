"""``python -m kaizen_server_extension.tools.egress_sign``: issue the signed egress policy.

Run it where the deployment's signing key lives — not on the Kaizen server, which needs only
the public key (docs/openapi-sources.md, "The signed egress policy")::

    # once: a signing key (owner-only file) and the public key for every replica
    python -m kaizen_server_extension.tools.egress_sign keygen --private-key egress.key
    # then, for each policy (default 30 days)
    python -m kaizen_server_extension.tools.egress_sign sign --private-key egress.key \\
        --origin https://api.example.com --origin https://tools.example.org:8443 \\
        --days 30 --output egress-policy.signed
    # what a policy says, if it verifies (the key from --public-key=KEY, else from
    # KAIZEN_OPENAPI_EGRESS_POLICY_KEY; a key may begin with "-", so give it with "=")
    python -m kaizen_server_extension.tools.egress_sign show egress-policy.signed
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from kaizen_server_extension.tools.egress_policy import (
    MAX_LIFETIME_S,
    PolicyRejected,
    open_policy,
    parse_public_key,
    policy_document,
    public_key_text,
    sign_policy,
)


def _write_private(path: Path, data: bytes) -> None:
    """Create ``path`` owner-only; an existing file is never overwritten."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _load_private(path: Path) -> Ed25519PrivateKey:
    key = load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise SystemExit(f"{path} is not an Ed25519 private key")
    return key


def _keygen(args: argparse.Namespace) -> int:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    try:
        _write_private(Path(args.private_key), pem)
    except FileExistsError:
        print(f"{args.private_key} exists: not overwritten", file=sys.stderr)
        return 1
    print(f"KAIZEN_OPENAPI_EGRESS_POLICY_KEY={public_key_text(key.public_key())}")
    return 0


def _sign(args: argparse.Namespace) -> int:
    key = _load_private(Path(args.private_key))
    lifetime = int(args.days * 24 * 3600)
    if not 0 < lifetime <= MAX_LIFETIME_S:
        print(f"--days must be more than 0 and at most {MAX_LIFETIME_S // 86400}",
              file=sys.stderr)
        return 1
    now = int(time.time())
    try:
        document = policy_document(args.origin, args.network or (), issued_at=now,
                                   expires_at=now + lifetime)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    token = sign_policy(document, key)
    if args.output:
        Path(args.output).write_text(token + "\n", encoding="ascii")
    else:
        print(token)
    return 0


#: The server's setting holding the public key; ``show`` reads it when no key is given.
PUBLIC_KEY_SETTING = "KAIZEN_OPENAPI_EGRESS_POLICY_KEY"


def _show(args: argparse.Namespace) -> int:
    public_key = args.public_key or os.environ.get(PUBLIC_KEY_SETTING, "")
    if not public_key:
        print(f"no public key: give --public-key=KEY or set {PUBLIC_KEY_SETTING}",
              file=sys.stderr)
        return 2
    try:
        policy = open_policy(Path(args.policy).read_text(encoding="ascii"),
                             parse_public_key(public_key), now=time.time())
    except PolicyRejected as exc:
        print(f"refused: {exc.code}", file=sys.stderr)
        return 1
    print(json.dumps(policy.document(), indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kaizen_server_extension.tools.egress_sign",
                                     description="Issue Kaizen's signed egress policy.")
    commands = parser.add_subparsers(dest="command", required=True)
    keygen = commands.add_parser("keygen", help="create a signing key (owner-only file)")
    keygen.add_argument("--private-key", required=True)
    sign = commands.add_parser("sign", help="sign a policy")
    sign.add_argument("--private-key", required=True)
    sign.add_argument("--origin", action="append", required=True,
                      help="https://host[:port] a source may be reached on (repeat)")
    sign.add_argument("--network", action="append",
                      help="a protected CIDR sources may resolve into (repeat)")
    sign.add_argument("--days", type=float, default=30.0)
    sign.add_argument("--output", help="write the signed policy here (default: print it)")
    show = commands.add_parser("show", help="verify a signed policy and print it")
    # Optional: the server's own setting is the natural default. A URL-safe base64 key may
    # begin with "-", which argparse takes for an option unless it comes as --public-key=KEY.
    show.add_argument("--public-key", help=f"the public key (default: {PUBLIC_KEY_SETTING}); "
                      "give it as --public-key=KEY")
    show.add_argument("policy")
    args = parser.parse_args(argv)
    handlers = {"keygen": _keygen, "sign": _sign, "show": _show}
    return handlers[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
