"""The argument screen of source tools (``policy/credential_arguments.py``): credential-shaped
keys, values and URL parts are found wherever they sit, and ordinary arguments pass."""

from __future__ import annotations

from typing import Any

import pytest

from kaizen_server_extension.policy.credential_arguments import find_credential, url_credential

REF = "cref_" + "A" * 32


@pytest.mark.rule("R-349")
@pytest.mark.parametrize(("arguments", "reason"), [
    ({"password": "x"}, "credential_shaped_key"),
    ({"filters": {"apiKey": "x"}}, "credential_shaped_key"),
    ({"items": [{"client_secret": "x"}]}, "credential_shaped_key"),
    ({"headers": {"Authorization": "x"}}, "credential_shaped_key"),
    ({"X-Api-Key": "x"}, "credential_shaped_key"),
    ({"note": "Authorization: token abc"}, "authorization_header"),
    ({"note": "send Bearer abcdefgh12345678"}, "authorization_value"),
    ({"note": "Basic dXNlcjpwYXNzd29yZA=="}, "authorization_value"),
    ({"note": "Cookie: session=abc123"}, "cookie_header"),
    ({"key_text": "-----BEGIN OPENSSH PRIVATE KEY-----\nabc"}, "private_key"),
    ({"q": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJl"}, "jwt"),
    ({"q": "sk-abcdefghijklmnopqrstuvwx"}, "token_prefix"),
    ({"q": "AKIAABCDEFGHIJKLMNOP"}, "token_prefix"),
    ({"q": "xoxb-1234567890-abcdef"}, "token_prefix"),
    ({"url": "https://bob:pw@example.com/x"}, "url_userinfo"),
    ({"url": "https://example.com/x?token=abc"}, "url_query_credential"),
    ({"url": "https://example.com/x?X-Amz-Signature=abc&a=1"}, "url_query_credential"),
    ({"url": "https://example.com/cb#access_token=abc"}, "url_query_credential"),
    ({"text": "see https://example.com/?api_key=abc please"}, "url_query_credential"),
    ({"credential_ref": "Bearer abc"}, "credential_ref_not_a_reference"),
    ({"credential_ref": 17}, "credential_ref_not_a_reference"),
    ({"nested": {"credential_ref": "hunter2"}}, "credential_ref_not_a_reference"),
])
def test_credential_shapes_are_found(arguments: dict[str, Any], reason: str) -> None:
    finding = find_credential(arguments)
    assert finding is not None and finding.reason == reason
    # The finding names a path and a shape, never the value.
    message = finding.message("some_tool")
    for value in arguments.values():
        if isinstance(value, str) and len(value) > 3:
            assert value not in message


@pytest.mark.rule("R-350")
@pytest.mark.parametrize("arguments", [
    {"credential_ref": REF, "item": "tea"},
    {"query": "max_tokens and token counts", "limit": 5},
    {"url": "https://example.com/reports?page=2&sort=desc"},
    {"text": "The author's key insight was simple."},
    {"bearer": None} if False else {"nested": [{"city": "Paris"}, [1, 2, 3]]},
])
def test_ordinary_arguments_and_a_reference_pass(arguments: dict[str, Any]) -> None:
    assert find_credential(arguments) is None


def test_nesting_beyond_the_bound_is_refused() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(80):
        node["a"] = {}
        node = node["a"]
    finding = find_credential(deep)
    assert finding is not None and finding.reason == "nested_too_deeply"


def test_url_credential_reads_each_part() -> None:
    assert url_credential("https://example.com/a/b") is None
    assert url_credential("https://u@example.com/") == "url_userinfo"
    assert url_credential("https://example.com/?sig=1") == "url_query_credential"
