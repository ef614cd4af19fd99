"""The notebook rendering rules, without a server: bounded outlines, notes for images and
rich outputs (never their bytes), fingerprints that ignore outputs, and the probe's fit."""

from __future__ import annotations

import json

import pytest

from kaizen_server_extension.notebooks.document import (
    NotebookDocument,
    NotebookFormatError,
    render_outline,
    summarise_output,
)
from kaizen_server_extension.notebooks.probe import ProbeFailed, fit, parse_reply
from tests.notebook.support import code, markdown, notebook, png


def _doc(cells: list[dict[str, object]]) -> NotebookDocument:
    return NotebookDocument.parse(json.dumps(notebook(cells)))


def test_an_image_output_is_a_note_with_its_size_never_base64() -> None:
    image = png(300, 200)
    text = summarise_output({"output_type": "display_data", "metadata": {},
                             "data": {"image/png": image, "text/plain": "<Figure>"}})
    assert "[image/png image, 300x200 px" in text and image[:30] not in text
    html = summarise_output({"output_type": "execute_result", "metadata": {},
                             "data": {"text/html": "<table>" + "x" * 9000}})
    assert html.startswith("result: [text/html output, 8.8 KB; not shown]")
    error = summarise_output({"output_type": "error", "ename": "KeyError", "evalue": "'a'",
                              "traceback": ["\x1b[31mline 1\x1b[0m", "line 2"]})
    assert error == "error: KeyError: 'a'\nline 1\nline 2"


def test_the_outline_shrinks_every_cell_alike_to_fit_its_budget() -> None:
    cells = [code(f"c{i}", "\n".join(f"line {j} of cell {i}" for j in range(30)))
             for i in range(200)]
    doc = _doc(cells)
    full = render_outline(doc, path="big.ipynb", reference="a1", version=1, budget=400_000)
    assert "line 29 of cell 199" in full and "sources are complete" in full
    small = render_outline(doc, path="big.ipynb", reference="a1", version=1, budget=16_000)
    assert len(small) <= 16_000
    assert "[199] code id=c199" in small  # every cell's header is still there
    assert "line 29 of cell 0" not in small and "read_notebook" in small
    tiny = render_outline(doc, path="big.ipynb", reference="a1", version=1, budget=1000)
    assert len(tiny) <= 1000 and "read_notebook(start=" in tiny


def test_the_fingerprint_is_cell_ids_and_sources_not_outputs() -> None:
    base = _doc([code("a", "x = 1", count=1)])
    rerun = _doc([code("a", "x = 1", count=5, outputs=[
        {"output_type": "stream", "name": "stdout", "text": "hi"}])])
    edited = _doc([code("a", "x = 2")])
    moved = _doc([markdown("b", "# t"), code("a", "x = 1")])
    assert base.fingerprint() == rerun.fingerprint()
    assert base.fingerprint() != edited.fingerprint() != moved.fingerprint()


@pytest.mark.parametrize("raw", ["{", "[]", '{"cells": [], "nbformat": 3}',
                                 json.dumps(notebook([code("a", ""), code("a", "")])),
                                 json.dumps(notebook([{"cell_type": "weird", "source": ""}]))])
def test_what_is_not_an_nbformat_4_notebook_is_refused(raw: str) -> None:
    with pytest.raises(NotebookFormatError):
        NotebookDocument.parse(raw)


def test_a_large_probe_answer_is_shrunk_to_its_budget_and_says_what_it_left_out() -> None:
    frame = {"name": "df", "type": "pandas.DataFrame", "shape": [5, 60],
             "columns": [{"name": f"col{i}", "dtype": "float64"} for i in range(60)],
             "head": [{f"col{i}": 1.5 for i in range(60)} for _ in range(5)]}
    result = {"variables": [{**frame, "name": f"df{n}"} for n in range(50)], "modules": [],
              "callables": [], "truncated": False}
    counted = fit(result, 14_000)
    assert len(json.dumps(counted)) <= 14_000 and "omitted" not in counted
    assert counted["shortened"][-1] == "columns counted only"
    assert counted["variables"][0]["column_count"] == 60
    fitted = fit(result, 3_000)
    assert len(json.dumps(fitted)) <= 3_000
    assert fitted["truncated"] is True and fitted["omitted"]
    assert "head rows left out" in fitted["shortened"]
    kept = [v["name"] for v in fitted["variables"]]
    assert kept + fitted["omitted"] == [f"df{n}" for n in range(50)]


@pytest.mark.parametrize("content", [
    {"status": "error"},
    {"status": "ok", "user_expressions": {"kaizen": {"status": "error", "ename": "NameError"}}},
    {"status": "ok", "user_expressions": {"kaizen": {"status": "ok",
                                                     "data": {"text/plain": "__import__('os')"}}}},
    {"status": "ok", "user_expressions": {"kaizen": {"status": "ok",
                                                     "data": {"text/plain": "'[1, 2]'"}}}},
])
def test_a_probe_reply_that_is_not_the_probes_answer_is_refused(content: dict) -> None:
    with pytest.raises(ProbeFailed):
        parse_reply(content)
