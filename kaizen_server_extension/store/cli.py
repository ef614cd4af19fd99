"""``kaizen-db``: run the store's migrations outside the server (they also run at start-up)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir

from kaizen_server_extension.settings import KaizenSettings
from kaizen_server_extension.store.engine import create_engine, upgrade


def default_database_url() -> str:
    """The server's own: ``KAIZEN_DATABASE_URL``, else SQLite in the Jupyter data dir."""
    return KaizenSettings.from_environ(os.environ).database_url(Path(jupyter_data_dir()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kaizen-db", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("upgrade", help="migrate the database to the newest schema")
    up.add_argument("--url", default=None, help="database URL (default: KAIZEN_DATABASE_URL "
                    "or SQLite in the Jupyter data dir)")
    up.add_argument("--schema", default=os.environ.get("KAIZEN_DATABASE_SCHEMA"),
                    help="PostgreSQL schema (search_path)")
    up.add_argument("--revision", default="head")
    args = parser.parse_args(argv)

    url = args.url or default_database_url()

    async def _run() -> None:
        engine = create_engine(url, schema=args.schema)
        try:
            await upgrade(engine, args.schema, args.revision)
        finally:
            await engine.dispose()

    asyncio.run(_run())
    print(f"kaizen-db: {url.split('@')[-1]} is at {args.revision}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
