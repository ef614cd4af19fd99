"""``search_about``: answers about Kaizen itself from its own documentation.

The corpus is the project's ``docs/`` folder as this installation ships it: the wheel carries a
copy as ``kaizen_plugins/about_docs`` (pyproject.toml, ``force-include``); a source checkout
reads ``docs/`` beside the package. It is read once at import and ranked with BM25
(rank-bm25) over its Markdown sections. The tool takes only a query: it has no database,
network, identity argument or mutation, so it answers every member alike and is safe in any
room (R-182).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from kaizen_server_extension.policy.redaction import redact_text
from kaizen_server_extension.tools import Capability, RoomClass, ToolContext, hookimpl, tool
from kaizen_server_extension.tools.hookspecs import ToolRegistrar

MAX_RESULTS = 5
MAX_EXCERPT_CHARS = 600
_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_WORD = re.compile(r"\w+")


@dataclass(frozen=True, slots=True)
class Section:
    path: str
    heading: str
    text: str


def docs_folder() -> Path | None:
    """The bundled copy in an installed wheel, else the checkout's ``docs/``."""
    bundled = resources.files(__package__) / "about_docs"
    if bundled.is_dir():
        return Path(str(bundled))
    checkout = Path(__file__).resolve().parents[2] / "docs"
    return checkout if checkout.is_dir() else None


def _sections(folder: Path) -> list[Section]:
    out: list[Section] = []
    for file in sorted(folder.rglob("*.md")):
        path = "/docs/" + file.relative_to(folder).as_posix()
        heading, lines = "", list[str]()
        for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
            match = _HEADING.match(line)
            if match:
                if "".join(lines).strip():
                    out.append(Section(path, heading, "\n".join(lines).strip()))
                heading, lines = match.group(2).strip(), []
            else:
                lines.append(line)
        if "".join(lines).strip():
            out.append(Section(path, heading, "\n".join(lines).strip()))
    return out


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


_FOLDER = docs_folder()
SECTIONS: tuple[Section, ...] = tuple(_sections(_FOLDER)) if _FOLDER else ()


@cache
def _index() -> Any:
    """The docs' BM25 index, built on the first search (rank_bm25 brings numpy, which start-up
    does not load: tests/test_lazy_imports.py)."""
    if not SECTIONS:
        return None
    from rank_bm25 import BM25Okapi

    return BM25Okapi([_words(f"{s.heading} {s.path} {s.text}") for s in SECTIONS])


def search_docs(query: str, limit: int = MAX_RESULTS) -> list[dict[str, Any]]:
    terms = _words(query)
    index = _index()
    if index is None or not terms:
        return []
    scores = index.get_scores(terms)
    ranked = sorted(range(len(SECTIONS)), key=lambda i: (-scores[i], i))
    # Redacted before it is cut, as every tool result is after: the bound then holds for
    # what the model reads (a redaction can be longer than the text it hides).
    return [{"path": SECTIONS[i].path, "heading": SECTIONS[i].heading,
             "excerpt": redact_text(SECTIONS[i].text)[:MAX_EXCERPT_CHARS],
             "score": round(float(scores[i]), 4)}
            for i in ranked[:limit] if scores[i] > 0]


@tool(name="search_about", capability=Capability.READ, timeout_s=5,
      room_class=RoomClass.AUDIENCE_SAFE_READ, surface="about")
async def search_about(ctx: ToolContext, query: Annotated[str, Field(
        min_length=1, max_length=300, description="What to find in Kaizen's documentation."
        )]) -> dict[str, Any]:
    """Search Kaizen's own documentation (how to use this product). Returns short excerpts
    with their /docs paths; cite the path."""
    results = search_docs(query)
    return {"query": query, "results": results,
            **({} if results else {"note": "The documentation does not cover this."})}


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(search_about)
