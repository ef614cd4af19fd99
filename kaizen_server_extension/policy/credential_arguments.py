"""The last look at a source tool's arguments before it runs: no credential may ride in them.

Spec (Request-scoped platform tools): "Immediately before execution the broker recursively
rejects credential-shaped keys and credential-bearing URL components" (R-349); "only an opaque
credential_ref may be passed; its value is resolved by the trusted platform" (R-350). A model
that pastes a token into a tool call, names a field ``api_key``, writes ``Authorization:
Bearer …`` into a string or builds ``https://user:pass@host/?access_token=…`` is refused
before anything is sent, and the refusal says where, never what.

The scan is recursive over JSON-like data and bounded in depth like the redactor. It reuses
the redactor's notion of a credential-shaped key (``policy/redaction.py``) so the two
boundaries agree, and adds value shapes that identify a credential on their own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from kaizen_server_extension.policy.redaction import is_credential_key

#: The one argument a credential may be named by: an opaque reference the broker resolves.
CREDENTIAL_REF_ARGUMENT = "credential_ref"
#: What a credential reference looks like (the broker mints them, ``credentials/broker.py``).
CREDENTIAL_REF_RE = re.compile(r"^cref_[A-Za-z0-9_-]{22,64}$")

MAX_DEPTH = 64
#: Headers a credential may never be sent in: the ones that route, frame or identify a
#: request (a credential destination or an OpenAPI security scheme naming one is refused).
RESERVED_CREDENTIAL_HEADERS = frozenset({
    "host", "content-length", "content-type", "transfer-encoding", "connection", "te",
    "upgrade", "proxy-authorization", "x-forwarded-for", "x-forwarded-host",
    "x-forwarded-proto", "forwarded", "user-agent", "accept", "if-none-match",
})

# Values that are a credential whatever field holds them.
_VALUE_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("authorization_value",
     re.compile(r"(?i)\b(bearer|basic|digest|negotiate)\s+[A-Za-z0-9\-._~+/=]{8,}")),
    ("authorization_header", re.compile(r"(?i)\b(proxy-)?authorization\s*:\s*\S+")),
    ("cookie_header", re.compile(r"(?i)\b(set-)?cookie\s*:\s*[^=\s]+=\S+")),
    ("private_key", re.compile(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    # Prefixes well-known issuers give their tokens.
    ("token_prefix", re.compile(
        r"\b(sk-[A-Za-z0-9_-]{16,}|sk_(live|test)_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{30,}"
        r"|github_pat_[A-Za-z0-9_]{30,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}"
        r"|AIza[0-9A-Za-z_-]{35}|glpat-[A-Za-z0-9_-]{20,})")),
)
_URL = re.compile(r"(?i)\b[a-z][a-z0-9+.\-]*://[^\s\"'<>]+")
# Query parameters whose value is the credential (signed URLs, OAuth, API keys).
_SECRET_PARAMS = frozenset({
    "xamzsignature", "xamzcredential", "xamzsecuritytoken", "xgoogsignature",
    "xgoogcredential", "signature", "sig", "token", "accesstoken", "key", "apikey", "code",
    "auth", "awsaccesskeyid", "googleaccessid", "clientsecret", "password", "secret",
})
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True, slots=True)
class Finding:
    """Where a credential-shaped value was found (a JSON path) and what shape it had; never
    the value itself."""

    path: str
    reason: str

    def message(self, tool: str) -> str:
        return (f"The arguments of {tool} carry something credential-shaped at {self.path} "
                f"({self.reason.replace('_', ' ')}), so it was not run. Credentials never go "
                f"into tool arguments: pass only a {CREDENTIAL_REF_ARGUMENT} the member "
                "created, or leave the credential out.")


def find_credential(arguments: object) -> Finding | None:
    """The first credential-shaped key, value or URL part in ``arguments``, else None."""
    return _scan(arguments, "$", 0)


def _scan(value: object, path: str, depth: int) -> Finding | None:
    if depth > MAX_DEPTH:
        return Finding(path, "nested_too_deeply")
    if isinstance(value, str):
        return _scan_text(value, path)
    if isinstance(value, Mapping):
        for key, item in value.items():
            key_text = str(key)
            where = f"{path}.{key_text[:64]}"
            if key_text == CREDENTIAL_REF_ARGUMENT:
                # The one sanctioned name, and only for an opaque reference.
                if not (isinstance(item, str) and CREDENTIAL_REF_RE.fullmatch(item)):
                    return Finding(where, "credential_ref_not_a_reference")
                continue
            if is_credential_key(key_text):
                return Finding(where, "credential_shaped_key")
            found = _scan_text(key_text, where) or _scan(item, where, depth + 1)
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _scan(item, f"{path}[{index}]", depth + 1)
            if found is not None:
                return found
    return None


def _scan_text(text: str, path: str) -> Finding | None:
    for reason, pattern in _VALUE_SHAPES:
        if pattern.search(text):
            return Finding(path, reason)
    for match in _URL.finditer(text):
        why = url_credential(match.group(0))
        if why is not None:
            return Finding(path, why)
    return None


def url_credential(url: str) -> str | None:
    """Why ``url`` carries a credential (user information, a secret query parameter or a
    fragment holding one), else None."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "unparseable_url"
    if "@" in parts.netloc:
        return "url_userinfo"
    for query in (parts.query, parts.fragment):
        for name, _ in parse_qsl(query, keep_blank_values=True):
            flat = _NON_ALNUM.sub("", name.lower())
            if flat in _SECRET_PARAMS or is_credential_key(name):
                return "url_query_credential"
    return None


__all__ = ["CREDENTIAL_REF_ARGUMENT", "CREDENTIAL_REF_RE", "RESERVED_CREDENTIAL_HEADERS",
           "Finding", "find_credential", "url_credential"]
