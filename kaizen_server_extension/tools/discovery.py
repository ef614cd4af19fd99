"""``tool_search``: what the agent may use, found by BM25 over the run's frozen catalog.

Discovery reports; it never grants (R-296). The index is built from the frozen catalog only, so
a tool outside it cannot be found, and a deferred match is merely *announced* as callable from
the next step (it was authorized when the catalog froze). An already-callable match is still
reported, so searching twice is harmless (R-297). The surfaces view lists at most eight parents
with counts and effects, never operation names or schemas (R-324).

The index is built once per catalog and cached by the catalog's digest.
"""

from __future__ import annotations

import re
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.tools.catalog import TOOL_SEARCH_NAME, FrozenCatalog
from kaizen_server_extension.tools.decorators import tool
from kaizen_server_extension.tools.hookspecs import ToolRegistrar, hookimpl
from kaizen_server_extension.tools.types import RoomClass, ToolContext

if TYPE_CHECKING:
    from rank_bm25 import BM25Okapi

MAX_PARENTS = 8
MAX_MATCHES = 8
_CACHE_SIZE = 64

_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lowercase alphanumeric words, ``snake_case`` and ``kebab-case`` split, plurals folded
    (so "agents" finds ``list_available_agents``)."""
    words = _TOKEN.findall(text.lower().replace("_", " "))
    return [w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
            for w in words]


@dataclass(frozen=True)
class _Index:
    names: tuple[str, ...]
    bm25: BM25Okapi | None
    docs: tuple[frozenset[str], ...]
    parents: tuple[str, ...]
    parent_bm25: BM25Okapi | None
    parent_docs: tuple[frozenset[str], ...]


_indexes: OrderedDict[str, _Index] = OrderedDict()


def _bm25(corpus: list[list[str]]) -> BM25Okapi | None:
    # rank_bm25 divides by the corpus size; an empty catalog has nothing to rank.
    if not corpus or not any(corpus):
        return None
    # Imported on the first search, not at start-up: it brings numpy (tests/test_lazy_imports).
    from rank_bm25 import BM25Okapi

    return BM25Okapi(corpus)


def index_for(catalog: FrozenCatalog) -> _Index:
    """The catalog's search index, built on first use and kept by digest."""
    cached = _indexes.get(catalog.digest)
    if cached is not None:
        _indexes.move_to_end(catalog.digest)
        return cached
    names = tuple(n for n in sorted(catalog.descriptors) if n != TOOL_SEARCH_NAME)
    corpus = [tokenize(n) + tokenize(catalog.descriptors[n].description) for n in names]
    # Parent documents are separate: a surface's words do not leak into operation postings.
    by_parent: dict[str, list[str]] = defaultdict(list)
    for n in names:
        d = catalog.descriptors[n]
        by_parent[d.surface].extend(tokenize(d.surface) + tokenize(d.description))
    parents = tuple(sorted(by_parent))
    parent_corpus = [by_parent[p] for p in parents]
    built = _Index(
        names=names,
        bm25=_bm25(corpus),
        docs=tuple(frozenset(doc) for doc in corpus),
        parents=parents,
        parent_bm25=_bm25(parent_corpus),
        parent_docs=tuple(frozenset(doc) for doc in parent_corpus),
    )
    _indexes[catalog.digest] = built
    if len(_indexes) > _CACHE_SIZE:
        _indexes.popitem(last=False)
    return built


def _rank(
    bm25: BM25Okapi | None, docs: Iterable[frozenset[str]], keys: tuple[str, ...], query: str
) -> list[str]:
    terms = tokenize(query)
    if bm25 is None or not terms:
        return []
    scores = bm25.get_scores(terms)
    # BM25's idf floor can score a document with no query term above zero in a tiny corpus,
    # so a match must share at least one term.
    hits = [(-float(scores[i]), keys[i]) for i, doc in enumerate(docs) if doc & set(terms)]
    return [key for _, key in sorted(hits)]


#: Verbs of a request that builds or changes something (R-333). Words are compared after
#: :func:`words` (lower case, camelCase and snake_case split, plurals folded).
CONSTRUCTIVE_VERBS = frozenset({
    "create", "configure", "config", "setup", "set", "update", "add", "connect", "enable",
    "install", "register", "new", "make", "build", "edit", "change", "modify", "patch",
    "upsert", "provision", "attach", "write", "save", "insert", "rename"})
#: Verbs of an operation, or a request, that destroys, detaches or withdraws something.
DESTRUCTIVE_VERBS = frozenset({
    "delete", "remove", "disconnect", "destroy", "drop", "purge", "revoke", "uninstall",
    "erase", "wipe", "detach", "unregister", "unlink", "disable", "deactivate", "terminate",
    "truncate", "clear", "reset", "kill", "cancel", "archive", "del", "rm"})


def words(text: str) -> set[str]:
    """:func:`tokenize` after splitting camelCase (``deleteItem`` is *delete item*)."""
    return set(tokenize(re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text)))


def constructive_only(query: str) -> bool:
    """Whether ``query`` asks to build or change something and names no destructive action:
    then destructive operations are not what it asks for (R-333)."""
    asked = words(query)
    return bool(asked & CONSTRUCTIVE_VERBS) and not asked & DESTRUCTIVE_VERBS


def destructive(catalog: FrozenCatalog, name: str) -> bool:
    """A sensitive operation, or one whose own name is a destructive verb (a ``disconnect``
    sent as a POST is still one). Its name can only make it *more* withheld here, never a
    safer effect class (R-341)."""
    descriptor = catalog.descriptors[name]
    operation = str(descriptor.extra.get("mcp_tool") or descriptor.extra.get(
        "openapi_operation") or name)
    return descriptor.capability is Capability.SENSITIVE or bool(
        words(operation) & DESTRUCTIVE_VERBS)


def search_tools(catalog: FrozenCatalog, query: str, *, limit: int = MAX_MATCHES,
                 callable_now: Iterable[str] | None = None) -> dict[str, Any]:
    """The tools view: exact authorized tools matching ``query``.

    ``callable_now`` is the set currently advertised (default: the catalog's direct set).
    Returns ``matches`` (name, description, capability, ``callable`` now or ``next_step``, and
    the advertised parameters of a deferred match) and ``newly_callable``: the deferred matches
    the runtime may advertise from the next step.

    A constructive query (create, configure, update…) that names no destructive action gets
    no destructive operation (delete, disconnect…), however well it matches the words the
    operations share with their parent: supporting reads and the writes stay (R-333). The
    count withheld is reported, so the agent can search for the destructive action itself.
    """
    index = index_for(catalog)
    direct = set(callable_now) if callable_now is not None else {
        a.name for a in catalog.advertised
    }
    matches: list[dict[str, Any]] = []
    newly: list[str] = []
    ranked = _rank(index.bm25, index.docs, index.names, query)
    withheld = 0
    if ranked and constructive_only(query):
        kept = [name for name in ranked if not destructive(catalog, name)]
        withheld, ranked = len(ranked) - len(kept), kept
    for name in ranked[:max(0, limit)]:
        advertised = catalog.projected[name]
        entry: dict[str, Any] = {
            "name": name,
            "description": advertised.description,
            "capability": advertised.capability.value,
        }
        if name in direct:
            entry["callable"] = "now"
        else:
            entry["callable"] = "next_step"
            entry["parameters"] = advertised.parameters
            newly.append(name)
        matches.append(entry)
    # A protocol becomes callable whole or not at all: a deferred match brings the
    # other members of its group with it.
    for name in list(newly):
        for member in catalog.protocol_of(name):
            if member not in direct and member not in newly:
                newly.append(member)
    found: dict[str, Any] = {"view": "tools", "matches": matches, "newly_callable": newly}
    if withheld:
        found["destructive_withheld"] = withheld
    return found


def search_surfaces(catalog: FrozenCatalog, query: str = "") -> dict[str, Any]:
    """The surfaces view: at most :data:`MAX_PARENTS` parents with tool counts and effects."""
    index = index_for(catalog)
    ranked = _rank(index.parent_bm25, index.parent_docs, index.parents, query) if query \
        else list(index.parents)
    surfaces = []
    for parent in ranked[:MAX_PARENTS]:
        members = [catalog.descriptors[n] for n in index.names
                   if catalog.descriptors[n].surface == parent]
        surfaces.append({
            "surface": parent,
            "tools": len(members),
            "effects": sorted({d.capability.value for d in members}),
        })
    return {"view": "surfaces", "surfaces": surfaces}


@tool(
    name=TOOL_SEARCH_NAME,
    capability=Capability.READ,
    timeout_s=5,
    room_class=RoomClass.AUDIENCE_SAFE_READ,
    surface="discovery",
)
async def tool_search(
    ctx: ToolContext,
    query: Annotated[str, Field(max_length=500, description="What you want to do.")] = "",
    view: Annotated[
        Literal["tools", "surfaces"],
        Field(description="'tools' for callable tools, 'surfaces' for an overview."),
    ] = "tools",
) -> dict[str, Any]:
    """Search the tools available to you in this conversation. Matching tools that are not
    callable yet become callable from your next step. Use view='surfaces' for an overview."""
    catalog = ctx.services.catalog
    if not isinstance(catalog, FrozenCatalog):
        raise MemberSafeError("Tool search is unavailable in this turn.", code="no_catalog")
    if view == "surfaces":
        return search_surfaces(catalog, query)
    callable_now = ctx.services.callable_tools
    return search_tools(catalog, query, callable_now=callable_now)


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(tool_search)
