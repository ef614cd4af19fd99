"""Document ``search`` over 10,000 indexed passages, and indexing throughput.

A fresh store per database gets ``--chunks`` passages (default 10,000): ``--docs`` documents
(default 100) of generated text (4,000 words drawn by a Zipf law, seeded RNG; queries of 1-3
words of middle frequency), one passage per line,
uploaded through ``DocumentStore.upload`` (extraction, chunking, the rows, and the database's
own full-text index: SQLite FTS5 kept by triggers, PostgreSQL a generated tsvector with GIN).

Figures (``figure`` key), one line per database:

* ``index``: passages indexed per second through ``upload``; the baseline is inserting the same
  passage rows (same bodies, one transaction per document) into a plain table with no index,
  in the same run; ``ratio`` is baseline throughput / ours (how many times slower).
* ``search``: ``DocumentStore.search(member, query)`` p50/p95, with its access check (the
  member's own and room-shared documents, current versions only) in the statement; the
  baseline is the bare full-text query on the same data (MATCH ... ORDER BY bm25, or @@ ...
  ORDER BY ts_rank_cd, LIMIT 8) without it. Targets: p50 within 20 ms on SQLite and 30 ms on
  PostgreSQL (``target_p50_us``, ``meets_target``).

    .venv/bin/python bench/search.py [--db sqlite|postgresql|both] [--n 300] [--chunks 10000]
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from typing import Any

from benchkit import emit, for_each_db, now_ns, parse_args, percentile, ratio, run_main, summary, us
from sqlalchemy import text

from kaizen_server_extension.document_text import postgresql_query, query_terms, sqlite_match
from kaizen_server_extension.store import Store
from kaizen_server_extension.store.documents import DocumentStore

BENCH = "search"
TARGET_P50_US = {"sqlite": 20_000.0, "postgresql": 30_000.0}
MEMBER = "bench-member"
SYLLABLES = ("ka", "ri", "zen", "mo", "ta", "lu", "pe", "so", "vi", "na", "do", "qu", "xe",
             "bra", "tor", "mil", "gan", "fey", "hul", "ost")
#: Distinct words of the generated text; they are drawn by a Zipf law (rank r with weight
#: 1/r), as words of real prose are, so a common word is in most passages and a rare one in
#: few. Queries take words from the middle ranks.
VOCABULARY = 4_000
QUERY_RANKS = (20, 1_000)


def _vocabulary() -> list[str]:
    words: list[str] = []
    for a in SYLLABLES:
        for b in SYLLABLES:
            for c in SYLLABLES:
                words.append(a + b + c)
    return words[:VOCABULARY]


WORDS = _vocabulary()
_CUMULATIVE = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(WORDS))))


def extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunks", type=int, default=10_000, help="passages to index")
    parser.add_argument("--docs", type=int, default=100, help="documents they are split into")
    parser.add_argument("--seed", type=int, default=11)


def _line(rng: random.Random, chars: int = 700) -> str:
    words = rng.choices(WORDS, cum_weights=_CUMULATIVE, k=chars // 8)
    return " ".join(words)[:chars]


def _corpus(chunks: int, docs: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    per_doc = max(1, chunks // docs)
    out = [[_line(rng) for _ in range(per_doc)] for _ in range(chunks // per_doc)]
    return out


def _queries(n: int, seed: int) -> list[str]:
    rng = random.Random(seed + 1)
    middle = WORDS[QUERY_RANKS[0]:QUERY_RANKS[1]]
    return [" ".join(rng.sample(middle, rng.randint(1, 3))) for _ in range(max(n, 50))]


async def _bare_index(store: Store, db: str, corpus: list[list[str]]) -> float:
    """Seconds to insert the same passage rows into a plain, unindexed table."""
    serial = "INTEGER PRIMARY KEY" if db == "sqlite" else "BIGSERIAL PRIMARY KEY"
    async with store.transaction() as tx:
        await tx.session.execute(text(f"CREATE TABLE bench_plain (id {serial}, "
                                      "document_id TEXT, ordinal INTEGER, body TEXT)"))
    start = time.perf_counter()
    for d, lines in enumerate(corpus):
        async with store.transaction() as tx:
            await tx.session.execute(
                text("INSERT INTO bench_plain (document_id, ordinal, body) VALUES (:d, :o, :b)"),
                [{"d": str(d), "o": o, "b": body} for o, body in enumerate(lines)])
    return time.perf_counter() - start


def _bare_search(db: str, query: str) -> tuple[Any, dict[str, Any]]:
    terms = query_terms(query)
    if db == "sqlite":
        return text("SELECT rowid FROM document_chunks_fts WHERE document_chunks_fts MATCH :q "
                    "ORDER BY bm25(document_chunks_fts) LIMIT 8"), {"q": sqlite_match(terms)}
    return text("SELECT id FROM document_chunks, websearch_to_tsquery('english', :q) query "
                "WHERE search_vector @@ query ORDER BY ts_rank_cd(search_vector, query) DESC "
                "LIMIT 8"), {"q": postgresql_query(terms)}


async def run(db: str, store: Store, args: argparse.Namespace) -> None:
    await store.members.ensure(MEMBER)
    documents = DocumentStore(store)
    corpus = _corpus(args.chunks, args.docs, args.seed)
    total = sum(len(lines) for lines in corpus)
    start = time.perf_counter()
    for d, lines in enumerate(corpus):
        await documents.upload(MEMBER, f"doc-{d}.txt", "\n".join(lines).encode())
    ours_s = time.perf_counter() - start
    bare_s = await _bare_index(store, db, corpus)
    if db == "postgresql":  # what autovacuum does after a bulk load, done now, not eventually
        async with store.transaction() as tx:
            await tx.session.execute(text("ANALYZE"))
    indexed = (await documents.search(MEMBER, WORDS[0])).searched
    emit({"bench": BENCH, "db": db, "figure": "index", "chunks": total, "documents": indexed,
          "chunks_per_s": round(total / ours_s, 1),
          "baseline_chunks_per_s": round(total / bare_s, 1),
          "ratio": ratio(ours_s, bare_s), "elapsed_s": round(ours_s, 2), "n": total})

    queries = _queries(args.n, args.seed)
    for query in queries[:30]:  # warm-up: caches, statement compilation
        await documents.search(MEMBER, query)
    ours: list[int] = []
    base: list[int] = []
    hits = 0
    for i in range(args.n):
        query = queries[i % len(queries)]
        statement, params = _bare_search(db, query)
        started = now_ns()
        async with store.transaction() as tx:
            await tx.session.execute(statement, params)
        base.append(now_ns() - started)
        started = now_ns()
        result = await documents.search(MEMBER, query)
        ours.append(now_ns() - started)
        hits += bool(result.hits)
    figures = summary(ours)
    base_p50 = percentile(base, 50)
    emit({"bench": BENCH, "db": db, "figure": "search", "chunks": total, **figures,
          "baseline_p50_us": us(base_p50), "ratio": ratio(figures["p50_us"], base_p50),
          "target_p50_us": TARGET_P50_US[db],
          "meets_target": figures["p50_us"] <= TARGET_P50_US[db],
          "queries_with_hits": round(hits / args.n, 3), "n": args.n})


def main() -> None:
    args = parse_args(__doc__ or BENCH, default_n=300, extra=extra)

    async def body(db: str, store: Store) -> None:
        await run(db, store, args)

    run_main(lambda: for_each_db(BENCH, args, body))


if __name__ == "__main__":
    main()
