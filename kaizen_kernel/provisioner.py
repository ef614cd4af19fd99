"""The sandboxing kernel provisioner.

:class:`SandboxProvisioner` is a jupyter_client ``KernelProvisioner`` (a ``LocalProvisioner``
subclass) that launches a kernel

* with an **allowlisted environment** built from scratch: the server's environment — model
  keys, database URLs, tokens — never reaches the kernel (``start_kernel(env=...)`` would
  *replace* the environment, so we build the replacement ourselves and ignore whatever env
  the caller handed in);
* in a private working directory (the lease's workspace when known at launch, otherwise a
  private per-kernel home that the lease binding later leaves for the workspace);
* under ``setrlimit`` limits (address space, processes, file size, open files, core) applied
  by a tiny exec wrapper (see :mod:`kaizen_kernel.limits`);
* inside a **bubblewrap** jail when ``bwrap`` is on ``PATH`` (``jail="auto"``): the workspace
  and the kernel home writable, the shared-resources directory read-only, system and Python
  prefixes read-only, fresh ``/tmp``, ``/proc`` and ``/dev``, PID/IPC/UTS namespaces
  unshared. The network namespace is *shared*: the kernel's ZeroMQ ports and the
  ``tools.call`` bridge live on loopback.

Registered as the ``kaizen-sandbox`` entry point of group ``jupyter_client.kernel_provisioners``
so a kernelspec can name it; Kaizen's own managers instantiate it directly.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jupyter_client.provisioning import LocalProvisioner
from traitlets import Dict, List, Unicode

from kaizen_kernel.limits import ProcessLimits, rlimit_wrapper_argv

PROVISIONER_NAME = "kaizen-sandbox"

# Names passed through from the server's environment. Nothing else is.
DEFAULT_ENV_ALLOWLIST: tuple[str, ...] = (
    "PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "LC_NUMERIC", "TZ",
)
# A second guard against a misconfigured allowlist: names that look like secrets are dropped
# even when allowlisted.
_SECRETISH = re.compile(
    r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|DATABASE|DSN|_URL$|^AWS_|^AZURE_|^GCP_|"
    r"^GOOGLE_|^OPENAI|^ANTHROPIC|^KAIZEN_(?!WORKSPACE$|SHARED_RESOURCES_DIR$|"
    r"SHARED_RESOURCES_MANIFEST$))",
    re.IGNORECASE,
)

# System paths a jailed kernel may read. Missing ones are skipped (``--ro-bind-try``).
_JAIL_SYSTEM_RO = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    "/etc/alternatives", "/etc/ssl", "/etc/ca-certificates", "/etc/ld.so.cache",
    "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd", "/etc/group",
    "/etc/nsswitch.conf", "/etc/hosts", "/etc/mime.types", "/etc/fonts",
)

JAIL_MODES = ("auto", "off", "required")


class SandboxUnavailable(RuntimeError):
    """The configured sandbox cannot be built here (e.g. ``jail="required"`` without bwrap)."""


#: The kernel's matplotlib backend: IPython's inline one, headless, emitting PNG displays.
MATPLOTLIB_BACKEND = "module://matplotlib_inline.backend_inline"


def looks_secret(name: str) -> bool:
    return bool(_SECRETISH.search(name))


def build_kernel_env(
    source: Mapping[str, str],
    *,
    allowlist: Iterable[str],
    home: str,
    workspace: str | None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The complete environment of a kernel: allowlisted names only, plus Kaizen's own."""
    env: dict[str, str] = {}
    for name in allowlist:
        value = source.get(name)
        if value is not None and not looks_secret(name):
            env[name] = value
    env.setdefault("PATH", os.defpath)
    env.update({
        "HOME": home,
        "IPYTHONDIR": os.path.join(home, ".ipython"),
        "MPLCONFIGDIR": os.path.join(home, ".config", "matplotlib"),
        "XDG_CACHE_HOME": os.path.join(home, ".cache"),
        "PYTHONNOUSERSITE": "1",
        # Figures a program shows (plt.show(), or open at the end of the cell) become PNG
        # display data, which run_code puts on the chat canvas; never a GUI window.
        "MPLBACKEND": MATPLOTLIB_BACKEND,
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    })
    if workspace:
        env["KAIZEN_WORKSPACE"] = workspace
    if extra:
        env.update(extra)
    return env


def bwrap_argv(
    cmd: Sequence[str],
    *,
    bwrap: str,
    workspace: str | None,
    home: str,
    shared_dir: str | None,
    ro_paths: Iterable[str] = (),
    chdir: str,
) -> list[str]:
    """The bubblewrap command line that jails ``cmd``.

    Writable: the workspace and the kernel's private home. Read-only: the shared-resources
    directory, system directories, the Python prefixes and ``ro_paths`` (the connection
    file). Everything else of the host filesystem is absent.
    """
    argv = [
        bwrap, "--die-with-parent",
        "--unshare-user-try", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try",
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
        # In the PID namespace the kernel's parent is bwrap's init (pid 1), which ipykernel's
        # parent poller reads as "the parent exited"; --die-with-parent covers that job.
        "--unsetenv", "JPY_PARENT_PID",
    ]
    for path in _JAIL_SYSTEM_RO:
        argv += ["--ro-bind-try", path, path]
    seen: set[str] = set()
    for path in ro_paths:
        if path and path not in seen:
            seen.add(path)
            argv += ["--ro-bind", path, path]
    argv += ["--bind", home, home]
    if workspace:
        argv += ["--bind", workspace, workspace]
    if shared_dir:
        argv += ["--ro-bind", shared_dir, shared_dir]
    argv += ["--chdir", chdir, "--", *cmd]
    return argv


def python_ro_paths() -> list[str]:
    """Prefixes a jailed Python kernel needs to read: venv, base interpreter, executable."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))]
    out: list[str] = []
    for p in paths:
        real = os.path.realpath(p)
        for candidate in (p, real):
            under_usr = candidate == "/usr" or candidate.startswith("/usr/")
            if candidate not in out and not under_usr:  # /usr is bound already
                out.append(candidate)
    return out


def interpreter_ro_paths(cmd: Sequence[str]) -> list[str]:
    """Prefixes a jailed kernel of *another* environment needs to read (a kernelspec named by
    ``KAIZEN_RUN_CODE_KERNELSPEC``): the environment its interpreter lives in (``<prefix>/bin/
    python`` -> ``<prefix>``), where that interpreter really is, and a virtualenv's base
    interpreter (``home`` in its ``pyvenv.cfg``). Nothing for a bare command name, and
    nothing under ``/usr`` (bound already)."""
    if not cmd or not os.path.isabs(cmd[0]):
        return []
    candidates: list[str] = []

    def environment_of(exe: str) -> None:
        bindir = os.path.dirname(exe)
        candidates.append(bindir)
        prefix = os.path.dirname(bindir)
        # Only a directory that is a Python environment, never e.g. a home holding ~/bin.
        if _is_python_prefix(prefix):
            candidates.append(prefix)

    environment_of(cmd[0])
    environment_of(os.path.realpath(cmd[0]))
    try:
        cfg_path = os.path.join(os.path.dirname(os.path.dirname(cmd[0])), "pyvenv.cfg")
        with open(cfg_path, encoding="utf-8") as cfg:
            for line in cfg:
                key, _, value = line.partition("=")
                if key.strip() == "home" and os.path.isabs(value.strip()):
                    environment_of(os.path.join(os.path.realpath(value.strip()), "python"))
    except OSError:
        pass
    out: list[str] = []
    for path in candidates:
        under_usr = path == "/usr" or path.startswith("/usr/")
        if path and path != "/" and os.path.isdir(path) and not under_usr and path not in out:
            out.append(path)
    return out


def _is_python_prefix(path: str) -> bool:
    """A virtualenv, a conda environment or an installed Python (``lib/python3.*``)."""
    if not path or path == "/":
        return False
    if os.path.isfile(os.path.join(path, "pyvenv.cfg")) or \
            os.path.isdir(os.path.join(path, "conda-meta")):
        return True
    try:
        return any(name.startswith("python3") for name in os.listdir(os.path.join(path, "lib")))
    except OSError:
        return False


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


def _private_dir(path: str, what: str) -> str:
    """``path`` as an existing real directory (created 0700 if missing), never a symlink."""
    p = Path(path)
    if p.is_symlink():
        raise SandboxUnavailable(f"{what} must not be a symlink")
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not p.is_dir():
        raise SandboxUnavailable(f"{what} is not a directory")
    return str(p.resolve())


class SandboxProvisioner(LocalProvisioner):
    """A ``LocalProvisioner`` that scrubs the environment, limits and (maybe) jails."""

    workspace = Unicode("", config=True, help="Lease workspace (working dir); may be empty.")
    home_dir = Unicode("", config=True, help="Private per-kernel HOME, outside the workspace.")
    shared_dir = Unicode("", config=True, help="Read-only shared-resources directory.")
    env_allowlist = List(Unicode(), default_value=list(DEFAULT_ENV_ALLOWLIST), config=True)
    extra_env = Dict(config=True, help="Server-authored variables added to the kernel env.")
    process_limits = Dict(config=True, help="ProcessLimits fields (setrlimit values).")
    jail = Unicode("auto", config=True, help="bubblewrap: auto (when on PATH), off, required.")

    # What the last launch used: visible to tests and diagnostics, never to the kernel.
    launched_cmd: list[str] | None = None
    jailed: bool = False

    def _limits(self) -> ProcessLimits:
        return ProcessLimits.from_mapping(self.process_limits) if self.process_limits \
            else ProcessLimits()

    def _bwrap(self) -> str | None:
        if self.jail not in JAIL_MODES:
            raise SandboxUnavailable(f"unknown jail mode {self.jail!r}")
        if self.jail == "off":
            return None
        found = find_bwrap()
        if found is None and self.jail == "required":
            raise SandboxUnavailable("bubblewrap (bwrap) is required but not on PATH")
        return found

    def build_launch(self, cmd: Sequence[str], connection_file: str | None) -> dict[str, Any]:
        """The command, environment and working directory of a launch (pure but for mkdir)."""
        home = _private_dir(self.home_dir or os.path.join(
            os.path.expanduser("~"), ".kaizen-kernel-homes", str(self.kernel_id)), "kernel home")
        workspace = _private_dir(self.workspace, "workspace") if self.workspace else None
        shared = str(Path(self.shared_dir).resolve()) if self.shared_dir else None
        cwd = workspace or home
        env = build_kernel_env(os.environ, allowlist=self.env_allowlist, home=home,
                               workspace=workspace,
                               extra={str(k): str(v) for k, v in self.extra_env.items()})
        inner = list(cmd)
        bwrap = self._bwrap()
        self.jailed = bwrap is not None
        if bwrap is not None:
            ro = python_ro_paths() + interpreter_ro_paths(inner)
            # A connection file inside the (writable) kernel home is visible already.
            if connection_file and not Path(connection_file).resolve().is_relative_to(home):
                ro.append(os.path.realpath(connection_file))
            inner = bwrap_argv(inner, bwrap=bwrap, workspace=workspace, home=home,
                               shared_dir=shared, ro_paths=ro, chdir=cwd)
        full = rlimit_wrapper_argv(self._limits(), inner)
        self.launched_cmd = full
        return {"cmd": full, "env": env, "cwd": cwd}

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        # Whatever environment the caller passed is discarded: the kernel gets only ours.
        kwargs.pop("env", None)
        kwargs = await super().pre_launch(**kwargs)
        connection_file = getattr(self.parent, "connection_file", None) if self.parent else None
        launch = self.build_launch(kwargs.pop("cmd"), connection_file)
        kwargs.update(launch)
        return kwargs

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if not restart and self.home_dir:
            shutil.rmtree(self.home_dir, ignore_errors=True)
