"""``%load_ext kaizen`` in a real IPython kernel against a live server: ``%%kaizen`` streams
the answer into the cell's output, ``%kaizen_attach`` pins a DataFrame to the next message,
and the server is found from KAIZEN_URL/KAIZEN_TOKEN or from the runtime files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager
from sqlalchemy import select

from kaizen.client import Client
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import served_by, with_server_store
from tests.support.server import SERVER_TOKEN, ServerProcess, member_token

SCRIPTS = [
    {"match": "summarise the data", "responses": [
        {"text": ["The **data** ", "has three ", "regions."], "chunk_delay_ms": 40}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root: Path = tmp_path_factory.mktemp("magics")
    with FakeOpenAI(SCRIPTS) as fake, served_by("sqlite", root, fake) as server:
        yield server, root


class Kernel:
    """A plain IPython kernel (as a notebook's), with the messages each cell produced."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(env=env, cwd=str(cwd))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, source: str) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = []
        reply = self.client.execute_interactive(source, timeout=90, output_hook=outputs.append)
        assert reply["content"]["status"] == "ok", reply["content"]
        return outputs

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAIZEN_", "JUPYTER_"))}
    return {**env, **extra}


def _text(outputs: list[dict[str, Any]]) -> str:
    return "".join(o["content"].get("text", "") for o in outputs if o["msg_type"] == "stream")


def test_cell_magic_streams_the_answer_and_attach_pins_a_dataframe(
        live: tuple[ServerProcess, Path]) -> None:
    server, root = live
    kernel = Kernel(_env(KAIZEN_URL=server.base_url, KAIZEN_TOKEN=member_token("alice")), root)
    try:
        kernel.run("%load_ext kaizen")
        kernel.run("import pandas as pd\n"
                   "sales = pd.DataFrame({'region': ['n', 's', 'e'], 'total': [1, 2, 3]})")
        attached = _text(kernel.run("%kaizen_attach sales --max-rows 2"))
        assert "sales.csv (first 2 rows; 1 more left out)" in attached, attached
        outputs = kernel.run("%%kaizen\nsummarise the data")
        shown = [o["content"]["data"]["text/markdown"] for o in outputs
                 if o["msg_type"] in ("display_data", "update_display_data")]
        assert shown[-1] == "The **data** has three regions."
        assert len(shown) >= 2  # a placeholder first, then the answer as it streamed
        missing = _text(kernel.run("%kaizen_attach nothing_here"))
        assert "no variable named 'nothing_here'" in missing
        status = _text(kernel.run("%kaizen"))
        assert "as alice; conversation" in status
    finally:
        kernel.close()

    with Client(server.base_url, member_token("alice")) as client:
        [room] = [c for c in client.conversations() if c.title.startswith("From")]
        inputs = [e for e in client.iter_journal(room.id) if e.type == "input.accepted"]
        assert [e.data["text"] for e in inputs] == ["summarise the data"]
        [pinned] = inputs[0].data["attachments"]
        assert pinned["filename"] == "sales.csv" and pinned["media_type"] == "text/csv"
        content = client.download_artifact(pinned["reference_id"], version=pinned["version"])
        assert content.decode() == "region,total\nn,1\ns,2\n"

    async def rows(store: Store) -> int:
        async with store.transaction() as tx:
            found = (await tx.session.execute(select(m.InputAttachment).where(
                m.InputAttachment.input_id == inputs[0].data["input_id"]))).scalars().all()
            return len(found)
    assert with_server_store(server, rows) == 1


def test_the_magic_finds_the_server_from_its_runtime_files(
        live: tuple[ServerProcess, Path]) -> None:
    server, root = live
    # No KAIZEN_URL: the kernel reads the running servers' jpserver-*.json files, as a
    # notebook kernel of that server would.
    kernel = Kernel(_env(JUPYTER_RUNTIME_DIR=str(root / "runtime")), root)
    try:
        kernel.run("%load_ext kaizen")
        status = _text(kernel.run("%kaizen"))
        assert server.base_url in status, status
        with Client(server.base_url, SERVER_TOKEN) as client:
            assert f"as {client.me().member};" in status
    finally:
        kernel.close()

