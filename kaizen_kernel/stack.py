"""The data stack run_code's Python kernels are expected to carry, checked at start-up.

An analyst's first request is a DataFrame, so Kaizen's own scripts install the pinned
``analysis`` extra (numpy, pandas, matplotlib, scipy, pyarrow) into the environment its
kernels run in. Whether it is there is a fact about the *kernel's* interpreter, not the
server's: a kernelspec (``KAIZEN_RUN_CODE_KERNELSPEC``) may name another environment. So the
check runs that interpreter once, in a subprocess, asking ``importlib.util.find_spec`` and the
installed distribution's version for each name — nothing is imported, in the server or there —
and the server logs one line naming what is present, what is missing and how to install it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass, field

from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

log = logging.getLogger(__name__)

#: The analysis stack, in the order the start-up line names it (pyproject.toml: ``analysis``).
STACK: tuple[str, ...] = ("numpy", "pandas", "matplotlib", "scipy", "pyarrow")
EXTRA_HINT = 'pip install "kaizen-jupyter[analysis]"'
PROBE_TIMEOUT_S = 20.0

# Runs in the kernel's interpreter: stdlib only, imports none of the packages it asks about.
_PROBE = """\
import importlib.metadata, importlib.util, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        spec = None
    if spec is None:
        found[name] = None
        continue
    try:
        found[name] = importlib.metadata.version(name)
    except Exception:
        found[name] = "?"
print(json.dumps({"prefix": sys.prefix, "found": found}))
"""


@dataclass(frozen=True, slots=True)
class StackReport:
    """What one kernel interpreter has of :data:`STACK`."""

    kernel_name: str
    python: str | None
    present: dict[str, str] = field(default_factory=dict)  # name -> version
    missing: tuple[str, ...] = ()
    # Why the interpreter could not be asked at all (then nothing is known).
    error: str | None = None
    # The interpreter is the server's own environment (sys.prefix), which the extra installs.
    servers_own: bool = False

    @property
    def complete(self) -> bool:
        return self.error is None and not self.missing

    def line(self) -> str:
        """The one start-up log line."""
        where = f"kernel {self.kernel_name!r}" + (f" ({self.python})" if self.python else "")
        if self.error is not None:
            return (f"Kaizen run_code data stack in {where}: not checked ({self.error}); "
                    f"it needs {', '.join(STACK)} ({EXTRA_HINT})")
        have = ", ".join(f"{name} {version}" for name, version in self.present.items())
        if not self.missing:
            return f"Kaizen run_code data stack in {where}: {have}"
        lacking = " ".join(self.missing)
        if self.servers_own:
            how = f"{EXTRA_HINT} (scripts/setup installs it unless KAIZEN_ANALYSIS=0)"
        else:
            how = f"{self.python or 'python'} -m pip install {lacking}"
        return (f"Kaizen run_code data stack in {where}: MISSING {', '.join(self.missing)}"
                + (f" (present: {have})" if have else "")
                + f"; run_code cannot import them until installed: {how}")


def kernel_python(argv: list[str]) -> str | None:
    """The interpreter a kernelspec's ``argv`` runs, as jupyter_client resolves it: a bare
    ``python``/``python3`` is the server's own interpreter, another bare name is looked up on
    ``PATH``."""
    if not argv:
        return None
    cmd = argv[0]
    major, minor = sys.version_info[:2]
    if cmd in ("python", f"python{major}", f"python{major}.{minor}"):
        return sys.executable
    if os.path.isabs(cmd):
        return cmd
    return shutil.which(cmd)


async def probe(kernel_name: str, ksm: KernelSpecManager | None = None, *,
                timeout: float = PROBE_TIMEOUT_S) -> StackReport:  # noqa: ASYNC109
    """Ask the interpreter of kernelspec ``kernel_name`` which of :data:`STACK` it has."""
    manager = ksm or KernelSpecManager()
    try:
        spec = manager.get_kernel_spec(kernel_name)
    except NoSuchKernel:
        return StackReport(kernel_name, None, error="no such kernelspec")
    python = kernel_python(list(spec.argv))
    if python is None:
        return StackReport(kernel_name, None, error="its interpreter is not on PATH")
    try:
        process = await asyncio.create_subprocess_exec(
            python, "-I", "-c", _PROBE, *STACK, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    except OSError as exc:
        return StackReport(kernel_name, python, error=f"cannot run it: {type(exc).__name__}")
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        return StackReport(kernel_name, python, error="it did not answer in time")
    try:
        answer = json.loads(out.decode("utf-8", "replace"))
    except ValueError:
        answer = None
    found = answer.get("found") if isinstance(answer, dict) else None
    if process.returncode != 0 or not isinstance(found, dict):
        return StackReport(kernel_name, python, error="it could not be asked")
    present = {name: str(found[name]) for name in STACK if found.get(name) is not None}
    missing = tuple(name for name in STACK if found.get(name) is None)
    return StackReport(kernel_name, python, present=present, missing=missing,
                       servers_own=_same_prefix(str(answer.get("prefix", ""))))


def _same_prefix(prefix: str) -> bool:
    try:
        return bool(prefix) and os.path.samefile(prefix, sys.prefix)
    except OSError:
        return False


async def log_stack(kernel_name: str, ksm: KernelSpecManager | None = None) -> StackReport:
    """Probe and log the one line: INFO when everything is there, WARNING otherwise."""
    report = await probe(kernel_name, ksm)
    log.log(logging.INFO if report.complete else logging.WARNING, "%s", report.line())
    return report
