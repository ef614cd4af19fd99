"""The data stack of run_code's Python kernels (issue 13, item 1): the pinned ``analysis`` extra
is what real kernels import, jailed and not, and the start-up check names what a kernel's
interpreter lacks, asking that interpreter, never importing anything in the server."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager

from kaizen_kernel import stack
from tests.kernel.conftest import Sandbox

ASYNC = pytest.mark.asyncio(loop_scope="session")

ROOT = Path(__file__).resolve().parents[2]

ANALYSIS = """
import json
import numpy as np
import pandas as pd
import pyarrow as pa
import scipy.stats
import matplotlib
import matplotlib.pyplot as plt
from matplotlib.backends.backend_agg import FigureCanvasAgg

df = pd.DataFrame({"a": [1, 2, 3, 4], "b": [10.0, 20.5, 30.25, 40.0]})
fig, ax = plt.subplots()
ax.plot(df["a"], df["b"])
fig.savefig("plot.png")
print(json.dumps({
    "sum_b": float(df["b"].sum()),
    "mean": float(np.mean(df["a"].to_numpy())),
    "arrow_rows": pa.Table.from_pandas(df).num_rows,
    "r": round(float(scipy.stats.pearsonr(df["a"], df["b"])[0]), 3),
    "agg_canvas": isinstance(fig.canvas, FigureCanvasAgg),
    "backend": matplotlib.get_backend(),
}))
"""


def _pins() -> dict[str, str]:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["analysis"]
    return dict(line.split("==") for line in extra)


def test_the_analysis_extra_pins_the_whole_stack() -> None:
    assert set(_pins()) == set(stack.STACK)
    setup = (ROOT / "scripts" / "setup").read_text()
    assert "KAIZEN_ANALYSIS" in setup and "analysis" in setup
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "ARG KAIZEN_EXTRAS=lab,gateway,analysis" in dockerfile


@ASYNC
async def test_a_run_code_kernel_computes_with_pandas_and_numpy(
        either_sandbox: Sandbox) -> None:
    r = await either_sandbox.service.run("alice", "conv-stack", ANALYSIS, "python", False,
                                         ["plot.png"])
    assert r.status == "ok", (r.error_name, r.error_value, r.stderr)
    out = json.loads(r.stdout)
    assert out["sum_b"] == 100.75 and out["mean"] == 2.5 and out["arrow_rows"] == 4
    assert out["r"] > 0.99
    # A non-GUI (Agg) canvas: figures save to files, and never open a window.
    assert out["agg_canvas"] and "inline" in out["backend"]
    [plot] = r.files
    assert plot.name == "plot.png" and plot.mime == "image/png" and plot.size > 1000


@ASYNC
async def test_the_start_up_check_reports_the_pinned_stack_of_this_environment() -> None:
    report = await stack.probe("python3")
    assert report.complete, report.line()
    assert report.present == _pins()
    assert report.servers_own  # the server's own environment, where the extra went
    line = report.line()
    assert "MISSING" not in line and "pandas 3.1.1" in line and "'python3'" in line


@pytest.fixture
def bare_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv


@ASYNC
async def test_the_start_up_line_names_what_a_kernels_python_lacks(tmp_path: Path,
                                                                   bare_venv: Path) -> None:
    # A kernelspec whose interpreter is a bare virtualenv: nothing of the stack.
    venv = bare_venv
    spec_dir = tmp_path / "kernels" / "bare-python"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [str(venv / "bin" / "python"), "-m", "ipykernel_launcher", "-f",
                 "{connection_file}"],
        "display_name": "bare", "language": "python"}))
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    report = await stack.probe("bare-python", ksm)
    assert report.error is None and report.missing == stack.STACK and not report.present
    assert not report.servers_own
    line = report.line()
    assert "MISSING numpy, pandas, matplotlib, scipy, pyarrow" in line
    assert f"{venv / 'bin' / 'python'} -m pip install numpy pandas matplotlib scipy pyarrow" \
        in line
    # Nothing of the stack was imported in this (the server's) process by the check.
    unknown = await stack.probe("no-such-kernel", ksm)
    assert unknown.error == "no such kernelspec" and "not checked" in unknown.line()


def test_the_probe_imports_none_of_the_packages_it_asks_about() -> None:
    """The check runs in the kernel's interpreter and asks find_spec only: a fresh
    interpreter running it has loaded none of the stack afterwards."""
    code = (f"import runpy, sys\nsys.argv = ['probe', *{list(stack.STACK)!r}]\n"
            f"exec({stack._PROBE!r})\n"
            f"print(sorted(m for m in {list(stack.STACK)!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert json.loads(out[0])["found"].keys() == set(stack.STACK)
    assert out[1] == "[]"
