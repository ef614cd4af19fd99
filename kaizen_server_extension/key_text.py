"""Keys given as text in settings: URL-safe base64, padding optional, of an exact length."""

from __future__ import annotations

import base64
import binascii


def decode_key(text: str, size: int, what: str = "") -> bytes:
    """The ``size`` bytes a key's text decodes to; otherwise ``ValueError`` saying what is
    wrong (``what`` names the key's kind in that message), never repeating the text."""
    raw = text.strip()
    try:
        key = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("is not URL-safe base64") from None
    if len(key) != size:
        kind = f" ({what})" if what else ""
        raise ValueError(f"must decode to {size} bytes{kind}, not {len(key)}")
    return key
