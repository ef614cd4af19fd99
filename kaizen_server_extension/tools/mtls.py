"""Mutual-TLS client material: loaded into a TLS context through /dev/shm only (R-392).

Python's ``ssl`` module loads a client certificate and its private key from files only
(``SSLContext.load_cert_chain``). So the material of one request is **staged** for the few
milliseconds the context needs, and nowhere but memory-backed ``/dev/shm``:

* a fresh directory ``/dev/shm/kaizen-mtls-<random>`` created owner-only (``0700``), each
  file created exclusively, owner-only (``0600``) and without following links;
* loaded, then overwritten and removed — the files and their directory — whether the load
  worked or not, before the request is sent;
* no ``/dev/shm`` (or not a memory file system there): nothing is staged anywhere else; the
  request is refused (``mtls_unavailable``) and nothing is sent.

The material itself (:class:`ClientCertificate`) is never logged, pickled or shown: its repr
withholds it. It lives in the process only as long as the credential that carries it (a
use-once credential is spent by its one request; a remembered one is sealed in the database
and opened per request — ``credentials/crypto.py``), never in the database in clear.

PEM text entered in a browser's single-line field loses its line breaks; :func:`pem_blocks`
puts them back, so a pasted certificate or key works as entered.

An **encrypted** private key (PKCS#8, ``-----BEGIN ENCRYPTED PRIVATE KEY-----``) comes with its
passphrase. It is staged exactly as entered — still encrypted — and OpenSSL decrypts it in
memory while the context loads (``load_cert_chain(password=…)``), so the decrypted key is
never written anywhere, /dev/shm included. :func:`check_client_material` is the same check
ahead of time, entirely in memory (``cryptography``, no file at all): the form runs it on
submit, so a wrong passphrase or a key that does not belong to the certificate is refused
with a clear reason before anything is stored.
"""

from __future__ import annotations

import os
import re
import secrets
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from kaizen_server_extension.protocol.errors import MemberSafeError

#: Where client material may be staged: memory-backed, never a disk.
STAGING_ROOT = Path("/dev/shm")
_PEM_RE = re.compile(
    r"-----BEGIN ([A-Z0-9 ]{1,40})-----\s*([A-Za-z0-9+/=\s]{1,65536}?)\s*-----END \1-----")
#: The PEM blocks a certificate field and a key field may hold.
CERTIFICATE_LABELS = frozenset({"CERTIFICATE"})
KEY_LABELS = frozenset({"PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY",
                        "ENCRYPTED PRIVATE KEY"})


#: OpenSSL reads a passphrase into a 1024-byte buffer (PEM_BUFSIZE): a longer one can never
#: open a key, so it is refused when entered rather than when used.
MAX_PASSPHRASE_BYTES = 1023


class MtlsUnavailable(MemberSafeError):
    """The client certificate could not be used; nothing was sent."""

    def __init__(self, message: str, *, code: str = "mtls_unavailable") -> None:
        super().__init__(message, code=code)


def pem_blocks(text: str, labels: frozenset[str]) -> str:
    """``text``'s PEM blocks with ``labels``, in canonical form (64-character lines), whether
    or not its line breaks survived; :class:`MtlsUnavailable` ``mtls_material_invalid`` when
    there is none or another kind of block is present."""
    blocks = []
    for match in _PEM_RE.finditer(text):
        label, body = match.group(1), re.sub(r"\s+", "", match.group(2))
        if label not in labels:
            raise MtlsUnavailable("The client certificate or key is not in the expected "
                                  "PEM form.", code="mtls_material_invalid")
        lines = [body[i:i + 64] for i in range(0, len(body), 64)]
        blocks.append(f"-----BEGIN {label}-----\n" + "\n".join(lines)
                      + f"\n-----END {label}-----\n")
    if not blocks:
        raise MtlsUnavailable("The client certificate or key is not in the expected PEM form.",
                              code="mtls_material_invalid")
    return "".join(blocks)


@dataclass(frozen=True, slots=True)
class ClientCertificate:
    """A client certificate chain and its private key (PEM), and the key's passphrase."""

    certificate: str
    private_key: str
    passphrase: str = ""

    @classmethod
    def from_fields(cls, certificate: str, private_key: str,
                    passphrase: str = "") -> ClientCertificate:
        return cls(pem_blocks(certificate, CERTIFICATE_LABELS),
                   pem_blocks(private_key, KEY_LABELS), passphrase)

    def __repr__(self) -> str:
        return "ClientCertificate(<withheld>)"

    def __reduce__(self) -> Any:
        raise TypeError("client certificate material cannot be serialized")


@runtime_checkable
class CarriesClientCertificate(Protocol):
    """A request credential that presents a client certificate (``tools/egress.py``)."""

    def client_certificate(self) -> ClientCertificate | None: ...


def _invalid(message: str, code: str = "mtls_material_invalid") -> MtlsUnavailable:
    return MtlsUnavailable(message, code=code)


def check_client_material(material: ClientCertificate) -> None:
    """Refuse material that could never be presented, in memory and with a member-safe
    reason (none quotes the material or the passphrase): a key that is encrypted but came
    without a passphrase (``mtls_passphrase_required``), a passphrase that does not open it
    (``mtls_passphrase_wrong``), a passphrase for a key that is not encrypted
    (``mtls_passphrase_unexpected``), or a key that does not belong to the first certificate
    of the chain (``mtls_material_invalid``)."""
    # Imported here: only the form's submission needs it, not every egress import.
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_private_key,
    )

    passphrase = material.passphrase.encode("utf-8")
    if len(passphrase) > MAX_PASSPHRASE_BYTES:
        raise _invalid(f"The passphrase is too long (at most {MAX_PASSPHRASE_BYTES} bytes).",
                       "mtls_passphrase_wrong")
    encrypted = "-----BEGIN ENCRYPTED PRIVATE KEY-----" in material.private_key
    if encrypted and not passphrase:
        raise _invalid("The private key is encrypted: enter its passphrase.",
                       "mtls_passphrase_required")
    if passphrase and not encrypted:
        raise _invalid("The private key is not encrypted: leave the passphrase empty.",
                       "mtls_passphrase_unexpected")
    try:
        key = load_pem_private_key(material.private_key.encode("ascii"),
                                   password=passphrase or None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        if encrypted:
            raise _invalid("The passphrase does not open this private key (or the key is "
                           "damaged).", "mtls_passphrase_wrong") from None
        raise _invalid("The private key could not be read.") from None
    try:
        certificate = x509.load_pem_x509_certificate(material.certificate.encode("ascii"))
        # The chain's first certificate is the one the key must belong to.
        presented = certificate.public_key().public_bytes(
            Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        held = key.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise _invalid("The client certificate could not be read.") from None
    if presented != held:
        raise _invalid("The private key does not belong to the client certificate.")


def _memory_backed(root: Path) -> bool:
    """Whether ``root`` is a directory on a memory file system (tmpfs)."""
    if not root.is_dir():
        return False
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) >= 3 and fields[1] == str(root):
                    return fields[2] in ("tmpfs", "ramfs")
    except OSError:
        return False
    return False


def _write_owner_only(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, data)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    try:
        size = path.stat().st_size
        with open(path, "r+b") as handle:
            handle.write(b"\0" * size)
        path.unlink()
    except FileNotFoundError:
        pass


def load_client_certificate(context: ssl.SSLContext, material: ClientCertificate, *,
                            root: Path = STAGING_ROOT,
                            memory_backed: Callable[[Path], bool] = _memory_backed) -> None:
    """Load ``material`` into ``context`` through an owner-only staging directory under
    ``root`` (``/dev/shm``), removed before this returns (see the module docstring)."""
    if not memory_backed(root):
        raise MtlsUnavailable("Client certificates cannot be used on this server (no "
                              "memory-backed /dev/shm to load them through); nothing was "
                              "sent.")
    directory = root / f"kaizen-mtls-{secrets.token_hex(12)}"
    os.mkdir(directory, 0o700)
    certificate, key = directory / "certificate.pem", directory / "key.pem"
    try:
        os.chmod(directory, 0o700)
        _write_owner_only(certificate, material.certificate.encode("ascii"))
        _write_owner_only(key, material.private_key.encode("ascii"))
        passphrase = material.passphrase.encode("utf-8")
        try:
            # Always a callable, never None: with None, OpenSSL would prompt for an encrypted
            # key's passphrase on the server's terminal. An empty one simply fails.
            context.load_cert_chain(str(certificate), str(key),
                                    password=lambda: passphrase)
        except (ssl.SSLError, ValueError, OSError):
            raise MtlsUnavailable("The client certificate and key could not be loaded (they "
                                  "do not match, or the passphrase is wrong); nothing was "
                                  "sent.", code="mtls_material_invalid") from None
    finally:
        _remove(certificate)
        _remove(key)
        os.rmdir(directory)


__all__ = ["CarriesClientCertificate", "ClientCertificate", "MtlsUnavailable",
           "check_client_material", "load_client_certificate", "pem_blocks"]
