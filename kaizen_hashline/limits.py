"""The grammar's size limits, in a module of their own: a tool can describe them (schemas,
descriptions) at registration without loading the engine."""

from __future__ import annotations

#: Longest workspace path accepted (fs.py).
MAX_PATH_CHARS = 1024
#: Most lines one read shows (render.py).
MAX_READ_LINES = 400
#: Longest edit program accepted (syntax.py).
MAX_PROGRAM_CHARS = 4 * 1024 * 1024
