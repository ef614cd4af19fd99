"""The model learns which files are attached to the message it answers — names, types and
sizes, never bytes (R-176) — and only for that message: an earlier turn's files are gone."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kaizen_server_extension.lanes.context import attachment_note, build_context
from kaizen_server_extension.store.records import EventRecord

SALES = {"reference_id": "a1", "kind": "artifact", "version": 2, "sha256": "0" * 64,
         "filename": "sales.csv", "media_type": "text/csv", "size": 58}


def _event(seq: int, kind: str, data: dict[str, Any], run: str) -> EventRecord:
    return EventRecord("c1", seq, run, kind, "alice", datetime.now(UTC), data)


@pytest.mark.rule("R-176")
def test_only_the_current_inputs_files_are_named_and_no_bytes() -> None:
    history = [
        _event(1, "input.accepted", {"input_id": "i1", "text": "first",
                                     "attachments": [SALES]}, "r1"),
        _event(2, "answer.committed", {"text": "Done."}, "r1"),
        _event(3, "input.accepted", {"input_id": "i2", "text": "total units?",
                                     "attachments": [{**SALES, "filename": 'q"1.csv'}]}, "r2"),
    ]
    messages = build_context("persona", history, current_input_id="i2", shared=False)
    earlier, current = messages[1], messages[-1]
    assert earlier.content == "first"
    assert current.content.startswith("total units?\n\n[Files attached to this message")
    assert '"q\\"1.csv" (text/csv, 58 bytes)' in current.content
    assert "sha256" not in current.content and "0" * 64 not in current.content


def test_no_attachments_no_note() -> None:
    assert attachment_note({"text": "hi"}) == ""
    assert attachment_note({"attachments": []}) == ""
