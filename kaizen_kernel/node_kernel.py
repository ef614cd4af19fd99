"""Install the Node kernel run_code uses for ``language: "node"``.

    python -m kaizen_kernel.node_kernel install   # idempotent; needs node >= 18 and npm
    python -m kaizen_kernel.node_kernel status

The kernel is tslab's JavaScript mode, pinned, installed with npm into
``<sys.prefix>/share/kaizen/node-kernel`` (install scripts disabled: tslab's ZeroMQ binding
ships prebuilt binaries), and registered as the kernelspec ``kaizen-javascript`` in
``<sys.prefix>/share/jupyter/kernels``. The kernelspec names the ``node`` executable and tslab's
entry script by absolute path, so launching it needs no ``PATH`` lookup inside the sandbox, and
both live under read-only prefixes the jail already binds (``/usr`` and ``sys.prefix``).

npm's *nested* layout keeps ``@types/node`` under tslab's own ``node_modules``, where tslab's
type checker looks for it whatever the kernel's working directory is.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

TSLAB_VERSION = "1.0.22"
KERNEL_NAME = "kaizen-javascript"
MIN_NODE_MAJOR = 18  # global fetch and AbortSignal.timeout, used by the prelude


class NodeKernelUnavailable(RuntimeError):
    """Node or npm is missing or too old; the message says what to install."""


@dataclass(frozen=True, slots=True)
class Layout:
    prefix: Path

    @property
    def package_dir(self) -> Path:
        return self.prefix / "share" / "kaizen" / "node-kernel"

    @property
    def tslab_script(self) -> Path:
        return self.package_dir / "node_modules" / "tslab" / "bin" / "tslab"

    @property
    def spec_dir(self) -> Path:
        return self.prefix / "share" / "jupyter" / "kernels" / KERNEL_NAME


def _node() -> tuple[str, int]:
    node = shutil.which("node")
    if node is None:
        raise NodeKernelUnavailable("node is not on PATH (apt-get install nodejs)")
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    major = int(out.stdout.strip().lstrip("v").split(".")[0])
    if major < MIN_NODE_MAJOR:
        raise NodeKernelUnavailable(f"node {out.stdout.strip()} is too old; "
                                    f"{MIN_NODE_MAJOR} or newer is needed")
    return str(Path(node).resolve()), major


def installed_version(layout: Layout) -> str | None:
    manifest = layout.package_dir / "node_modules" / "tslab" / "package.json"
    try:
        return str(json.loads(manifest.read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError):
        return None


def kernelspec(node: str, layout: Layout) -> dict[str, object]:
    return {
        "argv": [node, str(layout.tslab_script), "kernel", "--config-path",
                 "{connection_file}", "--js"],
        "display_name": "JavaScript (Node, Kaizen run_code)",
        "language": "javascript",
    }


def install(layout: Layout) -> Path:
    """Install (or repair) the pinned kernel; returns the kernelspec directory."""
    node, _major = _node()
    npm = shutil.which("npm")
    if npm is None:
        raise NodeKernelUnavailable("npm is not on PATH (apt-get install npm)")
    if installed_version(layout) != TSLAB_VERSION:
        layout.package_dir.mkdir(parents=True, exist_ok=True)
        (layout.package_dir / "package.json").write_text(
            json.dumps({"private": True, "name": "kaizen-node-kernel"}) + "\n",
            encoding="utf-8")
        subprocess.run(
            [npm, "install", "--prefix", str(layout.package_dir), "--install-strategy=nested",
             "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error",
             f"tslab@{TSLAB_VERSION}"],
            check=True)
        if installed_version(layout) != TSLAB_VERSION:
            raise NodeKernelUnavailable("npm finished but tslab is not where it should be")
    layout.spec_dir.mkdir(parents=True, exist_ok=True)
    spec_file = layout.spec_dir / "kernel.json"
    wanted = json.dumps(kernelspec(node, layout), indent=1) + "\n"
    if not spec_file.exists() or spec_file.read_text(encoding="utf-8") != wanted:
        spec_file.write_text(wanted, encoding="utf-8")
    return layout.spec_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kaizen_kernel.node_kernel",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("install", "status"))
    parser.add_argument("--prefix", type=Path, default=Path(sys.prefix),
                        help="environment prefix (default: this interpreter's)")
    args = parser.parse_args(argv)
    layout = Layout(prefix=args.prefix.resolve())
    if args.command == "status":
        version = installed_version(layout)
        ready = version == TSLAB_VERSION and (layout.spec_dir / "kernel.json").exists()
        print(json.dumps({"kernel": KERNEL_NAME, "tslab": version, "ready": ready}))
        return 0 if ready else 1
    try:
        spec = install(layout)
    except (NodeKernelUnavailable, subprocess.CalledProcessError) as exc:
        print(f"kaizen: Node kernel not installed: {exc}", file=sys.stderr)
        return 1
    print(f"kaizen: Node kernel {KERNEL_NAME} (tslab {TSLAB_VERSION}) ready at {spec}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
