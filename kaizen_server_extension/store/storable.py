"""Text the databases cannot store: one policy at the store boundary, on both databases.

Two kinds of code point cannot be stored as text: U+0000 (PostgreSQL refuses it in ``text`` and
``jsonb``; SQLite would take it) and a surrogate code point U+D800..U+DFFF, which a Python
string holds only unpaired (a JSON ``"\\ud800"`` escape decodes to one) and which has no UTF-8
encoding at all. Every other character, control characters included, is stored as it is. So
that the two databases behave the same, the store applies one policy to both
(docs/architecture.md, "Text the databases cannot store"):

* **Member input** is refused: the REST layer answers 422 ``unstorable_text`` naming the field
  before anything is written (``api/base.py``), and every text column refuses such a value at
  bind time (:class:`StorableString`, :class:`StorableText`) with the same member-safe error,
  so a path nobody checked is a 422 with nothing written, never a 500.
* **Machine text** (tool results, tool arguments, model output) travels in JSON documents
  (journal events, audit rows, approval requests). A document holding an unstorable code point
  is stored *escaped*, and says so: every string in it (object keys too) has ``\\`` written
  ``\\\\`` and each unstorable code point written ``\\uXXXX`` (four lowercase hex digits), and
  the document gets ``"text_escaped": true`` at its top level (:func:`storable_document`).
  :func:`restore` reverses it exactly. A turn therefore never fails on what a tool printed or
  a model said, and every ``tool.requested`` gets its ``tool.settled`` (R-264, R-267).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy import JSON, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from kaizen_server_extension.protocol.errors import UnstorableText

#: The code points no text column or JSON document can hold.
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: The top-level flag of a document stored escaped.
ESCAPED_FLAG = "text_escaped"
_ESCAPE = re.compile("[\\\\\x00\ud800-\udfff]")
_UNESCAPE = re.compile(r"\\(\\|u[0-9a-f]{4})")

__all__ = ["ESCAPED_FLAG", "UNSTORABLE", "StorableJSON", "StorableString", "StorableText",
           "UnstorableText", "escape_text", "is_storable", "restore", "storable_document",
           "unescape_text", "unstorable_field"]


def is_storable(text: str) -> bool:
    return "\x00" not in text and (text.isascii() or UNSTORABLE.search(text) is None)


def unstorable_field(value: Any, path: str = "") -> str | None:
    """The dotted path (``attachments.0``; ``body`` at the top) of the first string or object
    key in a decoded JSON value that cannot be stored, or None."""
    if isinstance(value, str):
        return (path or "body") if UNSTORABLE.search(value) else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and UNSTORABLE.search(key):
                return here
            found = unstorable_field(item, here)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = unstorable_field(item, f"{path}.{index}" if path else str(index))
            if found is not None:
                return found
    return None


def escape_text(text: str) -> str:
    """``\\`` → ``\\\\``; U+0000 and surrogates → ``\\uXXXX``; everything else as it is."""
    return _ESCAPE.sub(_escape_one, text)


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    return "\\\\" if char == "\\" else f"\\u{ord(char):04x}"


def unescape_text(text: str) -> str:
    """The exact inverse of :func:`escape_text`."""
    return _UNESCAPE.sub(_unescape_one, text)


def _unescape_one(match: re.Match[str]) -> str:
    token = match.group(1)
    return "\\" if token == "\\" else chr(int(token[1:], 16))


def _holds_unstorable(value: Any) -> bool:
    """Whether any string or key in ``value`` is unstorable: :func:`unstorable_field`'s
    question without building paths, on every journal append and JSON bind (hot path, so
    exact types first: an ABC ``isinstance`` costs more than the search)."""
    search = UNSTORABLE.search
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            if search(item):
                return True
        elif kind is dict:
            for key, child in item.items():
                if type(key) is str and search(key):
                    return True
                if type(child) is str:
                    if search(child):
                        return True
                elif child is not None and type(child) not in _SCALARS:
                    stack.append(child)
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif kind not in _SCALARS and item is not None:
            if isinstance(item, str):
                if search(item):
                    return True
            elif isinstance(item, Mapping):
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, (list, tuple)):
                stack.extend(item)
    return False


_SCALARS = frozenset({int, float, bool})


def _map_strings(value: Any, convert: Any) -> Any:
    if isinstance(value, str):
        return convert(value)
    if isinstance(value, Mapping):
        return {(convert(k) if isinstance(k, str) else k): _map_strings(v, convert)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_map_strings(v, convert) for v in value]
    return value


def storable_document(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` itself when every string in it can be stored; otherwise its escaped copy
    flagged ``text_escaped`` (module docstring). Idempotent: an escaped copy needs nothing."""
    if not _holds_unstorable(document):
        return document
    escaped: dict[str, Any] = _map_strings(document, escape_text)
    escaped[ESCAPED_FLAG] = True
    return escaped


def restore(document: Any) -> Any:
    """The document as it was before :func:`storable_document` escaped it."""
    if not isinstance(document, dict) or document.get(ESCAPED_FLAG) is not True:
        return document
    original = {k: v for k, v in document.items() if k != ESCAPED_FLAG}
    return _map_strings(original, unescape_text)


# --- the column types: the last line, whatever path a value took -------------------------


class StorableString(TypeDecorator[str]):
    """``VARCHAR`` that refuses an unstorable value (:class:`UnstorableText`) on both
    databases, before the statement reaches the driver."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        if isinstance(value, str) and not is_storable(value):
            raise UnstorableText()
        return value

    def bind_processor(self, dialect: Dialect) -> Any:
        # Every id and name of every statement passes here: one tight function instead of
        # TypeDecorator's generic wrapper, and C-speed checks for the common ASCII case.
        after = self.impl_instance.dialect_impl(dialect).bind_processor(dialect)
        search = UNSTORABLE.search

        def process(value: Any) -> Any:
            if isinstance(value, str) and ("\x00" in value or (not value.isascii()
                                                                and search(value))):
                raise UnstorableText()
            return after(value) if after is not None else value

        return process


class StorableText(StorableString):
    """``TEXT`` with the same refusal."""

    impl = Text
    cache_ok = True


class StorableJSON(TypeDecorator[Any]):
    """JSON on SQLite, JSONB on PostgreSQL. An object document holding an unstorable string
    is stored escaped and flagged (:func:`storable_document`); any other JSON value holding
    one (an array, a bare string) is refused, as it has no place to record the escaping."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(JSON())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if isinstance(value, dict):
            return storable_document(value)
        if _holds_unstorable(value):
            raise UnstorableText()
        return value
