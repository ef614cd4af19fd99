"""The package boundaries, each as its own test: what a package may not import.

Imports are read from the source (``ast``), relative ones resolved against the importing
module, so ``from ..store import x`` counts as much as ``import kaizen_server_extension.store``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter
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


def test_the_store_depends_on_no_layer_above_it() -> None:
    """The store holds the database's invariants; it is told what to do, it never asks the
    tool layer, the host, the lanes or the API (nor imports their types)."""
    above = tuple(f"{EXT}.{p}" for p in ("tools", "host", "lanes", "api", "app", "policy",
                                          "context", "runtime"))
    offending = [str(i) for i in imports_of(f"{EXT}.store") if within(i.module, *above)]
    assert offending == []


def test_the_kernel_package_reaches_no_store_and_no_host() -> None:
    """run_code's kernels are driven by the host; they never touch the database or the
    trusted host's internals, only the shared vocabulary."""
    forbidden = tuple(f"{EXT}.{p}" for p in ("store", "host", "lanes", "api", "app", "tools",
                                              "policy"))
    offending = [str(i) for i in imports_of("kaizen_kernel") if within(i.module, *forbidden)]
    assert offending == []


def _package(module: str) -> str | None:
    """The package a module belongs to, at the granularity the layout is drawn at: each
    subpackage (and top-level module) of the extension, and each top-level package."""
    parts = module.split(".")
    if parts[0] == EXT:
        return ".".join(parts[:2]) if len(parts) > 1 else None
    if parts[0] in ("kaizen_kernel", "kaizen_plugins", "kaizen_hashline"):
        return parts[0]
    return None


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for top in (EXT, "kaizen_kernel", "kaizen_plugins", "kaizen_hashline"):
        base = ROOT / "plugins" if top == "kaizen_plugins" else ROOT
        if not (base / top).is_dir():
            continue
        for source in sorted((base / top).rglob("*.py")):
            if "migrations" in source.parts:
                continue  # Alembic revisions: scripts run by the migration tool
            this = module_name(source)
            here = _package(this)
            if here is None:
                continue  # the extension's own __init__: Jupyter's entry points
            for imported in imports_in(source, this):
                there = _package(imported.module)
                if there is not None and there != here:
                    graph.setdefault(here, set()).add(there)
    return graph


def test_no_two_packages_import_each_other_even_through_others() -> None:
    """The layout is a layering: no import cycle between packages (a cycle means neither
    can be understood, or replaced, without the other)."""
    try:
        TopologicalSorter(package_graph()).prepare()
    except CycleError as cycle:
        pytest.fail(f"packages import each other: {' -> '.join(cycle.args[1])}")


def test_the_hashline_grammar_is_a_package_of_its_own() -> None:
    """An edit grammar, usable without kernels, a store or the server: it imports none."""
    offending = [str(i) for i in imports_of("kaizen_hashline")
                 if not (stdlib(i.module) or within(i.module, "kaizen_hashline",
                                                    f"{EXT}.protocol", "xxhash", "yaml"))]
    assert offending == []


def _hookspecs() -> list[str]:
    from kaizen_server_extension.tools import hookspecs

    return sorted(name for name in dir(hookspecs) if name.startswith("kaizen_")
                  and callable(getattr(hookspecs, name)))


def test_every_hookspec_is_documented_for_plugin_authors() -> None:
    """A hook nobody can find is not an extension point (docs/plugins.md)."""
    docs = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    undocumented = [h for h in _hookspecs() if f"## `{h}`" not in docs]
    assert _hookspecs() and undocumented == []


def test_every_hookspec_is_implemented_by_a_test_plugin_the_suite_loads() -> None:
    """Each hook is exercised by a plugin under tests/, as a third party would write it,
    not only by first-party code."""
    tests = ROOT / "tests"
    implemented = {node.name
                   for source in tests.rglob("*.py")
                   for node in ast.walk(ast.parse(source.read_text()))
                   if isinstance(node, ast.FunctionDef) and node.name.startswith("kaizen_")
                   and any(isinstance(d, ast.Name) and d.id == "hookimpl"
                           for d in node.decorator_list)}
    assert [h for h in _hookspecs() if h not in implemented] == []


def test_first_party_plugins_reach_the_store_only_through_its_artifact_face() -> None:
    """A first-party tool family can do nothing a third-party one cannot: it gets its
    services from ``ctx.services`` (tools/services.py) and imports from the store only the
    artifact face's types and pure helpers — never the core, models, repositories or units."""
    store = f"{EXT}.store"
    face = f"{EXT}.store.artifacts"
    offending = [str(i) for i in imports_of("kaizen_plugins")
                 if within(i.module, store) and i.module != face]
    assert offending == []


def test_the_lanes_import_no_plugin() -> None:
    """The room lane runs what the host built; it never imports a tool family (it reads a
    tool's declaration from the run's frozen catalog)."""
    offending = [str(i) for i in imports_of(f"{EXT}.lanes") if within(i.module, "kaizen_plugins")]
    assert offending == []
