"""``KaizenApp``: the Jupyter server extension that wires store, lanes, runtime and API."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from jupyter_server.extension.application import ExtensionApp
from traitlets import Int, Set, Unicode, default

from kaizen_server_extension.settings import RuntimeSettings, SettingsError
from kaizen_server_extension.store import Store, create_engine, run_blocking, upgrade
from kaizen_server_extension.store.engine import sqlite_url_for

DEFAULT_AGENTS: tuple[dict[str, Any], ...] = (
    {
        "agent_id": "general",
        "name": "General",
        "mode": "chat",
        "persona": "You are Kaizen, a careful assistant working beside the member's Jupyter "
        "kernels. Answer plainly, use tools when they help, and say what you could not do.",
        "tool_ceiling": ("list_available_agents", "show_chat_canvas", "visualize_read_me"),
    },
    {
        "agent_id": "search",
        "name": "Search",
        "mode": "search",
        "persona": "You find and cite what the member asks about. Prefer evidence from tools "
        "over recollection, and name your sources.",
        "tool_ceiling": ("list_available_agents",),
    },
)


def default_database_url() -> str:
    return sqlite_url_for(Path(jupyter_data_dir()) / "kaizen" / "kaizen.db")


@dataclass
class KaizenContext:
    """Everything handlers need, placed in the tornado settings under ``"kaizen"``."""

    store: Store
    runtime: RuntimeSettings
    admin_members: frozenset[str]
    max_message_bytes: int
    model_base_url: str
    model: str
    model_api_key: str | None = field(repr=False, default=None)
    known_members: set[str] = field(default_factory=set)

    def is_admin(self, member: str) -> bool:
        return member in self.admin_members


class KaizenApp(ExtensionApp):  # type: ignore[misc]
    name = "kaizen_server_extension"
    description = "Kaizen: a guarded agent turn loop beside your Jupyter kernels."
    load_other_extensions = True

    database_url = Unicode(
        help="SQLAlchemy async URL of the store (default: KAIZEN_DATABASE_URL, else SQLite "
        "in the Jupyter data dir).",
    ).tag(config=True)

    database_schema = Unicode(
        "", help="PostgreSQL schema to use (search_path); empty for the default."
    ).tag(config=True)

    admin_members = Set(
        help="Members with the admin role (default: KAIZEN_ADMIN_MEMBERS, comma-separated)."
    ).tag(config=True)

    max_message_bytes = Int(
        help="Largest message text accepted, in UTF-8 bytes (default 256 KiB)."
    ).tag(config=True)

    model_base_url = Unicode(
        help="OpenAI-compatible endpoint (default: KAIZEN_MODEL_BASE_URL)."
    ).tag(config=True)

    model = Unicode(help="Model id sent to the endpoint (default: KAIZEN_MODEL).").tag(
        config=True
    )

    model_api_key_env = Unicode(
        "KAIZEN_MODEL_API_KEY",
        help="Name of the environment variable holding the model API key.",
    ).tag(config=True)

    @default("database_url")
    def _default_database_url(self) -> str:
        return os.environ.get("KAIZEN_DATABASE_URL") or default_database_url()

    @default("database_schema")
    def _default_database_schema(self) -> str:
        return os.environ.get("KAIZEN_DATABASE_SCHEMA", "")

    @default("admin_members")
    def _default_admin_members(self) -> set[str]:
        raw = os.environ.get("KAIZEN_ADMIN_MEMBERS", "")
        return {m.strip() for m in raw.split(",") if m.strip()}

    @default("max_message_bytes")
    def _default_max_message_bytes(self) -> int:
        return int(os.environ.get("KAIZEN_MAX_MESSAGE_BYTES", str(256 * 1024)))

    @default("model_base_url")
    def _default_model_base_url(self) -> str:
        return os.environ.get("KAIZEN_MODEL_BASE_URL", "")

    @default("model")
    def _default_model(self) -> str:
        return os.environ.get("KAIZEN_MODEL", "")

    def initialize_settings(self) -> None:
        try:
            runtime = RuntimeSettings.from_environ(os.environ)
        except SettingsError as exc:
            self._refuse_to_start(str(exc))
        if self.max_message_bytes < 1 or self.max_message_bytes > 64 * 1024 * 1024:
            self._refuse_to_start(
                "Invalid setting KAIZEN_MAX_MESSAGE_BYTES: must be between 1 and 67108864"
            )
        schema = self.database_schema or None
        try:
            run_blocking(lambda: bootstrap(self.database_url, schema))
        except Exception as exc:
            self.log.critical("Kaizen could not migrate its database: %s",
                              type(exc).__name__, exc_info=True)
            self._refuse_to_start("Kaizen could not open or migrate its database; see the "
                                  "log above.")
        store = Store(create_engine(self.database_url, schema=schema))
        ctx = KaizenContext(
            store=store,
            runtime=runtime,
            admin_members=frozenset(self.admin_members),
            max_message_bytes=self.max_message_bytes,
            model_base_url=self.model_base_url,
            model=self.model,
            model_api_key=os.environ.get(self.model_api_key_env) or None,
        )
        self.kaizen = ctx
        self.settings.update({"kaizen": ctx})
        self.log.info("Kaizen store: %s", _redact_url(self.database_url))

    def initialize_handlers(self) -> None:
        from kaizen_server_extension.api import handlers

        self.handlers.extend(handlers.routes())

    async def stop_extension(self) -> None:
        await self.kaizen.store.dispose()

    def _refuse_to_start(self, message: str) -> Any:
        # SystemExit, not an exception: jupyter_server logs and ignores extension
        # exceptions, and a misconfigured guard must stop the server instead.
        self.log.critical(message)
        print(f"kaizen: {message}", file=sys.stderr)
        raise SystemExit(2)


async def bootstrap(url: str, schema: str | None) -> None:
    """Migrate the schema and seed the default agents before the server takes requests."""
    engine = create_engine(url, schema=schema)
    try:
        await upgrade(engine, schema)
        store = Store(engine)
        for agent in DEFAULT_AGENTS:
            await store.agents.ensure_system_agent(**agent)
    finally:
        await engine.dispose()


def _redact_url(url: str) -> str:
    if "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://***@{rest.split('@', 1)[1]}"
