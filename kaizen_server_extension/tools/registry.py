"""The tool registry: every tool the server can run, gathered once at start-up through pluggy.

First-party families (``DEFAULT_PLUGINS`` and the tool layer's own ``CORE_PLUGINS``) register
through the same ``kaizen_register_tools`` hook as third-party packages loaded from the
``kaizen`` entry-point group. The registry records who registered what, so it can hold the
closed built-in set (spec: The closed built-in registry): a first-party tool must be named in
``BUILTIN_TOOLS`` under the module that implements it, and no third party may take a built-in
name or the name of a shared runtime capability (``SHARED_CAPABILITY_TOOLS``, R-058). Any name
collision is refused with an error naming both sides.

A surface a deployment does not expose (its feature flag is off) is *withheld*: its tools are
checked like any other, so a broken plugin stops start-up either way, and then left out. Every
view of the tools is built from this registry (the frozen catalogs, tool discovery, the call
pipeline, ``GET tools``, the admin tool policies), so a withheld tool is indistinguishable from
one that was never installed (R-140).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any

import pluggy

from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.tools import hookspecs
from kaizen_server_extension.tools.manifest import (
    BUILTIN_TOOLS,
    CORE_PLUGINS,
    DEFAULT_PLUGINS,
    SHARED_CAPABILITY_TOOLS,
)
from kaizen_server_extension.tools.types import RegisteredTool, ToolDescriptor

ENTRY_POINT_GROUP = hookspecs.PROJECT


class ToolRegistrationError(Exception):
    """A registration the registry refuses; raised at start-up, naming the plugin."""


def default_plugin_modules() -> tuple[str, ...]:
    """The first-party plugin modules: the tool layer's own, then ``kaizen_plugins``'."""
    return (*CORE_PLUGINS, *DEFAULT_PLUGINS)


def build_plugin_manager(
    first_party: Iterable[str] | None = None,
    *,
    load_entrypoints: bool = True,
    extra_plugins: Iterable[tuple[str, object]] = (),
) -> tuple[pluggy.PluginManager, frozenset[str]]:
    """A plugin manager with the hookspecs, the first-party modules and (optionally) the
    ``kaizen`` entry points. Returns it with the names of the first-party plugins.

    ``extra_plugins`` are (name, plugin) pairs registered as third-party, for tests and embedding.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    names = tuple(default_plugin_modules() if first_party is None else first_party)
    for module_name in names:
        pm.register(importlib.import_module(module_name), name=module_name)
    for name, plugin in extra_plugins:
        pm.register(plugin, name=name)
    if load_entrypoints:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    return pm, frozenset(names)


class ToolRegistry:
    """Name → :class:`RegisteredTool`, filled once; read-only afterwards by convention."""

    def __init__(self, manifest: Mapping[str, str] = BUILTIN_TOOLS, *,
                 withheld_surfaces: Iterable[str] = ()) -> None:
        self._manifest = manifest
        self._withheld_surfaces = frozenset(withheld_surfaces)
        self._tools: dict[str, RegisteredTool] = {}
        self._owner: dict[str, str] = {}
        # Withheld tools' owners, kept only so a name collision is refused whatever the flags.
        self._withheld_owner: dict[str, str] = {}

    @classmethod
    def from_plugin_manager(
        cls,
        pm: pluggy.PluginManager,
        first_party: frozenset[str],
        *,
        manifest: Mapping[str, str] = BUILTIN_TOOLS,
        withheld_surfaces: Iterable[str] = (),
    ) -> ToolRegistry:
        """Call every ``kaizen_register_tools`` implementation with a registrar bound to its
        plugin, first-party plugins first so a built-in name is claimed by its owner; tools
        of a ``withheld_surfaces`` surface are validated and left out."""
        registry = cls(manifest, withheld_surfaces=withheld_surfaces)
        impls = pm.hook.kaizen_register_tools.get_hookimpls()
        impls.sort(key=lambda impl: impl.plugin_name not in first_party)  # stable sort
        for impl in impls:
            owner = impl.plugin_name
            is_first = owner in first_party
            family = _module_name(impl.plugin) if is_first else None

            def register(item: RegisteredTool, /, *, _o: str = owner, _f: bool = is_first,
                         _fam: str | None = family) -> None:
                registry.register(item, owner=_o, first_party=_f, family=_fam)

            impl.function(**{arg: register for arg in impl.argnames})
        return registry

    @classmethod
    def from_plugins(
        cls,
        *,
        first_party: Iterable[str] | None = None,
        load_entrypoints: bool = True,
        extra_plugins: Iterable[tuple[str, object]] = (),
        manifest: Mapping[str, str] = BUILTIN_TOOLS,
        withheld_surfaces: Iterable[str] = (),
    ) -> ToolRegistry:
        pm, names = build_plugin_manager(
            first_party, load_entrypoints=load_entrypoints, extra_plugins=extra_plugins
        )
        return cls.from_plugin_manager(pm, names, manifest=manifest,
                                       withheld_surfaces=withheld_surfaces)

    def register(
        self,
        item: RegisteredTool,
        *,
        owner: str,
        first_party: bool = False,
        family: str | None = None,
    ) -> None:
        """Add one tool, or raise :class:`ToolRegistrationError` saying why not."""
        if not isinstance(item, RegisteredTool):
            raise ToolRegistrationError(
                f"plugin {owner!r} registered {item!r}; expected a @tool-decorated function"
            )
        name = item.descriptor.name
        earlier = self._owner.get(name) or self._withheld_owner.get(name)
        if earlier is not None:
            raise ToolRegistrationError(
                f"tool name collision: {name!r} from plugin {owner!r} is already registered "
                f"by plugin {earlier!r}"
            )
        if first_party:
            expected = self._manifest.get(name)
            if expected is None:
                raise ToolRegistrationError(
                    f"first-party tool {name!r} (plugin {owner!r}) is not in BUILTIN_TOOLS; "
                    "the built-in set is closed: add it to tools/manifest.py deliberately"
                )
            if expected != family:
                raise ToolRegistrationError(
                    f"first-party tool {name!r} is registered from {family!r} but BUILTIN_TOOLS "
                    f"names {expected!r}"
                )
            if item.descriptor.capability is Capability.UNDECLARED:
                raise ToolRegistrationError(
                    f"built-in tool {name!r} must declare its capability (read/write/sensitive)"
                )
        elif name in self._manifest:
            raise ToolRegistrationError(
                f"plugin {owner!r} may not register {name!r}: it is a reserved built-in name"
            )
        elif name in SHARED_CAPABILITY_TOOLS:
            raise ToolRegistrationError(
                f"plugin {owner!r} may not register {name!r}: it is a shared runtime "
                "capability, which no agent package may define its own version of"
            )
        if item.descriptor.surface in self._withheld_surfaces:
            # Not exposed by this deployment: valid, and absent from every view.
            self._withheld_owner[name] = owner
            return
        # Provenance is the registry's fact, not the plugin's claim.
        if item.descriptor.first_party != first_party:
            item = dataclasses.replace(
                item, descriptor=dataclasses.replace(item.descriptor, first_party=first_party))
        self._tools[name] = item
        self._owner[name] = owner

    def get(self, name: str) -> RegisteredTool | None:
        return self._tools.get(name)

    def owner(self, name: str) -> str | None:
        return self._owner.get(name)

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._tools))

    def descriptors(self) -> tuple[ToolDescriptor, ...]:
        return tuple(self._tools[name].descriptor for name in self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[RegisteredTool]:
        return iter(self._tools[name] for name in self.names())

    def __len__(self) -> int:
        return len(self._tools)


def collect_registrations(pm: pluggy.PluginManager, hook_name: str) -> list[tuple[str, Any]]:
    """(plugin name, item) for every item registered through one of the non-tool hooks
    (``kaizen_register_guardrails``, ``…_model_providers``, ``…_agents``), in plugin order."""
    collected: list[tuple[str, Any]] = []
    for impl in getattr(pm.hook, hook_name).get_hookimpls():

        def register(item: Any, /, *, _owner: str = impl.plugin_name) -> None:
            collected.append((_owner, item))

        impl.function(**{arg: register for arg in impl.argnames})
    return collected


def _module_name(plugin: object) -> str | None:
    return plugin.__name__ if isinstance(plugin, ModuleType) else None
