"""The package boundaries, each as its own test: what a package may not import.

Imports are read from the source (``ast``), relative ones resolved against the importing
module, so ``from ..store import x`` counts as much as ``import kaizen_server_extension.store``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXT = "kaizen_server_extension"


@dataclass(frozen=True)
class Import:
    source: Path
    line: int
    module: str

    def __str__(self) -> str:
        return f"{self.source.relative_to(ROOT)}:{self.line} imports {self.module}"


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT / "plugins" if "plugins" in path.parts else ROOT)
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_in(source: Path, this: str) -> Iterator[Import]:
    """The modules one source file imports, as absolute names (``this`` is its own name)."""
    is_package = source.name == "__init__.py"
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(source, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = this.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                target = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            yield Import(source, node.lineno, target)


def imports_of(package: str) -> Iterator[Import]:
    """Every module ``package``'s source files import, absolute, with where."""
    base = ROOT / "plugins" if package.startswith("kaizen_plugins") else ROOT
    directory = base / package.replace(".", "/")
    sources = sorted(directory.rglob("*.py")) if directory.is_dir() \
        else [directory.with_suffix(".py")]
    for source in sources:
        yield from imports_in(source, module_name(source))


def within(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names or module == "__future__"


@pytest.mark.rule("R-004")
def test_runtime_imports_only_the_stdlib_the_protocol_and_itself() -> None:
    """The controller holds no data, secrets or executors: it cannot reach them (R-004)."""
    offending = [str(i) for i in imports_of(f"{EXT}.runtime")
                 if not (stdlib(i.module) or within(i.module, f"{EXT}.runtime", f"{EXT}.protocol"))]
    assert offending == []


def test_the_protocol_imports_only_the_stdlib_and_itself() -> None:
    """Both sides import the shared vocabulary, so it may import neither."""
    offending = [str(i) for i in imports_of(f"{EXT}.protocol")
                 if not (stdlib(i.module) or within(i.module, f"{EXT}.protocol"))]
    assert offending == []


def test_a_relative_import_is_resolved_before_it_is_judged(tmp_path: Path) -> None:
    """The walk itself: ``from ..store import x`` inside runtime/ names the store."""
    probe = tmp_path / "probe.py"
    probe.write_text("from ..store import engine\nfrom . import port\n")
    found = {i.module for i in imports_in(probe, f"{EXT}.runtime.probe")}
    assert found == {f"{EXT}.store", f"{EXT}.runtime"}
