"""End to end, issue 15 item 9: documents from Jupyter and citations as links, in headless
Chromium against a real server and the scripted model (see tests/e2e/test_panel.py for what
the run needs).

Two files selected in JupyterLab's file browser are added with "Add to Kaizen Documents" (the
server reads them through its ContentsManager); adding one again after it changed makes its
next version. The Search agent's scripted answer cites the passage its search retrieved; the
citation is a link, and clicking it opens the document with that passage highlighted in view,
and from there the source file in JupyterLab. Once the document is deleted, the same link says
it is no longer available and shows nothing of it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.e2e import test_panel as panel_e2e
from tests.support.server import ServerProcess, start_server

POLICY = ("# Travel policy\n\n" + "Background about the policy.\n" * 60
          + "\n## Flights\n\nEconomy class is required for flights under six hours.\n")
HOTELS = "# Hotels\n\nHotels are booked through the travel portal.\n"
NOTEBOOK = {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                        "language": "python"}},
            "cells": [{"cell_type": "code", "metadata": {}, "id": "c1", "execution_count": None,
                       "outputs": [], "source": "birds = 3"}]}

node = panel_e2e.node  # the same preconditions (Node.js, the built panel, Chromium)


@pytest.fixture
def documents_lab(node: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, FakeOpenAI]]:
    fake = FakeOpenAI([{"responses": [{"text": "Default answer."}]}])
    root = tmp_path / "server"
    settings = root / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    (root / "travel-policy.md").write_text(POLICY)
    (root / "hotels.md").write_text(HOTELS)
    (root / "analysis.ipynb").write_text(json.dumps(NOTEBOOK))
    server = start_server(root, sqlite_url_for(root / "kaizen.db"), None, extra_env={
        "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model"})
    try:
        yield server, fake
    finally:
        server.stop()
        fake.close()


@pytest.mark.rule("R-071")
@pytest.mark.timeout(300)
def test_files_added_from_the_file_browser_are_cited_and_the_citation_opens_the_passage(
        node: str, documents_lab: tuple[ServerProcess, FakeOpenAI], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    server, fake = documents_lab
    shots = Path(os.environ.get("KAIZEN_E2E_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("KAIZEN_E2E_FAKE_URL", fake.root_url)
    steps, report = panel_e2e._run_driver(node, server, shots, "documents")

    added = steps["documents-added"]
    assert added["sources"] == ["hotels.md", "travel-policy.md"], report
    versioned = steps["document-versioned"]
    assert versioned["edited"] == 200 and versioned["count"] == 2, report
    assert versioned["hotels"] == [2], report  # the same document, its next version

    # The open notebook's unsaved edit was saved before the server read it.
    assert steps["notebook-added"]["hits"] == [
        {"title": "analysis.ipynb", "locator": "cell 1 (code), line 1", "saved": True}], report
    items = steps["documents-listed"]["items"]
    assert sorted((i["path"], i["title"]) for i in items) == [
        ("analysis.ipynb", "analysis.ipynb"), ("hotels.md", "hotels.md"),
        ("travel-policy.md", "travel-policy.md")], report

    opened = steps["citation-opened"]
    assert opened["linkText"].startswith("travel-policy.md, v1, lines "), report
    assert opened["linkChunk"] == opened["hitChunk"] == opened["citedChunk"], report
    assert "Economy class is required" in opened["citedText"], report
    assert (opened["title"], opened["source"]) == ("travel-policy.md", "travel-policy.md")
    assert steps["source-opened"]["tabs"] == 1, report

    gone = steps["citation-unavailable"]
    assert gone["deleted"] == 404, report  # removed from the list: gone on the server
    assert gone["message"].startswith("This document is no longer available to you"), report
    assert gone["passages"] == 0, report
    for shot in ("documents-added.png", "documents-citation-opened.png",
                 "documents-citation-unavailable.png"):
        assert (shots / shot).exists(), shot
