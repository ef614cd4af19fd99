"""The typed client reverses the server's stated escaping of event data exactly
(store/storable.py; docs/architecture.md, "Text the databases cannot store")."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kaizen.client.models import Event
from kaizen_server_extension.store.storable import ESCAPED_FLAG, storable_document
from tests.support.unicode import any_text

documents = st.dictionaries(
    any_text.filter(lambda k: k != ESCAPED_FLAG),
    st.recursive(st.none() | st.integers() | any_text,
                 lambda inner: st.lists(inner, max_size=3)
                 | st.dictionaries(any_text, inner, max_size=3), max_leaves=8),
    max_size=4)


def _event(data: dict[str, Any]) -> Event:
    return Event(seq=1, conversation_id="c", type="tool.settled", actor="alice",
                 at=datetime.now(UTC), data=data)


@given(document=documents)
def test_original_data_is_what_the_server_escaped(document: dict[str, Any]) -> None:
    assert _event(storable_document(document)).original_data() == document


def test_unescaped_data_is_returned_as_it_is() -> None:
    data = {"content": "C:\\path \\u0000 literally", "n": 1}
    assert _event(data).original_data() == data
    escaped = _event({"content": "x\\u0000y \\\\ z", ESCAPED_FLAG: True})
    assert escaped.original_data() == {"content": "x\x00y \\ z"}
