"""The wheel a user installs: built with the sdist, installed into a fresh virtual environment
whose PATH has no Node.js, started as a plain ``jupyter lab`` — the server extension and the
prebuilt panel load, the panel opens in headless Chromium and answers, and the server-token
holder is one member over REST.

Runs in CI with the rest of the suite (about a minute: pip reuses its cache). Outside CI a
missing Chromium skips only the browser part.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kaizen_server_extension import __version__
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.distribution.support import OWNER_TOKEN, PlainServer, start_plain, user_env

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("open_panel.mjs")
CHROMIUM = os.environ.get("KAIZEN_E2E_CHROMIUM", "/usr/bin/chromium")
IN_CI = os.environ.get("CI") == "true"
PANEL = "kaizen_server_extension/labextension"
ANSWER = "Hello from the installed wheel."


@dataclass
class Installed:
    env: Path
    wheel: Path
    sdist: Path

    @property
    def bin(self) -> Path:
        return self.env / "bin"

    def user_path(self) -> str:
        """The environment's bin and nothing else: no Node.js, no developer tools."""
        return str(self.bin)

    def run(self, *args: str) -> str:
        result = subprocess.run([str(self.bin / args[0]), *args[1:]], capture_output=True,
                                text=True, timeout=300,
                                env={**os.environ, "PATH": self.user_path()})
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)  # no colours


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    assert (REPO / PANEL / "package.json").exists(), "build the panel first: scripts/setup"
    dist = root / "dist"
    # No isolation: the development environment already has the build backend, its hook and
    # JupyterLab; the prebuilt panel is packed as it is (hatch-jupyter-builder's skip-if-exists).
    build = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(REPO)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    [wheel] = dist.glob("kaizen_jupyter-*.whl")
    [sdist] = dist.glob("kaizen_jupyter-*.tar.gz")
    env = root / "env"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(env)], check=True, timeout=120)
    pip = subprocess.run(
        [str(env / "bin" / "python"), "-m", "pip", "install", "--quiet",
         "--disable-pip-version-check", f"{wheel}[lab]"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "PATH": str(env / "bin"), "PIP_NO_INPUT": "1"})
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    return Installed(env, wheel, sdist)


def test_the_sdist_and_wheel_carry_the_prebuilt_panel(installed: Installed) -> None:
    with tarfile.open(installed.sdist) as sdist:
        names = sdist.getnames()
    assert any(n.endswith(f"{PANEL}/package.json") for n in names)
    assert not any("/node_modules/" in n or "/.venv/" in n for n in names)
    with zipfile.ZipFile(installed.wheel) as wheel:
        files = wheel.namelist()
    data = f"kaizen_jupyter-{__version__}.data/data"
    assert f"{data}/share/jupyter/labextensions/kaizen-jupyter/package.json" in files
    assert any(re.fullmatch(rf"{data}/share/jupyter/labextensions/kaizen-jupyter/static/"
                            r"remoteEntry\.[0-9a-f]+\.js", f) for f in files)
    assert (f"{data}/etc/jupyter/jupyter_server_config.d/kaizen_server_extension.json"
            in files)
    assert f"{data}/share/jupyter/labextensions/kaizen-jupyter/install.json" in files
    assert not any(f.startswith(("tests/", "labextension/")) for f in files)


def test_the_environment_has_no_node(installed: Installed) -> None:
    assert shutil.which("node", path=installed.user_path()) is None
    assert shutil.which("jlpm", path=installed.user_path()) is not None  # jupyterlab's own


def test_jupyter_lists_both_extensions_enabled_and_ok(installed: Installed) -> None:
    server = installed.run("jupyter", "server", "extension", "list")
    assert re.search(r"kaizen_server_extension\s.*enabled", server), server
    assert re.search(r"kaizen_server_extension\s+\S+\s.*OK", server), server
    lab = installed.run("jupyter", "labextension", "list")
    assert re.search(r"kaizen-jupyter v\S+ .*enabled.*OK \(python, kaizen-jupyter\)",
                     lab), lab


@pytest.fixture(scope="module")
def lab(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlainServer]:
    root = tmp_path_factory.mktemp("wheel-lab")
    settings = root / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    with FakeOpenAI([{"responses": [{"text": ANSWER}]}]) as fake:
        env = user_env(root, {"PATH": installed.user_path(),
                              "KAIZEN_MODEL_BASE_URL": fake.base_url,
                              "KAIZEN_MODEL": "fake-model"})
        server = start_plain([str(installed.bin / "jupyter"), "lab"], root, env=env,
                             timeout=120)
        try:
            yield server
        finally:
            server.stop()


def test_a_plain_jupyter_lab_serves_kaizen_and_its_panel(lab: PlainServer,
                                                         installed: Installed) -> None:
    log = lab.log()
    assert "kaizen_server_extension | extension was successfully loaded" in log, log[-3000:]
    assert str(installed.env) in log or "Kaizen store" in log
    with lab.api() as api:
        page = api.get("lab")
        assert page.status_code == 200
        assert '"kaizen-jupyter"' in page.text  # the prebuilt panel is a federated extension
        created = api.post("kaizen/api/conversations", json={"agent_id": "general"})
        assert created.status_code == 201, created.text
    with lab.api() as api:  # a new client: still the same member
        accepted = api.post(f"kaizen/api/conversations/{created.json()['id']}/messages",
                            json={"text": "hello"})
        assert accepted.status_code == 202, accepted.text


@pytest.mark.timeout(300)
def test_the_panel_opens_and_answers_in_chromium(lab: PlainServer, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        if IN_CI:
            pytest.fail(f"CI must provide Chromium at {CHROMIUM}")
        pytest.skip(f"Chromium not found at {CHROMIUM}")
    node = shutil.which("node")  # the test's driver; the server's environment has none
    assert node, "Node.js drives the browser"
    env = {**os.environ, "KAIZEN_E2E_BASE_URL": lab.base_url, "KAIZEN_E2E_TOKEN": OWNER_TOKEN,
           "KAIZEN_E2E_CHROMIUM": CHROMIUM, "KAIZEN_E2E_SCREENSHOTS": str(tmp_path)}
    result = subprocess.run([node, str(DRIVER)], env=env, capture_output=True, text=True,
                            timeout=240, cwd=REPO)
    assert result.returncode == 0, (result.stdout[-2000:] + result.stderr[-3000:]
                                    + "\n--- server ---\n" + lab.log()[-3000:])
    assert '{"step":"done"}' in result.stdout
