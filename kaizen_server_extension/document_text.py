"""Documents as text: extraction from an upload, chunking into cited passages, query terms.

Pure functions shared by the store (which indexes the chunks with the database's own full-text
search) and the bench. Text, Markdown and notebooks need nothing beyond the server's own
dependencies (nbformat comes with jupyter_server); PDF and DOCX use pypdf and python-docx,
imported only when such a file arrives, so a server without them refuses those two types with
a member-safe sentence instead of failing to start.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

from kaizen_server_extension.protocol.errors import SchemaViolation

#: Upper bound of one upload (bytes) and of the text kept from it (characters).
MAX_DOCUMENT_BYTES = 10 * 1024 * 1024
MAX_DOCUMENT_CHARS = 2_000_000
#: A chunk is a passage of at most this many characters, cut at line boundaries.
MAX_CHUNK_CHARS = 1_200
#: A query is at most this many terms of at most this many characters each.
MAX_QUERY_TERMS = 32
MAX_TERM_CHARS = 64

TEXT_SUFFIXES = {".txt": "text/plain", ".text": "text/plain", ".log": "text/plain",
                 ".csv": "text/csv", ".rst": "text/x-rst", ".py": "text/x-python",
                 ".json": "application/json", ".md": "text/markdown",
                 ".markdown": "text/markdown"}
NOTEBOOK_TYPE = "application/x-ipynb+json"
PDF_TYPE = "application/pdf"
DOCX_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
SUPPORTED = {**TEXT_SUFFIXES, ".ipynb": NOTEBOOK_TYPE, ".pdf": PDF_TYPE, ".docx": DOCX_TYPE}
_TERM = re.compile(r"\w+", re.UNICODE)
_HEADING = re.compile(r"^#{1,6}\s")
# Characters neither database stores in a text column (store/storable.py).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class UnsupportedDocument(SchemaViolation):
    default_code = "unsupported_document"


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of text with where it sits in the original: a notebook cell, a PDF page, or the
    whole file (``where`` empty)."""

    where: str
    text: str


@dataclass(frozen=True, slots=True)
class Chunk:
    ordinal: int
    locator: str
    body: str


@dataclass(frozen=True, slots=True)
class Extracted:
    media_type: str
    text: str
    segments: tuple[Segment, ...]


def media_type_for(filename: str) -> str:
    suffix = PurePosixPath(filename).suffix.lower()
    media_type = SUPPORTED.get(suffix)
    if media_type is None:
        raise UnsupportedDocument(
            "This kind of file cannot be added as a document. Upload text, Markdown, a "
            "notebook (.ipynb), PDF or DOCX; the type is taken from the file name's suffix.")
    return media_type


def extract(filename: str, content: bytes) -> Extracted:
    """The text of ``content``, by the type its name says; refused when unreadable."""
    if len(content) > MAX_DOCUMENT_BYTES:
        raise UnsupportedDocument(f"A document is at most {MAX_DOCUMENT_BYTES} bytes.",
                                  code="document_too_large")
    media_type = media_type_for(filename)
    if media_type == NOTEBOOK_TYPE:
        segments = tuple(_notebook(content))
    elif media_type == PDF_TYPE:
        segments = tuple(_pdf(content))
    elif media_type == DOCX_TYPE:
        segments = (Segment("", _docx(content)),)
    else:
        segments = (Segment("", _utf8(content)),)
    segments = tuple(Segment(s.where, _clean(s.text)) for s in segments)
    text = "\n\n".join(s.text for s in segments)
    if not text.strip():
        raise UnsupportedDocument("The document holds no text to search.",
                                  code="document_empty")
    if len(text) > MAX_DOCUMENT_CHARS:
        raise UnsupportedDocument(f"A document's text is at most {MAX_DOCUMENT_CHARS} "
                                  "characters.", code="document_too_large")
    return Extracted(media_type, text, segments)


def chunks(segments: Iterable[Segment], limit: int = MAX_CHUNK_CHARS) -> list[Chunk]:
    """Passages of at most ``limit`` characters cut at line boundaries (a longer line is cut
    inside), a Markdown heading starting a new one; each names its segment and lines."""
    out: list[Chunk] = []
    for segment in segments:
        lines = segment.text.split("\n")
        first, last, buffer = 1, 1, ""
        for number, line in enumerate(lines, start=1):
            for piece in [line[i:i + limit] for i in range(0, len(line), limit)] or [""]:
                heading = bool(_HEADING.match(piece)) and len(buffer) >= limit // 4
                if buffer and (len(buffer) + len(piece) + 1 > limit or heading):
                    _emit(out, segment.where, first, last, buffer)
                    first, buffer = number, ""
                buffer = f"{buffer}\n{piece}" if buffer else piece
                last = number
        _emit(out, segment.where, first, last, buffer)
    return out


def _emit(out: list[Chunk], where: str, first: int, last: int, body: str) -> None:
    if not body.strip():
        return
    lines = f"line {first}" if first >= last else f"lines {first}-{last}"
    out.append(Chunk(len(out), f"{where}, {lines}" if where else lines, body))


def query_terms(query: str) -> list[str]:
    """The words of a query, lower-cased, bounded; the only part of it a database sees (as
    bound values quoted into its own query syntax), so no operator can be smuggled in."""
    terms: list[str] = []
    for term in _TERM.findall(query.lower()):
        term = term[:MAX_TERM_CHARS]
        if term not in terms:
            terms.append(term)
        if len(terms) == MAX_QUERY_TERMS:
            break
    return terms


def sqlite_match(terms: list[str]) -> str:
    """An FTS5 MATCH expression: any of the terms, each a quoted string (no operators)."""
    return " OR ".join(f'"{t}"' for t in terms)


def postgresql_query(terms: list[str]) -> str:
    """A ``websearch_to_tsquery`` text: any of the terms (they are word characters only)."""
    return " or ".join(terms)


def _clean(text: str) -> str:
    return _UNSTORABLE.sub("\ufffd", text.replace("\r\n", "\n").replace("\r", "\n"))


def _utf8(content: bytes) -> str:
    try:
        return content.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UnsupportedDocument("The file is not UTF-8 text.",
                                  code="document_not_text") from None


def _notebook(content: bytes) -> Iterator[Segment]:
    import nbformat

    try:
        notebook = nbformat.reads(_utf8(content), as_version=4)
    except Exception:  # nbformat raises several types for one thing: not a notebook
        raise UnsupportedDocument("The file is not a readable Jupyter notebook.",
                                  code="document_unreadable") from None
    for index, cell in enumerate(notebook.cells, start=1):
        source = cell.get("source", "")
        if isinstance(source, list):
            source = "".join(source)
        if str(source).strip():
            yield Segment(f"cell {index} ({cell.get('cell_type', 'cell')})", str(source))


def _pdf(content: bytes) -> Iterator[Segment]:
    try:
        from pypdf import PdfReader
    except ImportError:
        raise UnsupportedDocument("This server cannot read PDF files (pypdf is not "
                                  "installed).", code="document_type_unavailable") from None
    try:
        reader = PdfReader(io.BytesIO(content))
        pages = [page.extract_text() or "" for page in reader.pages]
    except Exception:  # pypdf's errors for a damaged file are many; all mean unreadable
        raise UnsupportedDocument("The PDF could not be read.",
                                  code="document_unreadable") from None
    for number, text in enumerate(pages, start=1):
        if text.strip():
            yield Segment(f"page {number}", text)


def _docx(content: bytes) -> str:
    try:
        import docx
    except ImportError:
        raise UnsupportedDocument("This server cannot read DOCX files (python-docx is not "
                                  "installed).", code="document_type_unavailable") from None
    try:
        document = docx.Document(io.BytesIO(content))
    except Exception:  # a damaged or non-DOCX zip: unreadable either way
        raise UnsupportedDocument("The DOCX file could not be read.",
                                  code="document_unreadable") from None
    return "\n".join(paragraph.text for paragraph in document.paragraphs)
