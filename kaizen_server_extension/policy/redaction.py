"""Projection redaction: what a tool result may carry into a model context or member view.

The loop receives a projection, never raw output (R-229); credential-shaped fields and
signed-URL query values are redacted before model projection (R-344), and configured redaction
runs before content reaches a member response or a model context (R-072). The raw value is the
caller's to keep for audit only; this module never mutates its input.

Redaction is structural first (a credential-shaped *key* loses its whole value, whatever its
type) and textual second (every string, including dictionary keys, is scrubbed of bearer/Basic
credentials, ``key=value`` credentials, signed-URL query values and PEM private keys). It errs
towards removing too much: a projection that hides a ``token_count`` is a smaller failure than
one that leaks a token.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[REDACTED]"
REDACTED_PRIVATE_KEY = "[REDACTED PRIVATE KEY]"
TOO_DEEP = "[REDACTED: nested too deeply]"

# Nesting beyond this is replaced wholesale rather than walked: a hostile body must not be able
# to exhaust the stack, and nothing a member needs is that deep.
MAX_DEPTH = 64

# Whole words (after splitting snake/kebab/camel case) that make a key credential-shaped.
_KEY_WORDS = frozenset({
    "password", "passwd", "passphrase", "pwd", "secret", "secrets", "token", "cookie",
    "cookies", "authorization", "credential", "credentials", "bearer", "signature", "apikey",
    "privatekey", "sessionid", "jwt", "otp", "pin",
})
# Adjacent word pairs, joined, that do the same ("api key", "private key", "session id").
_KEY_PAIRS = frozenset({
    "apikey", "privatekey", "accesskey", "secretkey", "sessionid", "sessionkey", "clientsecret",
    "authtoken", "signingkey", "encryptionkey", "masterkey", "connectionstring",
})
# Substrings of the separator-free lowercase key that are unambiguous on their own
# ("dbpassword", "APIKEY", "awssecretaccesskey").
_KEY_SUBSTRINGS = ("password", "passwd", "secret", "apikey", "privatekey", "accesskey",
                   "authorization", "cookie", "credential", "bearer")
# Query parameters of signed URLs whose *value* is the credential.
_SIGNED_QUERY_PARAMS = frozenset({
    "xamzsignature", "xamzcredential", "xamzsecuritytoken", "xgoogsignature",
    "xgoogcredential", "signature", "sig", "token", "accesstoken", "key", "code", "auth",
    "awsaccesskeyid", "googleaccessid", "policy",
})

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def _words(key: str) -> list[str]:
    return [w for w in _NON_ALNUM.split(_CAMEL.sub(" ", key).lower()) if w]


@functools.lru_cache(maxsize=4096)
def is_credential_key(key: str) -> bool:
    """True when a field named ``key`` holds a credential (case- and separator-insensitive)."""
    words = _words(key)
    if not words:
        return False
    if any(w in _KEY_WORDS for w in words):
        return True
    if any(a + b in _KEY_PAIRS for a, b in itertools.pairwise(words)):
        return True
    flat = "".join(words)
    # "...token" catches access_token, GITHUB_TOKEN, xAuthToken without catching max_tokens.
    return flat.endswith("token") or any(s in flat for s in _KEY_SUBSTRINGS)


def _is_signed_param(name: str) -> bool:
    return "".join(_words(name)) in _SIGNED_QUERY_PARAMS or is_credential_key(name)


_PEM = re.compile(
    r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END[A-Z0-9 ]*PRIVATE KEY-----|\Z)",
    re.DOTALL,
)
# "Bearer <cred>", "Basic <cred>" anywhere; a bare "token <cred>" only as an Authorization value.
_AUTH_SCHEME = re.compile(r"(?i)\b(bearer|basic|digest|negotiate)(\s+)[A-Za-z0-9\-._~+/=]+")
_AUTH_HEADER = re.compile(r"(?i)(authorization\s*[:=]\s*[\"']?)([A-Za-z]+\s+)?[^\s\"',;]+")
# The head of a key=value / "key": "value" pair inside free text (including JSON embedded in a
# string). A key may be up to three words ("API KEY=…", "Client Secret: …", '"Api Key": …').
# The look-behind anchors a key at a word start, so a long run of key characters is scanned a
# bounded number of times rather than once per position (no quadratic backtracking).
_KV_HEAD = re.compile(
    r"""(?<![A-Za-z0-9_.\-])(?P<key>[A-Za-z_][A-Za-z0-9_.\-]*(?: [A-Za-z_][A-Za-z0-9_.\-]*){0,2})"""
    r"""(?P<kq>["']?)(?P<sep>\s*[:=]\s*)"""
)
_QUOTED_VALUE = {'"': re.compile(r'"(?:[^"\\]|\\.)*"'), "'": re.compile(r"'[^']*'")}
_BARE_VALUE = re.compile(r"""[^\s"',;&}\])]+""")
_QUERY = re.compile(r"(?P<lead>[?&;])(?P<name>[^=&#;?\s\"'<>]+)=(?P<value>[^&#;\s\"'<>]*)")
_URL_USERINFO = re.compile(
    r"(?i)(?<![a-z0-9+.\-])([a-z][a-z0-9+.\-]*://)([^/\s:@\"']+):([^/\s@\"']+)@")


def _redact_pairs(text: str) -> str:
    """Replace the value of every credential-shaped ``key: value`` pair in ``text``.

    Written as a scan rather than one regex so that an unterminated quoted value costs one pass:
    it is redacted to the end of the text, which is the safe reading of a cut-off secret.
    """
    out: list[str] = []
    pos = 0
    for head in _KV_HEAD.finditer(text):
        if head.start() < pos or not is_credential_key(head.group("key")):
            continue
        start = head.end()
        quote = text[start:start + 1]
        if quote in _QUOTED_VALUE:
            value = _QUOTED_VALUE[quote].match(text, start)
            end = value.end() if value else len(text)
            replacement = f"{quote}{REDACTED}{quote}"
        else:
            value = _BARE_VALUE.match(text, start)
            if value is None:
                continue
            end, replacement = value.end(), REDACTED
        # Already-scrubbed values stay as they are, so redaction is idempotent.
        if text[start:end].lstrip("\"'").startswith("[REDACTED"):
            continue
        out.append(text[pos:start])
        out.append(replacement)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _query_sub(match: re.Match[str]) -> str:
    if not _is_signed_param(match.group("name")):
        return match.group(0)
    return f"{match.group('lead')}{match.group('name')}={REDACTED}"


def redact_text(text: str) -> str:
    """Scrub credentials that travel inside free text."""
    text = _PEM.sub(REDACTED_PRIVATE_KEY, text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:{REDACTED}@", text)
    text = _QUERY.sub(_query_sub, text)
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + (m.group(2) or "") + REDACTED, text)
    text = _AUTH_SCHEME.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    return _redact_pairs(text)


def withhold(arguments: object, names: frozenset[str]) -> object:
    """``arguments`` with the values of ``names`` replaced by their size: what a tool
    declared as staying in the backend (artifact content, R-225) never reaches an observer,
    not even redacted. Anything but a JSON object passes unchanged."""
    if not names or not isinstance(arguments, dict):
        return arguments
    return {key: ({"withheld": True, "chars": len(value) if isinstance(value, str)
                   else len(json.dumps(value, default=str))} if key in names else value)
            for key, value in arguments.items()}


def redact(value: object, *, _depth: int = 0) -> Any:
    """A redacted copy of ``value`` (JSON-like data); scalars other than text pass unchanged."""
    if _depth > MAX_DEPTH:
        return TOO_DEEP
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, bytes | bytearray):
        return redact_text(bytes(value).decode("utf-8", errors="replace"))
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(key, str) and is_credential_key(key):
                out[redact_text(key)] = REDACTED
            else:
                new_key = redact_text(key) if isinstance(key, str) else key
                out[new_key] = redact(item, _depth=_depth + 1)
        return out
    if isinstance(value, list | tuple | set | frozenset):
        return [redact(item, _depth=_depth + 1) for item in value]
    return value
