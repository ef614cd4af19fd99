"""Bad input never reaches a server error (issue 21): the reproductions, through a real server.

Each case is a 4xx with the usual error body, and nothing is written: the caller's rooms and
the room's journal are the same before and after. The property-based sweep over every route is
``test_contract.py``.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from kaizen_server_extension.api.base import MAX_JSON_DEPTH, json_too_deep
from kaizen_server_extension.api.params import parse_int
from tests.support.server import ServerProcess, json_of


def _error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text[:300])
    body = json_of(response)
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    if code is not None:
        assert body["error"]["code"] == code, body
    return dict(body["error"])


def _state(client: httpx.Client, room: str) -> tuple[int, list[dict[str, Any]]]:
    rooms = client.get("conversations").json()
    journal = client.get(f"conversations/{room}/journal", params={"limit": 1000}).json()
    return len(rooms), journal["events"]


@pytest.fixture
def room(server: ServerProcess) -> str:
    with server.client("alice") as alice:
        created = alice.post("conversations", json={"agent_id": "general", "shared": True})
        assert created.status_code == 201, created.text
        room_id = str(created.json()["id"])
        assert alice.post(f"conversations/{room_id}/messages",
                          json={"text": "hello"}).status_code == 202
        # The turn runs detached (no model here: it fails); wait for it, so that later the
        # journal changes only if a refused request wrote to it.
        deadline = time.monotonic() + 60
        while not any(e["type"] == "run.terminal" for e in _state(alice, room_id)[1]):
            assert time.monotonic() < deadline, "the room's turn never settled"
            time.sleep(0.05)
        return room_id


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


class TestDeepJson:
    def test_a_body_nested_100000_levels_is_400_and_writes_nothing(
            self, server: ServerProcess, room: str) -> None:
        with server.client("alice") as alice:
            before = _state(alice, room)
            deep = _deep(100_000)
            for path, body in [
                ("conversations", deep),
                ("conversations", b'{"agent_id": ' + deep + b"}"),
                (f"conversations/{room}/messages", deep),
                (f"conversations/{room}/messages", b'{"text": "hi", "attachments": '
                 + deep + b"}"),
                (f"conversations/{room}/participants", b'{"member": ' + deep + b"}"),
            ]:
                _error(alice.post(path, content=body), 400, "json_too_deep")
            _error(alice.put("members/me/settings", content=deep), 400, "json_too_deep")
            assert _state(alice, room) == before

    def test_depth_is_bounded_exactly_and_brackets_in_strings_are_text(
            self, server: ServerProcess, room: str) -> None:
        with server.client("alice") as alice:
            # At the bound it parses (and is then a schema violation); one deeper is refused.
            at = b'{"text": "hi", "kind": ' + _deep(MAX_JSON_DEPTH - 1) + b"}"
            _error(alice.post(f"conversations/{room}/messages", content=at), 422,
                   "schema_violation")
            over = b'{"text": "hi", "kind": ' + _deep(MAX_JSON_DEPTH) + b"}"
            _error(alice.post(f"conversations/{room}/messages", content=over), 400,
                   "json_too_deep")
            # Brackets inside a string are not nesting: a message of code is accepted.
            text = "[" * 5000 + '\\"{' * 100
            accepted = alice.post(f"conversations/{room}/messages", json={"text": text})
            assert accepted.status_code == 202, accepted.text


def test_json_depth_scan_skips_strings_and_escapes() -> None:
    assert not json_too_deep(b'{"a": [1, {"b": "[[[["}]}', limit=3)
    assert json_too_deep(b'{"a": [1, {"b": [[]]}]}', limit=4)
    assert not json_too_deep(b'{"t": "\\\\", "u": "' + b"[" * 100 + b'"}', limit=3)
    assert json_too_deep(b'{"t": "\\"' + b"[" * 10 + b'"}' + b"[" * 10, limit=5)
    assert not json_too_deep(_deep(64)) and json_too_deep(_deep(65))


class TestIntegerQueryParameters:
    @pytest.mark.parametrize("after", [
        "1e30", "9223372036854775808", "99999999999999999999999", "-1", "0x10", "1.5",
        "٣",  # an Arabic-Indic three: int() takes it, the API does not
        "²",  # a superscript two: str.isdigit() is true, int() fails
    ])
    def test_after_out_of_range_or_not_ascii_is_400(self, server: ServerProcess, room: str,
                                                    after: str) -> None:
        with server.client("alice") as alice:
            before = _state(alice, room)
            _error(alice.get(f"conversations/{room}/journal", params={"after": after}), 400,
                   "invalid_query")
            assert _state(alice, room) == before

    def test_the_largest_sequence_is_a_valid_empty_page(self, server: ServerProcess,
                                                        room: str) -> None:
        with server.client("alice") as alice:
            page = alice.get(f"conversations/{room}/journal",
                             params={"after": str(2**63 - 1)})
            assert page.status_code == 200, page.text
            assert page.json() == {"events": [], "next": 2**63 - 1}

    @pytest.mark.parametrize("limit", ["0", "1001", "²", "1e3", "18446744073709551616"])
    def test_limit_outside_1_to_1000_is_400(self, server: ServerProcess, room: str,
                                            limit: str) -> None:
        with server.client("alice") as alice:
            _error(alice.get(f"conversations/{room}/journal", params={"limit": limit}), 400,
                   "invalid_query")


class TestPathIds:
    @pytest.mark.parametrize("suffix", ["", "/download"])
    def test_a_unicode_digit_artifact_version_is_404_not_500(
            self, server: ServerProcess, room: str, suffix: str) -> None:
        with server.client("alice") as alice:
            before = _state(alice, room)
            for version in ("%C2%B2", "%D9%A3", "%EF%BC%91"):  # ², ٣, fullwidth 1
                _error(alice.get(f"artifacts/abc/versions/{version}{suffix}"), 404,
                       "not_found")
            for version in ("0", "x", "-1", "99999999999"):
                _error(alice.get(f"artifacts/abc/versions/{version}{suffix}"), 400,
                       "invalid_version")
            assert _state(alice, room) == before

    def test_a_unicode_digit_cell_ordinal_is_refused(self, server: ServerProcess) -> None:
        with server.client("alice") as alice:
            for ordinal, status in (("%C2%B2", 404), ("x", 400), ("1000", 400)):
                _error(alice.post(f"notebook-edits/abc/cells/{ordinal}/decision",
                                  json={"decision": "accept"}), status)

    @pytest.mark.parametrize("path", [
        "conversations/%C3%A9t%C3%A9", "conversations/-x/journal", "runs/a%20b",
        "agents/%F0%9F%98%80", "artifacts/" + "a" * 129, "no/such/route", "",
    ])
    def test_an_id_outside_its_ascii_pattern_is_the_json_404(
            self, server: ServerProcess, room: str, path: str) -> None:
        with server.client("alice") as alice, server.client(None) as anonymous:
            before = _state(alice, room)
            for client in (alice, anonymous):
                for method in ("GET", "POST", "DELETE"):
                    response = client.request(method, path, json={})
                    assert _error(response, 404, "not_found") == {
                        "code": "not_found", "message": "Not found."}
            assert _state(alice, room) == before


def test_parse_int_takes_only_ascii_digits_in_range() -> None:
    assert parse_int("7", minimum=0, maximum=10) == 7
    assert parse_int("007", minimum=0, maximum=10) == 7
    for raw in ("²", "٣", "\uff11", "-1", "+1", " 1", "1 ", "", "11", "1_0"):
        assert parse_int(raw, minimum=0, maximum=10) is None, raw
    assert parse_int("9" * 20, minimum=0, maximum=2**63 - 1) is None
