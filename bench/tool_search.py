"""``tool_search`` latency over a generated catalog of 5,000 tools, plus index build time.

The catalog is generated from a small vocabulary with a seeded RNG (surface, verb, object,
qualifier; descriptions from a few templates), frozen with ``freeze_catalog`` with discovery
on, so every generated tool is deferred behind ``tool_search`` as a package tool would be.
Queries are 1-4 vocabulary words with some filler, as a model would phrase them.

Figures (``figure`` key):

* ``query``: ``search_tools(catalog, query)`` per query, p50/p95; target p50 within 5 ms.
  The baseline is a plain substring scan over the tool names (every query word in the name);
* ``index_build``: building the BM25 index of the frozen catalog (``index_for``), per build;
  ``freeze_ms`` is the one ``freeze_catalog`` call that made the catalog.

No database is involved; ``--db`` is accepted for a uniform command line and ignored.

    .venv/bin/python bench/tool_search.py [--n N] [--tools 5000] [--seed 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
from typing import Any

from benchkit import emit, now_ns, parse_args, percentile, ratio, summary, us

from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.tools import discovery
from kaizen_server_extension.tools.catalog import TOOL_SEARCH_NAME, FrozenCatalog, freeze_catalog
from kaizen_server_extension.tools.discovery import index_for, search_tools, tokenize
from kaizen_server_extension.tools.types import RoomClass, ToolDescriptor

BENCH = "tool_search"
TARGET_QUERY_P50_US = 5000.0
INDEX_BUILDS = 3

SURFACES = ("billing", "crm", "support", "analytics", "storage", "github", "jira", "slack",
            "calendar", "email", "warehouse", "notebooks", "kernels", "datasets", "metrics",
            "alerts", "deployments", "inventory", "payroll", "marketing")
READ_VERBS = ("list", "get", "search", "count", "describe", "export", "summarize", "find")
WRITE_VERBS = ("create", "update", "delete", "archive", "import", "sync", "assign", "close")
OBJECTS = ("invoice", "customer", "order", "ticket", "dataset", "notebook", "kernel", "report",
           "dashboard", "pipeline", "model", "user", "team", "project", "repository", "issue",
           "comment", "file", "bucket", "table", "query", "metric", "alert", "incident",
           "deployment", "event", "message", "channel", "contact", "campaign")
QUALIFIERS = ("", "", "", "by_id", "by_owner", "history", "summary", "batch", "recent",
              "details", "permissions", "tags")
TEMPLATES = (
    "{Verb} {object}s in {surface}{qual}. Returns {fields} for each match.",
    "{Verb} a {object} in the {surface} workspace{qual}; {fields} are included.",
    "Use this to {verb} {surface} {object}s{qual}. Results are paginated and sorted by date.",
    "{Verb} {object} records from {surface}{qual}, filtered by owner, status or date range.",
)
FIELDS = ("ids and names", "status and owner", "timestamps and totals", "links and labels",
          "counts per day", "the last modifier")
FILLER = ("please", "the", "all", "my", "for", "from", "this", "week", "open", "new")


def generate_catalog(tools: int, seed: int) -> list[ToolDescriptor]:
    rng = random.Random(seed)
    names: set[str] = set()
    descriptors: list[ToolDescriptor] = []
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"id": {"type": "string", "maxLength": 200},
                       "limit": {"type": "integer", "minimum": 1, "maximum": 500}},
        "additionalProperties": False,
    }
    capacity = len(SURFACES) * (len(READ_VERBS) + len(WRITE_VERBS)) * len(OBJECTS) \
        * len(set(QUALIFIERS))
    if tools > capacity:
        raise SystemExit(f"--tools must be at most {capacity}")
    while len(descriptors) < tools:
        surface = rng.choice(SURFACES)
        write = rng.random() < 0.3
        verb = rng.choice(WRITE_VERBS if write else READ_VERBS)
        obj = rng.choice(OBJECTS)
        qual = rng.choice(QUALIFIERS)
        name = "_".join(p for p in (surface, verb, obj, qual) if p)
        if name in names:
            continue
        names.add(name)
        description = rng.choice(TEMPLATES).format(
            Verb=verb.capitalize(), verb=verb, object=obj, surface=surface,
            qual=f" ({qual.replace('_', ' ')})" if qual else "", fields=rng.choice(FIELDS))
        descriptors.append(ToolDescriptor(
            name=name, description=description, input_schema=schema,
            capability=Capability.WRITE if write else Capability.READ,
            room_class=RoomClass.ACTOR_BOUND_READ, surface=surface, timeout_s=10,
        ))
    return descriptors


def generate_queries(count: int, seed: int) -> list[str]:
    rng = random.Random(seed + 1)
    vocabulary = (*SURFACES, *READ_VERBS, *WRITE_VERBS, *OBJECTS, "summary", "history")
    queries = []
    for _ in range(count):
        words = rng.sample(vocabulary, rng.randint(1, 3))
        if rng.random() < 0.4:
            words.insert(rng.randrange(len(words) + 1), rng.choice(FILLER))
        queries.append(" ".join(words))
    return queries


def substring_scan(names: tuple[str, ...], query: str) -> list[str]:
    """The baseline: every query word as a substring of the name, nothing ranked."""
    words = query.lower().split()
    return [n for n in names if all(w in n for w in words)]


def build_catalog(tools: int, seed: int) -> tuple[FrozenCatalog, float]:
    descriptors = [*generate_catalog(tools, seed), discovery.tool_search.descriptor]
    start = now_ns()
    catalog = freeze_catalog(descriptors, agent_ceiling=None, room_shared=False,
                             roster_is_only_initiator=True, discovery_enabled=True)
    return catalog, (now_ns() - start) / 1e6


def measure_build(catalog: FrozenCatalog) -> list[int]:
    samples = []
    for _ in range(INDEX_BUILDS):
        # The index is cached by digest; drop it so each build is a cold one.
        discovery._indexes.pop(catalog.digest, None)
        start = now_ns()
        index_for(catalog)
        samples.append(now_ns() - start)
    return samples


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tools", type=int, default=5000, help="catalog size (default 5000)")
    parser.add_argument("--seed", type=int, default=7, help="RNG seed (default 7)")


def main() -> None:
    args = parse_args(__doc__ or BENCH, default_n=2000, extra=_extra)
    catalog, freeze_ms = build_catalog(args.tools, args.seed)
    builds = measure_build(catalog)
    emit({"bench": BENCH, "db": "none", "figure": "index_build", "tools": len(catalog.deferred),
          "build_ms": round(statistics.median(builds) / 1e6, 2),
          "freeze_ms": round(freeze_ms, 2), "n": len(builds)})

    queries = generate_queries(min(args.n, 500), args.seed)
    names = tuple(n for n in catalog.names if n != TOOL_SEARCH_NAME)
    # A query that finds nothing would flatter the figure: count how many do.
    hits = 0
    for query in queries[:50]:
        search_tools(catalog, query)  # warm-up
        substring_scan(names, query)
    base: list[int] = []
    samples: list[int] = []
    for i in range(args.n):
        query = queries[i % len(queries)]
        start = now_ns()
        substring_scan(names, query)
        base.append(now_ns() - start)
        start = now_ns()
        found = search_tools(catalog, query)
        samples.append(now_ns() - start)
        hits += bool(found["matches"])
    base_p50 = percentile(base, 50)
    figures = summary(samples)
    emit({"bench": BENCH, "db": "none", "figure": "query", "tools": len(names), **figures,
          "baseline_p50_us": us(base_p50), "ratio": ratio(figures["p50_us"], base_p50),
          "target_p50_us": TARGET_QUERY_P50_US,
          "meets_target": figures["p50_us"] <= TARGET_QUERY_P50_US,
          "queries_with_matches": round(hits / args.n, 3),
          "mean_query_terms": round(statistics.mean(len(tokenize(q)) for q in queries), 2),
          "n": args.n})


if __name__ == "__main__":
    main()
