"""Kaizen's first-party plugins: tool families and the built-in model providers. Each module is
a pluggy plugin registering through the same hooks a third-party package uses; every tool here
must also be named in ``kaizen_server_extension.tools.manifest.BUILTIN_TOOLS``."""

DEFAULT_PLUGINS: tuple[str, ...] = (
    "kaizen_plugins.roster",
    "kaizen_plugins.canvas",
    "kaizen_plugins.readme",
    "kaizen_plugins.code",
    "kaizen_plugins.artifacts",
    "kaizen_plugins.library",
    "kaizen_plugins.workspace",
    "kaizen_plugins.agents",
    # The built-in model providers (openai-compatible, local), through the provider hook.
    "kaizen_plugins.providers",
)
