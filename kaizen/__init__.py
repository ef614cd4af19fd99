"""Kaizen from Python: ``kaizen.client`` (a typed REST and events client) and the IPython
magics (``%load_ext kaizen``; ``kaizen.magics``)."""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext kaizen``: register ``%%kaizen``, ``%kaizen_attach`` and ``%kaizen``."""
    from kaizen.magics import KaizenMagics

    ipython.register_magics(KaizenMagics(ipython))
