"""Kaizen's first-party tool families. Each module is a pluggy plugin registering through the
same ``kaizen_register_tools`` hook a third-party package uses; every tool here must also be
named in ``kaizen_server_extension.tools.manifest.BUILTIN_TOOLS``."""

DEFAULT_PLUGINS: tuple[str, ...] = (
    "kaizen_plugins.roster",
    "kaizen_plugins.canvas",
    "kaizen_plugins.readme",
    "kaizen_plugins.code",
    "kaizen_plugins.artifacts",
    "kaizen_plugins.library",
    "kaizen_plugins.workspace",
    "kaizen_plugins.agents",
)
