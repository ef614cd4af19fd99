"""Projection redaction: no credential from a generated corpus survives."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kaizen_server_extension.policy.redaction import REDACTED, is_credential_key, redact

# Secrets always contain "KZ9" plus uppercase/digits; filler text is lowercase only, so a
# secret can never appear in the output by coincidence.
SECRET = st.text(alphabet=string.ascii_uppercase + string.digits, min_size=10,
                 max_size=24).map(lambda s: "KZ9" + s)
FILLER = st.text(alphabet=string.ascii_lowercase + " .,", max_size=20)

CREDENTIAL_KEYS = ["password", "secret", "token", "api_key", "authorization", "private_key",
                   "client_secret", "cookie", "access_token", "refresh_token", "x-api-key",
                   "set-cookie", "passwd", "session_id", "db_password", "github_token",
                   "aws_secret_access_key", "credentials", "id_token", "apiKey"]


def _variant(key: str, draw: Any) -> str:
    words = key.replace("-", "_").split("_")
    sep = draw(st.sampled_from(["_", "-", " ", ".", ""]))
    case = draw(st.sampled_from([str.lower, str.upper, str.title, str.capitalize]))
    return sep.join(case(w) for w in words)


@st.composite
def credential_key(draw: Any) -> str:
    return _variant(draw(st.sampled_from(CREDENTIAL_KEYS)), draw)


@st.composite
def secret_text(draw: Any) -> tuple[str, str]:
    """A string that embeds one secret the way real output does."""
    secret = draw(SECRET)
    before, after = draw(FILLER), draw(FILLER)
    form = draw(st.sampled_from(["bearer", "basic", "header", "kv", "json", "url", "pem",
                                 "userinfo"]))
    if form == "bearer":
        body = f"Bearer {secret}"
    elif form == "basic":
        body = f"Authorization: Basic {secret}=="
    elif form == "header":
        body = f"authorization: token {secret}"
    elif form == "kv":
        body = f"{draw(credential_key())}={secret}"
    elif form == "json":
        body = json.dumps({draw(credential_key()): secret, "user": "bob"})
    elif form == "url":
        param = draw(st.sampled_from(["X-Amz-Signature", "x-amz-security-token", "sig",
                                      "X-Goog-Signature", "token", "access_token", "api_key"]))
        body = (f"https://bucket.example.com/o/file.csv?X-Amz-Algorithm=AWS4-HMAC-SHA256"
                f"&{param}={secret}&x-id=GetObject")
    elif form == "pem":
        kind = draw(st.sampled_from(["", "RSA ", "EC ", "OPENSSH ", "ENCRYPTED "]))
        end = draw(st.booleans())
        body = (f"-----BEGIN {kind}PRIVATE KEY-----\nMIIE{secret}\n{secret}==\n"
                + (f"-----END {kind}PRIVATE KEY-----" if end else ""))
    else:
        body = f"postgres://bob:{secret}@db.internal:5432/app"
    return secret, f"{before} {body} {after}"


@st.composite
def corpus(draw: Any) -> tuple[list[str], object]:
    """A nested dict/list/str structure with secrets planted at random depths."""
    secrets: list[str] = []

    def leaf() -> object:
        kind = draw(st.integers(0, 2))
        if kind == 0:
            secret, text = draw(secret_text())
            secrets.append(secret)
            return text
        if kind == 1:
            secret = draw(SECRET)
            secrets.append(secret)
            return {draw(credential_key()): draw(st.sampled_from(
                [secret, [secret], {"nested": secret}, {"value": [1, secret]}]))}
        return draw(FILLER)

    def node(depth: int) -> object:
        if depth == 0 or draw(st.booleans()):
            return leaf()
        if draw(st.booleans()):
            return [node(depth - 1) for _ in range(draw(st.integers(1, 3)))]
        return {draw(FILLER) or "k": node(depth - 1) for _ in range(draw(st.integers(1, 3)))}

    return secrets, node(draw(st.integers(0, 4)))


@pytest.mark.rule("R-344", "R-229", "R-072")
@settings(max_examples=600)
@given(corpus())
def test_property_no_credential_survives_the_projection(sample: tuple[list[str], object]):
    secrets, value = sample
    projected = json.dumps(redact(value))
    for secret in secrets:
        assert secret not in projected


@given(corpus())
def test_property_redaction_is_idempotent_and_does_not_mutate_its_input(sample):
    _, value = sample
    before = json.dumps(value)
    once = redact(value)
    assert json.dumps(value) == before
    assert redact(once) == once


@pytest.mark.parametrize("key", ["max_tokens", "prompt_tokens", "name", "status", "monkey",
                                 "keyword", "title", "url", "id"])
def test_ordinary_keys_are_not_credential_shaped(key: str):
    assert not is_credential_key(key)


def test_a_credential_key_loses_its_whole_value_whatever_its_type():
    out = redact({"Authorization": {"scheme": "Bearer", "value": "x"}, "rows": [1, 2]})
    assert out == {"Authorization": REDACTED, "rows": [1, 2]}


def test_ordinary_text_and_urls_pass_through_unchanged():
    text = "See https://example.com/docs?page=2&q=kernels for the tokens used: 12."
    assert redact(text) == text


@pytest.mark.timeout(20)
@pytest.mark.parametrize("unit", ['a:"', "k= ", "a@b:", "http://", "x=1&?", "a.", "Bearer "])
def test_adversarial_large_text_is_scanned_without_quadratic_blowup(unit: str):
    # A liveness guard (pytest-timeout), not a timing assertion.
    redact(unit * 100_000)
