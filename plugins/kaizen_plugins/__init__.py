"""Kaizen's first-party plugins: tool families and the built-in model providers. Each module is
a pluggy plugin registering through the same hooks a third-party package uses. The modules are
listed in ``kaizen_server_extension.tools.manifest.DEFAULT_PLUGINS`` and every tool here is named
in its ``BUILTIN_TOOLS``: the closed built-in set is written down in one place."""
