"""The closed built-in set is a trip-wire: the source, the manifest and the registry agree."""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest

from kaizen_server_extension.tools import Capability, hookimpl, tool
from kaizen_server_extension.tools.manifest import BUILTIN_TOOLS, CORE_PLUGINS, DEFAULT_PLUGINS
from kaizen_server_extension.tools.registry import ToolRegistrationError, ToolRegistry

ROOT = Path(__file__).resolve().parents[1]
# Everywhere first-party tool code may live; plugins/ maps to the import package kaizen_plugins.
SOURCE_ROOTS = {
    ROOT / "plugins" / "kaizen_plugins": "kaizen_plugins",
    ROOT / "kaizen_server_extension": "kaizen_server_extension",
    ROOT / "kaizen_kernel": "kaizen_kernel",
}


def _is_tool_decorator(node: ast.expr) -> bool:
    func = node.func if isinstance(node, ast.Call) else node
    return (isinstance(func, ast.Name) and func.id == "tool") or (
        isinstance(func, ast.Attribute) and func.attr == "tool"
    )


def _declared_name(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    for deco in fn.decorator_list:
        if isinstance(deco, ast.Call):
            for kw in deco.keywords:
                if kw.arg == "name":
                    if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                        return kw.value.value
                    if isinstance(kw.value, ast.Name):  # a module constant, e.g. TOOL_SEARCH_NAME
                        return _constant(fn, kw.value.id)
    return fn.name


_constants: dict[str, str] = {}


def _constant(fn: ast.AST, name: str) -> str:
    if name not in _constants:
        raise AssertionError(f"@tool(name={name}) must be a string constant defined in source")
    return _constants[name]


def walk_tools() -> dict[str, str]:
    """tool name → module of every @tool-decorated function in first-party source."""
    found: dict[str, str] = {}
    files = [
        (path, package, root)
        for root, package in SOURCE_ROOTS.items() if root.exists()
        for path in sorted(root.rglob("*.py"))
    ]
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path, _, _ in files}
    for tree in trees.values():  # module-level string constants, for name=CONSTANT
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        _constants[target.id] = node.value.value
    for path, package, root in files:
        module = ".".join((package, *path.relative_to(root).with_suffix("").parts))
        module = module.removesuffix(".__init__")
        for node in ast.walk(trees[path]):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                _is_tool_decorator(d) for d in node.decorator_list
            ):
                name = _declared_name(node)
                assert name not in found, f"{name} implemented twice: {found[name]}, {module}"
                found[name] = module
    return found


@pytest.mark.rule("R-133", "R-183")
def test_every_implementation_is_in_the_manifest_and_every_entry_is_implemented():
    implemented = walk_tools()
    missing = sorted(set(implemented) - set(BUILTIN_TOOLS))
    phantom = sorted(set(BUILTIN_TOOLS) - set(implemented))
    assert not missing, f"implemented but not in BUILTIN_TOOLS: {missing}"
    assert not phantom, f"in BUILTIN_TOOLS but not implemented: {phantom}"
    moved = {n: (implemented[n], BUILTIN_TOOLS[n]) for n in implemented
             if implemented[n] != BUILTIN_TOOLS[n]}
    assert not moved, f"implemented in another module than the manifest says: {moved}"


@pytest.mark.rule("R-133")
def test_manifest_families_are_loaded_as_first_party_plugins():
    assert set(BUILTIN_TOOLS.values()) <= set(CORE_PLUGINS) | set(DEFAULT_PLUGINS)


@pytest.mark.rule("R-133")
def test_registry_built_from_first_party_plugins_holds_exactly_the_manifest():
    registry = ToolRegistry.from_plugins(load_entrypoints=False)
    assert set(registry.names()) == set(BUILTIN_TOOLS)
    assert all(d.first_party for d in registry.descriptors())


@pytest.mark.rule("R-134")
def test_every_builtin_declares_a_fixed_kind():
    registry = ToolRegistry.from_plugins(load_entrypoints=False)
    assert all(d.capability in {Capability.READ, Capability.WRITE, Capability.SENSITIVE}
               for d in registry.descriptors())


def _fake_family(monkeypatch: pytest.MonkeyPatch, module_name: str, *tools: object) -> None:
    module = types.ModuleType(module_name)

    @hookimpl
    def kaizen_register_tools(register):  # type: ignore[no-untyped-def]
        for item in tools:
            register(item)

    module.kaizen_register_tools = kaizen_register_tools  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module_name, module)


@tool(name="rogue_builtin", capability=Capability.READ)
async def _rogue(ctx: object) -> dict[str, str]:
    """Not in the manifest."""
    return {}


@pytest.mark.rule("R-133", "R-183")
def test_registry_refuses_a_first_party_tool_missing_from_the_manifest(monkeypatch):
    _fake_family(monkeypatch, "kaizen_plugins_fake_family", _rogue)
    with pytest.raises(ToolRegistrationError, match=r"rogue_builtin.*not in BUILTIN_TOOLS"):
        ToolRegistry.from_plugins(
            first_party=(*CORE_PLUGINS, *DEFAULT_PLUGINS, "kaizen_plugins_fake_family"),
            load_entrypoints=False,
        )


@tool(name="show_chat_canvas", capability=Capability.READ)
async def _impostor(ctx: object) -> dict[str, str]:
    """A built-in name from the wrong module."""
    return {}


@pytest.mark.rule("R-133")
def test_registry_refuses_a_builtin_registered_from_another_first_party_module(monkeypatch):
    _fake_family(monkeypatch, "kaizen_plugins_other", _impostor)
    with pytest.raises(ToolRegistrationError, match=r"names 'kaizen_plugins\.canvas'"):
        ToolRegistry.from_plugins(first_party=("kaizen_plugins_other",), load_entrypoints=False)


@tool(name="visualize_read_me")
async def _undeclared(ctx: object) -> dict[str, str]:
    """A built-in without a declared kind."""
    return {}


@pytest.mark.rule("R-134")
def test_registry_refuses_a_builtin_without_a_declared_kind(monkeypatch):
    _fake_family(monkeypatch, "kaizen_plugins.readme_variant", _undeclared)
    manifest = {"visualize_read_me": "kaizen_plugins.readme_variant"}
    with pytest.raises(ToolRegistrationError, match="must declare its capability"):
        ToolRegistry.from_plugins(
            first_party=("kaizen_plugins.readme_variant",), load_entrypoints=False,
            manifest=manifest,
        )
