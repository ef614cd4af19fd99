"""Citation discipline, enforced before an answer is published (R-071).

Retrieval tools hand out citations whose targets are Kaizen references:
``kaizen:document/<id>/v<version>#chunk=<chunk id>`` (search, query_document) and
``kaizen:conversation/<id>#position=<n>`` (conversation_history_search). An answer may cite
only what this turn's own successful retrieval results carried in their ``citation`` fields:
the trusted host checks every such reference in the answer against them before the answer is
journaled. A reference the
turn's evidence does not hold — made up, remembered from another turn, or planted — is removed
from the published answer (its link text stays, marked), so a member never sees a citation
the backend could not trace to a retrieved source.

A Search-mode answer that rests on retrieved passages but cites none of them gets the
backend's list of what it retrieved (:func:`with_sources`): the answer always points at its
sources, whichever model wrote it (a small one seldom copies a citation).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

#: A Kaizen reference: the citation targets the retrieval tools produce.
REFERENCE = re.compile(r"kaizen:(?:document|conversation)/[A-Za-z0-9_.-]{1,128}"
                       r"(?:/v\d{1,10})?#(?:chunk=[0-9a-f]{32}|position=\d{1,19})")
#: A Markdown link or bare mention of one.
_LINK = re.compile(r"\[([^\]\n]{0,300})\]\((" + REFERENCE.pattern + r")\)|(" +
                   REFERENCE.pattern + r")")
UNVERIFIED = "[unverified citation removed]"


@dataclass(frozen=True, slots=True)
class CitationCheck:
    text: str
    verified: tuple[str, ...]
    removed: tuple[str, ...]


#: The tools whose results carry citations: their own ``citation`` fields, never the text
#: they quote, are the turn's citable sources. ``invoke_agent`` lists only the citations its
#: child's own retrieval verified (host/delegation.py), so a delegated source stays traceable.
CITING_TOOLS = frozenset({"search", "query_document", "conversation_history_search",
                          "invoke_agent"})


def evidence_references(results: Iterable[tuple[str, str]]) -> frozenset[str]:
    """Every Kaizen reference in a ``citation`` field of this turn's successful results of the
    citing tools, given as (tool name, content). A reference inside a quoted passage (a
    document can contain any text, a forged reference included) is not evidence of itself."""
    found: set[str] = set()
    for body in _citing_bodies(results):
        found.update(ref for value in _citations(body) for ref in REFERENCE.findall(value))
    return frozenset(found)


def _citing_bodies(results: Iterable[tuple[str, str]]) -> Iterator[Any]:
    """The parsed results of the citing tools among (tool name, content)."""
    for name, content in results:
        if name not in CITING_TOOLS:
            continue
        try:
            yield json.loads(content)
        except ValueError:
            continue


def _citations(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "citation" and isinstance(item, str):
                yield item
            else:
                yield from _citations(item)
    elif isinstance(value, list):
        for item in value:
            yield from _citations(item)


def check_citations(answer: str, evidence: frozenset[str]) -> CitationCheck:
    """``answer`` with every Kaizen reference not in ``evidence`` removed."""
    verified: list[str] = []
    removed: list[str] = []

    def replace(match: re.Match[str]) -> str:
        label, linked, bare = match.group(1), match.group(2), match.group(3)
        reference = linked or bare
        if reference in evidence:
            if reference not in verified:
                verified.append(reference)
            return match.group(0)
        removed.append(reference)
        return f"{label} {UNVERIFIED}" if linked and label else UNVERIFIED

    text = _LINK.sub(replace, answer)
    return CitationCheck(text, tuple(verified), tuple(removed))


#: At most this many sources are listed under an answer that cited none.
MAX_LISTED_SOURCES = 3


def retrieved_sources(results: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(label, citation) of the passages this turn's citing tools retrieved, in the order the
    tools ranked them, one per document version or conversation."""
    sources: list[tuple[str, str]] = []
    seen: set[str] = set()
    for body in _citing_bodies(results):
        for item in _cited_items(body):
            citation = item["citation"]
            references = REFERENCE.findall(citation)
            if len(references) != 1:
                continue
            source = references[0].partition("#")[0]
            if source in seen:
                continue
            seen.add(source)
            # The tool's own Markdown citation names its source best ("[t, v1, lines 1-2](…)").
            linked = _LINK.fullmatch(citation.strip())
            if linked and linked.group(1):
                label = linked.group(1)
            else:
                title = str(item.get("title") or "source").strip()[:120]
                locator = str(item.get("locator") or "").strip()[:80]
                label = f"{title} ({locator})" if locator else title
            sources.append((label, references[0]))
    return sources


def _cited_items(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        if isinstance(value.get("citation"), str):
            yield value
        for item in value.values():
            yield from _cited_items(item)
    elif isinstance(value, list):
        for item in value:
            yield from _cited_items(item)


def with_sources(answer: str, sources: list[tuple[str, str]]) -> tuple[str, int]:
    """``answer`` and, when it cites nothing, the list of up to ``MAX_LISTED_SOURCES``
    retrieved ``sources`` under it; with how many were listed."""
    if not sources or REFERENCE.search(answer):
        return answer, 0
    listed = sources[:MAX_LISTED_SOURCES]
    links = "; ".join(f"[{label.replace(']', ')')}]({citation})" for label, citation in listed)
    return f"{answer.rstrip()}\n\nSources: {links}", len(listed)
