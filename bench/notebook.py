"""Notebook figures: the kernel probe and attaching a large notebook.

Prints one JSON line per figure (``"bench": "notebook"``, the figure under ``"figure"``):

* ``kernel_probe`` — ``inspect_notebook_kernel``'s probe (``notebooks/probe.py: run_probe``
  then ``fit``, as the service runs it) in a real ipykernel holding 50 DataFrames of 1,000
  rows x 12 columns, vs a bare silent empty ``execute_request`` round trip on the same kernel
  (baseline). ``bytes_raw`` is the probe's answer as the kernel sent it, ``bytes_returned``
  what the model gets after the fit (inside the pipeline's 16,000-character bound).
* ``attach_200_cells`` — attaching a 200-cell notebook (code and Markdown, stream, table and
  PNG outputs): the ContentsManager read, nbformat check, storing the version (SQLite, or
  PostgreSQL) and rendering its outline for the prompt, vs reading and ``json.loads`` of the
  same file (baseline). ``prompt_chars`` is the outline's length and ``prompt_tokens`` its
  estimate at four characters a token (KAIZEN_NOTEBOOK_CONTEXT_CHARS bounds it).

Usage: ``python bench/notebook.py [--db sqlite|postgresql|both] [--n N]``.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import emit, for_each_db, now_ns, parse_args, ratio, run_main, summary

from kaizen_server_extension.notebooks.document import (
    NOTEBOOK_MEDIA_TYPE,
    NotebookDocument,
    render_outline,
)
from kaizen_server_extension.notebooks.probe import ProbeLimits, fit, run_probe
from kaizen_server_extension.store import Store
from kaizen_server_extension.store.artifacts import ArtifactStore

BENCH = "notebook"
FRAMES = """
import numpy as np, pandas as pd
rng = np.random.default_rng(7)
for i in range(50):
    globals()[f"frame_{i:02d}"] = pd.DataFrame(
        rng.normal(size=(1000, 12)), columns=[f"col_{j}" for j in range(12)])
"""


async def _round_trip(client: Any, code: str) -> None:
    msg_id = client.execute(code, silent=True, store_history=False)
    while True:
        reply = await client.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            return


async def kernel_probe(n: int) -> None:
    from jupyter_client.manager import AsyncKernelManager

    manager = AsyncKernelManager(kernel_name="python3")
    await manager.start_kernel()
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        await _round_trip(client, FRAMES)
        await run_probe(client, ProbeLimits(), timeout_s=30)  # warm
        bare, probed = [], []
        raw_bytes = returned = 0
        for _ in range(n):
            start = now_ns()
            await _round_trip(client, "")
            bare.append(now_ns() - start)
            start = now_ns()
            answer = await run_probe(client, ProbeLimits(), timeout_s=30)
            result = fit(answer)
            probed.append(now_ns() - start)
            raw_bytes = len(json.dumps(answer))
            returned = len(json.dumps(result, ensure_ascii=False))
        base, measured = summary(bare), summary(probed)
        emit({"bench": BENCH, "figure": "kernel_probe", "db": "none", "frames": 50,
              "p50_ms": round(measured["p50_us"] / 1000, 2),
              "p95_ms": round(measured["p95_us"] / 1000, 2), **measured,
              "baseline_p50_us": base["p50_us"], "ratio": ratio(measured["p50_us"],
                                                                base["p50_us"]),
              "bytes_raw": raw_bytes, "bytes_returned": returned,
              "variables_listed": len(result["variables"]),
              "omitted": len(result.get("omitted", [])), "n": n})
    finally:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)


def big_notebook() -> dict[str, Any]:
    image = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 30_000).decode()
    cells: list[dict[str, Any]] = []
    for i in range(200):
        if i % 4 == 0:
            cells.append({"cell_type": "markdown", "id": f"m{i}", "metadata": {},
                          "source": f"## Step {i}\n\nWhy this step matters, in a sentence."})
            continue
        outputs: list[dict[str, Any]] = [
            {"output_type": "stream", "name": "stdout", "text": f"rows: {i * 100}\n" * 5}]
        if i % 4 == 2:
            outputs.append({"output_type": "display_data", "metadata": {},
                            "data": {"image/png": image, "text/plain": "<Figure>"}})
        if i % 4 == 3:
            outputs.append({"output_type": "execute_result", "execution_count": i,
                            "metadata": {}, "data": {
                                "text/plain": "\n".join(f"{r}  {r * 1.5:.2f}" for r in range(40)),
                                "text/html": "<table>" + "<tr><td>1</td></tr>" * 40}})
        source = "\n".join(f"value_{i}_{k} = compute({k}, window={i})" for k in range(12))
        cells.append({"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": source,
                      "execution_count": i, "outputs": outputs})
    return {"nbformat": 4, "nbformat_minor": 5, "cells": cells,
            "metadata": {"language_info": {"name": "python"}}}


async def attach(db: str, store: Store, n: int) -> None:
    from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

    with tempfile.TemporaryDirectory(prefix="kaizen-bench-nb-") as root:
        (Path(root) / "big.ipynb").write_text(json.dumps(big_notebook()))
        contents = AsyncLargeFileManager(root_dir=root)
        await store.members.ensure("bench")
        await store.agents.ensure_system_agent("general", "General", persona="p",
                                               mode="chat", tool_ceiling=())
        room = await store.conversations.create("bench", "general", "bench", False)
        artifacts = ArtifactStore(store)
        bare, attached = [], []
        outline = ""
        size = 0
        for _ in range(n):
            start = now_ns()
            json.loads((Path(root) / "big.ipynb").read_bytes())
            bare.append(now_ns() - start)
            start = now_ns()
            model = await contents.get("big.ipynb", content=True, type="file", format="text")
            raw = model["content"].encode("utf-8")
            doc = NotebookDocument.parse(raw)
            record, _reused = await artifacts.persist_file("bench", room.id, None,
                                                           "big.ipynb", raw,
                                                           NOTEBOOK_MEDIA_TYPE)
            outline = render_outline(doc, path="big.ipynb", reference=record.artifact_id,
                                     version=record.version)
            attached.append(now_ns() - start)
            size = len(raw)
        base, measured = summary(bare), summary(attached)
        emit({"bench": BENCH, "figure": "attach_200_cells", "db": db, "cells": 200,
              "notebook_bytes": size, "p50_ms": round(measured["p50_us"] / 1000, 2),
              "p95_ms": round(measured["p95_us"] / 1000, 2), **measured,
              "baseline_p50_us": base["p50_us"],
              "ratio": ratio(measured["p50_us"], base["p50_us"]),
              "prompt_chars": len(outline), "prompt_tokens": round(len(outline) / 4),
              "base64_in_prompt": "AAAA" in outline, "n": n})


async def main(args: argparse.Namespace) -> None:
    await kernel_probe(args.n)
    await for_each_db(BENCH, args, lambda db, store: attach(db, store, args.n))


if __name__ == "__main__":
    arguments = parse_args(__doc__ or BENCH, default_n=20)
    run_main(lambda: main(arguments))
