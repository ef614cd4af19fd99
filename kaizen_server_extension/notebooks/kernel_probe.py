"""The kernel side of ``inspect_notebook_kernel``: this file's *source* is what runs.

It is sent verbatim, never composed from model text, and executed in a fresh dictionary (not
the user's namespace) by one user expression, so it defines no global there and leaves no
history (``probe.py``). It reads the namespace it is given and returns one JSON string.

It never calls a user object's ``__repr__``/``__str__``: values are described by type, and
only exact built-in scalars, strings (cut), and the cells of a DataFrame's first rows (only
when they are built-in or NumPy scalars) are shown. It stops at ``seconds`` and bounds every
list. Self-contained on purpose: the kernel may be any Python environment, without Kaizen.
"""

from __future__ import annotations

import json
import sys
import time
import types
from typing import Any

_SKIP = frozenset({"In", "Out", "exit", "quit", "get_ipython", "open"})


def probe(namespace: dict[str, Any], limits_json: str) -> str:
    limits = json.loads(limits_json)
    deadline = time.monotonic() + float(limits["seconds"])
    wanted = set(limits.get("names") or ())
    max_variables = int(limits["max_variables"])
    pd = sys.modules.get("pandas")
    np = sys.modules.get("numpy")
    variables: list[dict[str, Any]] = []
    modules: list[str] = []
    callables: list[str] = []
    truncated = False
    for name in list(namespace):
        if not isinstance(name, str) or name.startswith("_") or name in _SKIP:
            continue
        if wanted and name not in wanted:
            continue
        if time.monotonic() > deadline or len(variables) >= max_variables:
            truncated = True
            break
        value = namespace[name]
        if isinstance(value, types.ModuleType):
            if len(modules) < max_variables:
                modules.append(name)
            continue
        if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
            if len(callables) < max_variables:
                callables.append(name)
            continue
        entry: dict[str, Any] = {"name": name, "type": _type_name(value)}
        try:
            _describe(value, entry, limits, pd, np)
        except Exception as exc:  # a broken __len__ or shape: say so, go on
            entry["error"] = type(exc).__name__
        variables.append(entry)
    return json.dumps({"variables": variables, "modules": modules, "callables": callables,
                       "truncated": truncated}, default=_type_name)


def _type_name(value: Any) -> str:
    kind = type(value)
    module = getattr(kind, "__module__", "")
    name = getattr(kind, "__qualname__", kind.__name__)
    return name if module in ("builtins", "") else f"{module}.{name}"


def _scalar(value: Any, limits: dict[str, Any], np: Any) -> Any:
    """A value shown as itself only when it is a built-in (or NumPy) scalar."""
    kind = type(value)
    if value is None or kind in (bool, int, float):
        if kind is float and value != value:  # NaN is not JSON
            return None
        return value
    if kind is str:
        cap = int(limits["max_string"])
        return value if len(value) <= cap else value[:cap] + "…"
    if np is not None and isinstance(value, np.generic):
        item = value.item()
        return _scalar(item, limits, None) if type(item) in (bool, int, float, str) \
            else f"<{_type_name(value)}>"
    return f"<{_type_name(value)}>"


def _describe(value: Any, entry: dict[str, Any], limits: dict[str, Any], pd: Any,
              np: Any) -> None:
    kind = type(value)
    if value is None or kind in (bool, int, float, complex):
        entry["value"] = _scalar(value, limits, np) if kind is not complex else str(value)
        return
    if kind is str:
        entry["length"] = len(value)
        entry["value"] = _scalar(value, limits, np)
        return
    if kind in (bytes, bytearray):
        entry["length"] = len(value)
        return
    if kind in (list, tuple, set, frozenset):
        entry["length"] = len(value)
        return
    if kind is dict:
        entry["length"] = len(value)
        keys = [k for k in list(value)[: int(limits["max_columns"])] if type(k) is str]
        entry["keys"] = [_scalar(k, limits, np) for k in keys]
        return
    if pd is not None and isinstance(value, pd.DataFrame):
        _frame(value, entry, limits, np)
        return
    if pd is not None and isinstance(value, pd.Series):
        entry["shape"] = list(value.shape)
        entry["dtype"] = str(value.dtype)
        entry["head"] = [_scalar(v, limits, np)
                         for v in value.head(int(limits["head_rows"])).tolist()]
        return
    if np is not None and isinstance(value, np.ndarray):
        entry["shape"] = list(value.shape)
        entry["dtype"] = str(value.dtype)
        return
    # Anything else is described by its type only: reading its attributes could run its code.


def _frame(frame: Any, entry: dict[str, Any], limits: dict[str, Any], np: Any) -> None:
    max_columns, rows = int(limits["max_columns"]), int(limits["head_rows"])
    entry["shape"] = list(frame.shape)
    columns = list(frame.columns[:max_columns])
    names = [c if type(c) is str else _scalar(c, limits, np) if type(c) in (int, float, bool)
             else f"<{_type_name(c)}>" for c in columns]
    labels = [str(n) for n in names]
    entry["columns"] = [{"name": label, "dtype": str(frame.dtypes.iloc[i])}
                        for i, label in enumerate(labels)]
    if frame.shape[1] > max_columns:
        entry["more_columns"] = int(frame.shape[1] - max_columns)
    head = frame.iloc[:rows, :max_columns]
    entry["head"] = [dict(zip(labels, (_scalar(v, limits, np) for v in row)))  # noqa: B905
                     for row in head.itertuples(index=False, name=None)]
    entry["memory_bytes"] = int(frame.memory_usage(index=True, deep=False).sum())
