from __future__ import annotations

from pathlib import Path

import pytest

from tests.hashline.support import SETTINGS, UTIL, Workspace


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "workspace"
    root.mkdir()
    return Workspace(root)


@pytest.fixture
def app(ws: Workspace) -> Workspace:
    """The §10 workspace: app/settings.py (#BC00) and app/util.py (#D831), both read."""
    ws.write("app/settings.py", SETTINGS)
    ws.write("app/util.py", UTIL)
    assert ws.read("app/settings.py").tag == "BC00"
    assert ws.read("app/util.py").tag == "D831"
    return ws
