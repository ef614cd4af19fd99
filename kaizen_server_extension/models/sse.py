"""Minimal Server-Sent Events framing: yields each event's ``data`` payload."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable

DONE = "[DONE]"


async def iter_sse_data(lines: AsyncIterable[str]) -> AsyncGenerator[str, None]:
    """Join ``data:`` lines per event (blank line ends one); comments and other fields are
    ignored. A trailing event without its blank line is still delivered."""
    data: list[str] = []
    async for raw_line in lines:
        line = raw_line.rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)
