"""Text model: normalization, line splitting, the four-hex content tag, and write-back.

* Normalization drops a leading UTF-8 BOM and turns CRLF and lone CR into LF.
* The tag is the low 16 bits of xxHash32 (seed 0) over the UTF-8 bytes of the normalized text
  with every run of spaces, tabs and CRs before a newline or at the very end removed, printed
  as four upper-case hex digits (HASHLINE.md §2.1).
* The original encoding details (BOM, dominant line ending) are kept in :class:`TextFormat`
  so an edit writes the file back the way it was.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kaizen_hashline.errors import HashlineError

_M32 = 0xFFFFFFFF
_P1 = 2654435761
_P2 = 2246822519
_P3 = 3266489917
_P4 = 668265263
_P5 = 374761393
_TRAILING_BLANKS = re.compile(r"[ \t\r]+(?=\n|\Z)")
BOM = "\ufeff"

Eol = Literal["lf", "crlf", "cr"]
_EOL_TEXT: dict[str, str] = {"lf": "\n", "crlf": "\r\n", "cr": "\r"}


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data: bytes, seed: int = 0) -> int:
    """xxHash32 of ``data`` (pure Python; a 2 MiB file hashes in well under a second)."""
    n = len(data)
    i = 0
    if n >= 16:
        v1 = (seed + _P1 + _P2) & _M32
        v2 = (seed + _P2) & _M32
        v3 = seed & _M32
        v4 = (seed - _P1) & _M32
        stripes = n // 16
        words = struct.unpack_from(f"<{stripes * 4}I", data)
        for k in range(0, stripes * 4, 4):
            v1 = (_rotl((v1 + words[k] * _P2) & _M32, 13) * _P1) & _M32
            v2 = (_rotl((v2 + words[k + 1] * _P2) & _M32, 13) * _P1) & _M32
            v3 = (_rotl((v3 + words[k + 2] * _P2) & _M32, 13) * _P1) & _M32
            v4 = (_rotl((v4 + words[k + 3] * _P2) & _M32, 13) * _P1) & _M32
        i = stripes * 16
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M32
    else:
        h = (seed + _P5) & _M32
    h = (h + n) & _M32
    while i + 4 <= n:
        (word,) = struct.unpack_from("<I", data, i)
        h = (_rotl((h + word * _P3) & _M32, 17) * _P4) & _M32
        i += 4
    while i < n:
        h = (_rotl((h + data[i] * _P5) & _M32, 11) * _P1) & _M32
        i += 1
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h


def normalize(text: str) -> str:
    """Drop a leading BOM; CRLF and lone CR become LF."""
    if text.startswith(BOM):
        text = text[1:]
    return text.replace("\r\n", "\n").replace("\r", "\n")


def compute_tag(normalized: str) -> str:
    """The four upper-case hex digit tag of already-normalized text."""
    hashing = _TRAILING_BLANKS.sub("", normalized)
    return f"{xxh32(hashing.encode('utf-8')) & 0xFFFF:04X}"


@dataclass(frozen=True, slots=True)
class TextFormat:
    """How the file was encoded on disk, so it is written back the same way."""

    bom: bool = False
    eol: Eol = "lf"

    def encode(self, normalized: str) -> bytes:
        body = normalized if self.eol == "lf" else normalized.replace("\n", _EOL_TEXT[self.eol])
        return ((BOM if self.bom else "") + body).encode("utf-8")


def detect_format(raw: str) -> TextFormat:
    """BOM presence and the dominant line ending (ties and no endings: LF)."""
    crlf = raw.count("\r\n")
    cr = raw.count("\r") - crlf
    lf = raw.count("\n") - crlf
    eol: Eol = "lf"
    if crlf > lf and crlf >= cr:
        eol = "crlf"
    elif cr > lf and cr > crlf:
        eol = "cr"
    return TextFormat(bom=raw.startswith(BOM), eol=eol)


def decode(data: bytes) -> tuple[str, TextFormat]:
    """UTF-8 bytes → (normalized text, original format); binary content is refused."""
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError:
        raise HashlineError("the file is not UTF-8 text; Hashline edits only text files",
                            code="not_text") from None
    if "\x00" in raw:
        raise HashlineError("the file contains NUL bytes (binary); Hashline edits only text "
                            "files", code="not_text")
    return normalize(raw), detect_format(raw)


@dataclass(frozen=True, slots=True)
class Lines:
    """Normalized text as addressable lines. The newline ending the file is not a line."""

    rows: tuple[str, ...]
    final_newline: bool

    @classmethod
    def of(cls, normalized: str) -> Lines:
        if normalized == "":
            return cls((), False)
        parts = normalized.split("\n")
        if parts[-1] == "":
            return cls(tuple(parts[:-1]), True)
        return cls(tuple(parts), False)

    def __len__(self) -> int:
        return len(self.rows)

    def text(self) -> str:
        return join_lines(self.rows, self.final_newline)


def join_lines(rows: Sequence[str], final_newline: bool) -> str:
    if not rows:
        return ""
    return "\n".join(rows) + ("\n" if final_newline else "")
